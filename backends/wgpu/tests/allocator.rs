//! The caching allocator on a wgpu device: reuse, the queue-completion rule for freed blocks,
//! out-of-memory through the configured capacity and through `max_buffer_size`, the retry
//! chain, handle checks and readbacks. Skips without an adapter unless
//! `CACHALOT_REQUIRE_GPU` is set.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cachalot_core::{AllocatorError, HandleError, Segments, StreamEvents, StreamId};
use cachalot_shaders::MatmulShape;
use cachalot_shaders::ops::{Activation, ActivationForward, Matmul};
use cachalot_wgpu::{KernelError, Kernels, QUEUE_STREAM, WgpuConfig, WgpuContext};
use common::{read, upload};

const MIB: u64 = 1 << 20;

#[test]
fn malloc_free_reuse_and_empty_cache_on_buffers() {
    let Some(context) = common::context() else { return };
    let kernels = Kernels::new(context.clone());
    let mut allocator = common::allocator(&context);
    let facts = allocator.device().clone();
    assert_eq!(facts.backend, "wgpu");
    assert!(!facts.supports_expandable_segments);
    assert_eq!(facts.max_binding_size, Some(context.limits().max_storage_buffer_binding_size));

    // PyTorch's rounding and pools: 4 B -> a 512 B block in a 2 MiB segment; 5 MiB -> 20 MiB.
    let small = allocator.malloc(4, StreamId::DEFAULT).unwrap();
    assert_eq!(small.size(), 512);
    let large = allocator.malloc(5 * MIB, StreamId::DEFAULT).unwrap();
    assert_eq!(allocator.memory_reserved(), 22 * MIB);
    assert_eq!(allocator.backend().segment_count(), 2);
    assert_eq!(allocator.backend().used(), 22 * MIB);
    assert_eq!(small.address() % 512, 0);
    let range = allocator.backend().resolve(large.address(), large.size()).unwrap();
    assert_eq!(range.offset, 0);
    assert_eq!(range.buffer.size(), 20 * MIB);

    // Data survives a round trip through a block in the middle of a segment.
    let data: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
    let neighbour = allocator.malloc(4000, StreamId::DEFAULT).unwrap();
    kernels.upload_f32(&mut allocator, &neighbour, &data).unwrap();
    assert_eq!(read(&kernels, &mut allocator, &neighbour, 1000), data);

    // Freed without kernel use: the block is cached and handed out again at once.
    let address = large.address();
    allocator.free(large).unwrap();
    let again = allocator.malloc(5 * MIB, StreamId::DEFAULT).unwrap();
    assert_eq!(again.address(), address);
    for a in [small, again, neighbour] {
        allocator.free(a).unwrap();
    }
    context.wait_idle().unwrap();
    allocator.empty_cache().unwrap();
    assert_eq!(allocator.memory_reserved(), 0);
    assert_eq!(allocator.backend().segment_count(), 0);
    assert_eq!(allocator.backend().used(), 0);
    allocator.check_consistency().unwrap();
}

