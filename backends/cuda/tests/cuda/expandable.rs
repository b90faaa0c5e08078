//! Expandable segments on the driver's VMM API against the simulator's replay of the same ops,
//! and out-of-memory on the device: the retry chain, and the rollback of a partial mapping.

use std::sync::Arc;

use cachalot_core::{
    Allocation, AllocatorConfig, AllocatorError, Backend, CachingAllocator, Segments, SimBackend, StreamEvents,
    StreamId, TraceAction, TraceEntry,
};
use cachalot_cuda::{CudaBackend, CudaKernels, DeviceSpan};
use cachalot_shaders::cpu::Rng;

use crate::common;

#[derive(Clone, Copy, Debug)]
enum Step {
    Alloc { id: usize, size: u64, stream: usize },
    Free { id: usize },
    EmptyCache,
}

/// A deterministic mix of small (to 1 MiB) and large (to 64 MiB) requests on two streams,
/// random frees, and `empty_cache` every 150 steps; the first step allocates a 4-byte counter.
fn steps(count: usize) -> Vec<Step> {
    let mut rng = Rng::new(77);
    let mut out = vec![Step::Alloc { id: 0, size: 4, stream: 0 }];
    let mut live: Vec<usize> = Vec::new();
    let mut next = 1;
    for i in 1..count {
        if i % 150 == 0 {
            out.push(Step::EmptyCache);
        } else if live.len() < 4 || (live.len() < 60 && rng.below(100) < 55) {
            let log_max = if rng.below(2) == 0 { 20.0 } else { 26.0 };
            let size = (2f64.powf(rng.uniform(0.0, log_max) as f64) as u64).max(1);
            out.push(Step::Alloc { id: next, size, stream: rng.below(2) as usize });
            live.push(next);
            next += 1;
        } else {
            let id = live.swap_remove(rng.below(live.len() as u32) as usize);
            out.push(Step::Free { id });
        }
    }
    out.extend(live.into_iter().map(|id| Step::Free { id }));
    out.push(Step::Free { id: 0 });
    out.push(Step::EmptyCache);
    out
}

/// Runs the steps; `on_alloc` / `on_free` let the CUDA run fill and check the blocks.
fn replay<B: Backend>(
    allocator: &mut CachingAllocator<B>,
    steps: &[Step],
    streams: &[StreamId; 2],
    mut on_alloc: impl FnMut(&Allocation, usize),
    mut on_free: impl FnMut(&Allocation, usize),
) -> Vec<(u64, u64)> {
    let mut handles: Vec<Option<Allocation>> = vec![None; steps.len() + 1];
    let mut after_each = Vec::with_capacity(steps.len());
    for step in steps {
        match *step {
            Step::Alloc { id, size, stream } => {
                let a = allocator.malloc(size, streams[stream]).unwrap();
                on_alloc(&a, id);
                handles[id] = Some(a);
            }
            Step::Free { id } => {
                if let Some(a) = handles[id].take() {
                    on_free(&a, id);
                    allocator.free(a).unwrap();
                }
            }
            Step::EmptyCache => allocator.empty_cache().unwrap(),
        }
        after_each.push((allocator.memory_allocated(), allocator.memory_reserved()));
    }
    after_each
}

fn without_time(trace: &[TraceEntry]) -> Vec<(TraceAction, u64, u64, StreamId)> {
    trace.iter().map(|e| (e.action, e.addr, e.size, e.stream)).collect()
}