/// The wgpu form of `record_stream`: a block freed while a submitted kernel may still use it
/// is not handed out before that submission completes, and is once it has. Without the
/// runner recording kernel use on `QUEUE_STREAM`, the second `malloc` would get the freed
/// block back at once and this test would fail.
#[test]
fn freed_block_is_not_reused_before_its_submission_completes() {
    let Some(context) = common::context() else { return };
    let kernels = Kernels::new(context.clone());
    let mut allocator = common::allocator(&context);
    let mut rng = common::rng();
    let mut conclusive = 0;
    // A product slow enough to be in flight while the host frees and allocates; a few tries
    // in case a fast device finishes first (then the try proves nothing and is not counted).
    for size in [256u32, 512, 768, 1024] {
        let n = (size * size) as usize;
        let bytes = n as u64 * 4;
        let a = upload(&kernels, &mut allocator, &rng.vec(n, -1.0, 1.0));
        let c = allocator.malloc(bytes, StreamId::DEFAULT).unwrap();
        let mut batch = kernels.batch(&mut allocator);
        for _ in 0..4 {
            batch.matmul(Matmul::new(&a, &a, &c, MatmulShape::nn(size, size, size))).unwrap();
        }
        let submission = batch.submit().unwrap();

        let freed = c.address();
        allocator.free(c).unwrap();
        let next = allocator.malloc(bytes, StreamId::DEFAULT).unwrap();
        // Completion only moves forward: still pending now means pending during the malloc.
        let pending = !context.is_complete(submission);
        if pending {
            assert_ne!(next.address(), freed, "a block in use by a pending submission was handed out");
            conclusive += 1;
        }
        assert!(allocator.stats().allocated_bytes.all().current as u64 >= 2 * bytes);

        // Once the submission is done, the next malloc completes the free and reuses the block
        // (unless the submission was done before `next`, which then got the block back).
        context.wait_for(submission).unwrap();
        let reused = allocator.malloc(bytes, StreamId::DEFAULT).unwrap();
        if next.address() != freed {
            assert_eq!(reused.address(), freed, "the block returns to the cache after its submission");
        }
        for x in [a, next, reused] {
            allocator.free(x).unwrap();
        }
        allocator.check_consistency().unwrap();
        if conclusive >= 2 {
            break;
        }
    }
    assert!(conclusive > 0, "every submission finished before the host could allocate: nothing was shown");
}

/// wgpu cannot tell free memory: the configured capacity bounds the segments, the error
/// goes through PyTorch's message and names the limit, and the retry chain (release cached
/// segments, try again) runs first.
#[test]
fn out_of_memory_names_the_configured_capacity_after_the_retry_chain() {
    let Some(context) = common::context_with(WgpuConfig::with_capacity(30 * MIB)) else { return };
    let mut allocator = common::allocator(&context);
    assert_eq!(allocator.device().total_memory, 30 * MIB);

    // 5 MiB takes a 20 MiB segment; cached after the free.
    let a = allocator.malloc(5 * MIB, StreamId::DEFAULT).unwrap();
    allocator.free(a).unwrap();
    assert_eq!(allocator.memory_reserved(), 20 * MIB);
    // 22 MiB does not fit the cached block and needs its own segment: 42 MiB > 30 MiB, so the
    // cached segment is released and the request retried.
    let b = allocator.malloc(22 * MIB, StreamId::DEFAULT).unwrap();
    assert_eq!(allocator.memory_reserved(), 22 * MIB);
    assert_eq!(allocator.stats().num_alloc_retries, 1);
    assert_eq!(allocator.backend().segment_count(), 1);

    let error = allocator.malloc(20 * MIB, StreamId::DEFAULT).unwrap_err();
    let AllocatorError::OutOfMemory(oom) = &error else { panic!("{error:?}") };
    assert!(oom.message.starts_with("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 30.00 MiB of which 8.00 MiB is free."), "{}", oom.message);
    let limit = oom.limit.as_deref().unwrap_or_default();
    assert!(limit.contains("configured capacity of 30.00 MiB"), "{limit}");
    assert!(oom.message.contains("Device limit: configured capacity"), "{}", oom.message);
    assert_eq!(allocator.stats().num_ooms, 1);
    allocator.free(b).unwrap();
    allocator.check_consistency().unwrap();
}

/// A segment larger than the device's `max_buffer_size` is refused with an error that names
/// that limit (here a device asked for 64 MiB buffers), before any buffer is created.
#[test]
fn segment_over_max_buffer_size_names_the_limit() {
    let Some(probe) = common::context() else { return };
    let mut limits = probe.limits().clone();
    limits.max_buffer_size = 64 * MIB;
    limits.max_storage_buffer_binding_size = limits.max_storage_buffer_binding_size.min(64 * MIB);
    let Some(context) = common::context_with(WgpuConfig { limits: Some(limits), ..WgpuConfig::default() }) else {
        return;
    };
    let mut allocator = common::allocator(&context);
    assert_eq!(allocator.device().max_segment_size, Some(64 * MIB));
    let fits = allocator.malloc(64 * MIB, StreamId::DEFAULT).unwrap();
    let error = allocator.malloc(100 * MIB, StreamId::DEFAULT).unwrap_err();
    let AllocatorError::OutOfMemory(oom) = &error else { panic!("{error:?}") };
    let limit = oom.limit.as_deref().unwrap_or_default();
    assert!(limit.starts_with("max_buffer_size"), "{limit}");
    assert!(limit.contains("64.00 MiB (67108864 bytes)"), "{limit}");
    assert!(oom.message.contains("Device limit: max_buffer_size"), "{}", oom.message);
    assert_eq!(allocator.backend().segment_count(), 1);
    allocator.free(fits).unwrap();
}

/// One operand larger than `max_storage_buffer_binding_size` (here the adapter's own limit,
/// 128 MiB on lavapipe): the product cannot be chunked and says which limit it hit.
#[test]
fn operand_over_the_binding_limit_is_an_error_naming_the_limit() {
    let Some(context) = common::context() else { return };
    let kernels = Kernels::new(context.clone());
    let mut allocator = common::allocator(&context);
    let limit = context.limits().max_storage_buffer_binding_size;
    // A [m, 1024] operand just over the limit (the buffer itself is never touched).
    let k = 1024u64;
    let m = (limit / (4 * k) + 1) as u32;
    let bytes = m as u64 * k * 4;
    if bytes > context.limits().max_buffer_size || bytes > context.config().capacity {
        println!("skipped: the binding limit ({limit} bytes) is not below max_buffer_size and the capacity");
        return;
    }
    let big = allocator.malloc(bytes, StreamId::DEFAULT).unwrap();
    let small = allocator.malloc(k * 4 * 4, StreamId::DEFAULT).unwrap();
    let out = allocator.malloc(m as u64 * 4 * 4, StreamId::DEFAULT).unwrap();
    let mut batch = kernels.batch(&mut allocator);
    let error = batch.matmul(Matmul::new(&big, &small, &out, MatmulShape::nn(m, 4, k as u32))).unwrap_err();
    assert!(matches!(error, KernelError::BindingTooLarge { operand: "a", .. }), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("max_storage_buffer_binding_size") && text.contains(&limit.to_string()), "{text}");
    drop(batch);
    for a in [big, small, out] {
        allocator.free(a).unwrap();
    }
}

/// Handles are checked before any work is recorded: freed, too small, or made on the queue's
/// own stream.
#[test]
fn kernels_refuse_stale_small_and_queue_stream_handles() {
    let Some(context) = common::context() else { return };
    let kernels = Kernels::new(context.clone());
    let mut allocator = common::allocator(&context);
    let x = allocator.malloc(4096, StreamId::DEFAULT).unwrap();
    let y = allocator.malloc(4096, StreamId::DEFAULT).unwrap();
    let freed = allocator.malloc(4096, StreamId::DEFAULT).unwrap();
    allocator.free(freed).unwrap();
    let on_queue = allocator.malloc(4096, QUEUE_STREAM).unwrap();

    let mut batch = kernels.batch(&mut allocator);
    let error = batch.activation(ActivationForward { act: Activation::Relu, x: &freed, y: &y, n: 1024 }).unwrap_err();
    assert!(
        matches!(
            error,
            KernelError::Allocator(AllocatorError::InvalidHandle(
                HandleError::DoubleFree { .. } | HandleError::Stale { .. }
            ))
        ),
        "{error:?}"
    );
    let error = batch.activation(ActivationForward { act: Activation::Relu, x: &x, y: &y, n: 2048 }).unwrap_err();
    assert!(matches!(error, KernelError::TooSmall { operand: "x", needed: 8192, size: 4096 }), "{error:?}");
    let error = batch.fill(&on_queue, 16, 1.0).unwrap_err();
    assert!(matches!(error, KernelError::QueueStream(_)), "{error:?}");
    assert!(batch.is_empty());
    batch.submit().unwrap();
    for a in [x, y, on_queue] {
        allocator.free(a).unwrap();
    }
}