#[test]
fn expandable_segments_match_the_simulator() {
    let Some(device) = common::device("expandable_segments_match_the_simulator") else { return };
    let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let (mut cuda, kernels) = common::allocator_and_kernels(&device, config.clone());
    assert!(cuda.device().supports_expandable_segments, "the device has no VMM support");
    let streams = [StreamId::DEFAULT, device.new_stream().unwrap()];
    let steps = steps(3000);
    cuda.record_history(true, 10_000_000, &[], true);

    // On the GPU: every block is filled with its own pattern and checked when freed; the
    // bytes the backend holds are the allocator's `reserved` after every step.
    let counter_cell: std::cell::Cell<Option<Allocation>> = std::cell::Cell::new(None);
    let kernels_ref: &CudaKernels = &kernels;
    let cuda_numbers = replay(
        &mut cuda,
        &steps,
        &streams,
        |a, id| {
            if id == 0 {
                kernels_ref.fill_u32(a.stream(), a, 1, 0).unwrap();
                counter_cell.set(Some(*a));
            } else {
                kernels_ref.fill_pattern(a.stream(), DeviceSpan::block(a), a.size() / 4, id as u64).unwrap();
            }
        },
        |a, id| {
            if let (Some(counter), true) = (counter_cell.get(), id != 0) {
                device.wait_stream(a.stream(), StreamId::DEFAULT).unwrap();
                kernels_ref.check_pattern(a.stream(), DeviceSpan::block(a), a.size() / 4, id as u64, &counter).unwrap();
                // The counter lives on the default stream; order its use there before it is freed.
                device.wait_stream(StreamId::DEFAULT, a.stream()).unwrap();
            } else if id == 0 {
                let errors = common::read_counter(&device, kernels_ref, a);
                assert_eq!(errors, 0, "corrupted words in expandable segments");
            }
        },
    );
    let bases = cuda.backend().reservation_bases().to_vec();
    let cuda_trace = without_time(&cuda.trace());
    assert_eq!(cuda.backend().device_bytes(), 0);
    assert!(cuda_trace.iter().any(|e| e.0 == TraceAction::SegmentMap));
    assert!(cuda_trace.iter().any(|e| e.0 == TraceAction::SegmentUnmap));

    // The simulator with the same device total and the addresses the driver gave the
    // reservations (PyTorch breaks ties by address).
    let total = cuda.device().total_memory;
    let mut sim_backend = SimBackend::new(total);
    sim_backend.plan_reservation_addresses(bases.iter().copied());
    let mut sim = CachingAllocator::new(sim_backend, config).unwrap();
    sim.record_history(true, 10_000_000, &[], true);
    let sim_numbers = replay(&mut sim, &steps, &streams, |_, _| {}, |_, _| {});
    assert_eq!(sim.backend().plan_misses(), 0);

    let first_difference = cuda_numbers.iter().zip(&sim_numbers).position(|(c, s)| c != s);
    assert_eq!(first_difference, None, "allocated/reserved differ at step {first_difference:?}");
    let sim_trace = without_time(&sim.trace());
    let first_difference = cuda_trace.iter().zip(&sim_trace).position(|(c, s)| c != s);
    assert_eq!(first_difference, None, "traces differ at entry {first_difference:?}");
    assert_eq!(cuda_trace.len(), sim_trace.len());
    let maps = cuda_trace.iter().filter(|e| e.0 == TraceAction::SegmentMap).count();
    let unmaps = cuda_trace.iter().filter(|e| e.0 == TraceAction::SegmentUnmap).count();
    let peak = cuda.stats().reserved_bytes.all().peak;
    println!("{} steps, {maps} segment_map, {unmaps} segment_unmap, peak reserved {peak}: identical", steps.len());
}

#[test]
fn device_bytes_follow_reserved_step_by_step_with_expandable_segments() {
    let Some(device) = common::device("device_bytes_follow_reserved_step_by_step_with_expandable_segments") else {
        return;
    };
    let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let (mut cuda, _kernels) = common::allocator_and_kernels(&device, config);
    let streams = [StreamId::DEFAULT, device.new_stream().unwrap()];
    let mut handles: Vec<Option<Allocation>> = vec![None; 4000];
    for step in steps(1000) {
        match step {
            Step::Alloc { id, size, stream } => handles[id] = Some(cuda.malloc(size, streams[stream]).unwrap()),
            Step::Free { id } => {
                if let Some(a) = handles[id].take() {
                    cuda.free(a).unwrap();
                }
            }
            Step::EmptyCache => cuda.empty_cache().unwrap(),
        }
        // Physical pages the driver holds for us = reserved, at every step.
        assert_eq!(cuda.backend().mapped_bytes(), cuda.memory_reserved());
        assert_eq!(cuda.backend().segment_count(), 0, "expandable mode makes no cuMemAlloc segments");
    }
}

fn oom_message(error: AllocatorError) -> String {
    match error {
        AllocatorError::OutOfMemory(oom) => oom.message,
        other => panic!("expected out of memory, got {other}"),
    }
}

#[test]
fn out_of_memory_enters_the_retry_chain_and_leaves_the_allocator_usable() {
    let Some(device) = common::device("out_of_memory_enters_the_retry_chain_and_leaves_the_allocator_usable") else {
        return;
    };
    let (mut a, _kernels) = common::allocator_and_kernels(&device, AllocatorConfig::default());
    let cached = a.malloc(20 << 20, StreamId::DEFAULT).unwrap();
    a.free(cached).unwrap();
    assert_eq!(a.memory_reserved(), 20 << 20);
    let total = a.device().total_memory;
    let message = oom_message(a.malloc(2 * total, StreamId::DEFAULT).unwrap_err());
    println!("{message}");
    assert!(message.starts_with("CUDA out of memory. Tried to allocate"), "{message}");
    assert!(message.contains("GPU 0 has a total capacity of"), "{message}");
    let stats = a.stats();
    assert_eq!((stats.num_ooms, stats.num_alloc_retries), (1, 1));
    assert_eq!(a.memory_reserved(), 0, "the retry chain released the cached segment");
    assert_eq!(a.backend().device_bytes(), 0);
    let x = a.malloc(1 << 20, StreamId::DEFAULT).unwrap();
    a.free(x).unwrap();
}

#[test]
fn expandable_out_of_memory_rolls_back_the_pages_it_mapped() {
    let Some(device) = common::device("expandable_out_of_memory_rolls_back_the_pages_it_mapped") else { return };
    let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let (mut a, _kernels) = common::allocator_and_kernels(&device, config);
    a.record_history(true, 100_000, &[], true);
    let cached = a.malloc(40 << 20, StreamId::DEFAULT).unwrap();
    a.free(cached).unwrap();
    assert_eq!(a.backend().mapped_bytes(), 40 << 20);
    let (free_before, _) = device.memory_info().unwrap();
    // More than the device has, less than one reservation (1.125 x total): pages are mapped
    // one by one until the driver refuses, then all of them are unmapped again; the retry
    // chain unmaps the cached pages and tries once more.
    let total = a.device().total_memory;
    let request = total + total / 32;
    let message = oom_message(a.malloc(request, StreamId::DEFAULT).unwrap_err());
    println!("{message}");
    assert_eq!(a.backend().mapped_bytes(), 0, "a failed mapping left pages behind");
    assert_eq!(a.memory_reserved(), 0);
    let (free_after, _) = device.memory_info().unwrap();
    assert!(
        free_after + (64 << 20) >= free_before + (40 << 20),
        "device memory not given back: free {free_before} before, {free_after} after"
    );
    let actions: Vec<TraceAction> = a.trace().iter().map(|e| e.action).collect();
    assert_eq!(actions.iter().filter(|&&x| x == TraceAction::SegmentUnmap).count(), 1, "{actions:?}");
    assert_eq!(actions.iter().filter(|&&x| x == TraceAction::SegmentMap).count(), 1, "only the first 40 MiB");
    assert_eq!(actions.last(), Some(&TraceAction::Oom));
    // Still usable.
    let x = a.malloc(40 << 20, StreamId::DEFAULT).unwrap();
    assert_eq!(a.backend().mapped_bytes(), 40 << 20);
    a.free(x).unwrap();
    let _: &Arc<_> = &device;
}

#[test]
fn unknown_streams_and_bad_frees_are_errors() {
    let Some(device) = common::device("unknown_streams_and_bad_frees_are_errors") else { return };
    let mut backend = CudaBackend::with_device(Arc::clone(&device)).unwrap();
    assert!(backend.record_event(StreamId(0xdead_beef)).is_err(), "an event on a stream this device never made");
    assert!(backend.free_segment(0x1234_0000, 4096).is_err(), "a segment this backend never made");
    let ptr = backend.allocate_segment(2 << 20, StreamId::DEFAULT).unwrap();
    assert!(backend.free_segment(ptr, 4 << 20).is_err(), "the wrong size");
    backend.free_segment(ptr, 2 << 20).unwrap();
    let event = backend.record_event(StreamId::DEFAULT).unwrap();
    backend.synchronize_event(&event).unwrap();
    assert!(backend.query_event(&event).unwrap());
    backend.release_event(event);
}