/// Readbacks are futures (the only form on the web); natively they can also block.
#[test]
fn readback_is_async_and_keeps_batch_order() {
    let Some(context) = common::context() else { return };
    let kernels = Kernels::new(context.clone());
    let mut allocator = common::allocator(&context);
    let x = allocator.malloc(64 * 4, StreamId::DEFAULT).unwrap();
    let mut batch = kernels.batch(&mut allocator);
    batch.fill(&x, 64, 1.0).unwrap();
    let first = batch.read_f32(&x, 64).unwrap();
    batch.upload_f32(&x, &[2.0; 64]).unwrap();
    let second = batch.read_f32(&x, 64).unwrap();
    assert!(!first.is_ready());
    let submission = batch.submit().unwrap();
    assert_eq!(first.submission(), 0, "a readback learns nothing of the number; its batch returns it");
    assert!(submission >= 1);
    assert_eq!(pollster::block_on(first.f32()).unwrap(), vec![1.0; 64]);
    assert_eq!(second.wait_f32().unwrap(), vec![2.0; 64]);

    // A batch dropped unsubmitted fails its readbacks instead of leaving them hanging.
    let mut batch = kernels.batch(&mut allocator);
    let orphan = batch.read_f32(&x, 4).unwrap();
    drop(batch);
    assert!(matches!(pollster::block_on(orphan.bytes()), Err(KernelError::Readback(_))));
    allocator.free(x).unwrap();
}

/// A blocking readback completes while another thread polls the same device: wgpu runs a
/// mapping's callback on whichever thread's poll finds it ready, so the wait may return
/// before the other thread has run it (a CI failure: "the mapping did not complete").
#[test]
fn blocking_readbacks_complete_while_another_thread_polls() {
    // A device of its own: the poller would otherwise speed up the other tests' submissions.
    let Some(context) = common::context_with(WgpuConfig::default()) else { return };
    let kernels = Kernels::new(context.clone());
    let mut allocator = common::allocator(&context);
    let x = allocator.malloc(256 * 4, StreamId::DEFAULT).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (context, stop) = (context.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                context.poll().unwrap();
            }
        })
    };
    for round in 0..3000 {
        let value = round as f32;
        let mut batch = kernels.batch(&mut allocator);
        batch.fill(&x, 256, value).unwrap();
        let readback = batch.read_f32(&x, 256).unwrap();
        batch.submit().unwrap();
        assert_eq!(readback.wait_f32().unwrap(), vec![value; 256], "round {round}");
    }
    stop.store(true, Ordering::Relaxed);
    poller.join().unwrap();
    allocator.free(x).unwrap();
}

/// The backend's events are submission numbers and complete in order.
#[test]
fn events_follow_submissions() {
    let Some(context) = WgpuContext::request_blocking(WgpuConfig::default()).ok().or_else(common::context) else {
        return;
    };
    let mut backend = cachalot_wgpu::WgpuBackend::new(context.clone());
    let before = backend.record_event(StreamId::DEFAULT).unwrap();
    assert!(backend.query_event(&before).unwrap(), "nothing submitted yet: complete");
    let number = context.submit([]);
    let event = backend.record_event(StreamId(7)).unwrap();
    assert_eq!(event.0, number);
    backend.synchronize_event(&event).unwrap();
    assert!(backend.query_event(&event).unwrap());
    assert!(context.completed_submission() >= number);
    let (free, total) = backend.memory_info().unwrap();
    assert_eq!((free, total), (context.config().capacity, context.config().capacity));
}
