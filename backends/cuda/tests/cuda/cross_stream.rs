//! Cross-stream safety: a block freed while a long kernel on another stream still writes it
//! (`record_stream`) is not handed out again until that kernel has finished. The same scenario
//! on a backend that ignores events shows the test catches the bug: there the block comes
//! back at once and its new contents are overwritten. The same holds on streams the allocator's
//! device did not make (PyTorch's, taken as raw handles), and pages used on such a stream are
//! unmapped after it.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cachalot_core::{
    AllocatorConfig, Backend, BackendError, CachingAllocator, EventLayer, Segments, StreamEvents, StreamId,
    TraceAction, WithEvents,
};
use cachalot_cuda::cudarc::driver::CudaEvent;
use cachalot_cuda::{CudaBackend, CudaDevice, CudaKernels, DeviceSpan};

use crate::common;

/// The CUDA backend's events with their logic removed: every event reads as complete at once.
struct IgnoreEvents;

impl EventLayer<CudaBackend> for IgnoreEvents {
    type Event = CudaEvent;
    fn record_event(&mut self, device: &mut CudaBackend, stream: StreamId) -> Result<CudaEvent, BackendError> {
        device.record_event(stream)
    }
    fn query_event(&mut self, _device: &mut CudaBackend, _event: &CudaEvent) -> Result<bool, BackendError> {
        Ok(true)
    }
    fn synchronize_event(&mut self, _device: &mut CudaBackend, _event: &CudaEvent) -> Result<(), BackendError> {
        Ok(())
    }
}

/// Large pool, exact 16 MiB segments: the block is a whole segment.
const SIZE: u64 = 16 << 20;
const WORDS: u64 = SIZE / 4;
const SPIN: Duration = Duration::from_millis(500);
/// Cached 18 MiB segments serve the allocations made while the kernel runs, so that no
/// `cuMemAlloc` (which may synchronize) happens then; a free 16 MiB block is always the better
/// fit, so X's block is taken whenever it is back in the cache.
const SPARE: u64 = 18 << 20;

/// Caches `count` spare segments on `stream`.
fn cache_spares<B: Backend>(allocator: &mut CachingAllocator<B>, stream: StreamId, count: usize) {
    let spares: Vec<_> = (0..count).map(|_| allocator.malloc(SPARE, stream).unwrap()).collect();
    for spare in spares {
        allocator.free(spare).unwrap();
    }
}

struct Outcome {
    /// The freed block's address, and the address of each allocation made while the kernel ran.
    freed: u64,
    while_running: Vec<u64>,
    /// Whether the kernel was still running after the last of those allocations was filled.
    still_running: bool,
    /// Words of the first such allocation that did not hold its own pattern afterwards.
    corrupted: u32,
    /// The address a same-size allocation got after the kernel finished.
    after: u64,
}

/// Allocates X on A and fills it; B (after A) runs a long kernel writing X; X is freed with
/// `record_stream(B)`; then same-size allocations on A, each filled with its own pattern, while
/// B's kernel still runs.
fn scenario<B: Backend>(
    allocator: &mut CachingAllocator<B>,
    device: &Arc<CudaDevice>,
    kernels: &CudaKernels,
    a: StreamId,
    b: StreamId,
) -> Outcome {
    let counter = allocator.malloc(4, a).unwrap();
    kernels.fill_u32(a, &counter, 1, 0).unwrap();
    // X first, as a segment of its own; then the spares.
    let x = allocator.malloc(SIZE, a).unwrap();
    kernels.fill_pattern(a, &x, WORDS, 1).unwrap();
    cache_spares(allocator, a, 4);
    device.wait_stream(b, a).unwrap();
    kernels.spin_fill_pattern(b, &x, WORDS, 2, SPIN, 4).unwrap();
    let kernel_done = device.record_event(b).unwrap();
    allocator.record_stream(&x, b).unwrap();
    let freed = x.address();
    allocator.free(x).unwrap();

    let started = Instant::now();
    let mut held = Vec::new();
    let mut while_running = Vec::new();
    for seed in 10..14u64 {
        let y = allocator.malloc(SIZE, a).unwrap();
        kernels.fill_pattern(a, &y, WORDS, seed).unwrap();
        while_running.push(y.address());
        held.push((y, seed));
    }
    let still_running = !kernel_done.is_complete();
    assert!(started.elapsed() < SPIN, "the allocations took longer than the kernel runs");
    kernel_done.synchronize().unwrap();
    device.synchronize().unwrap();
    // Only the first allocation can have been X's block (the best fit when it is free); check
    // it once everything is done.
    let (first, seed) = held[0];
    kernels.check_pattern(a, &first, WORDS, seed, &counter).unwrap();
    let corrupted = common::read_counter(device, kernels, &counter);
    // Now the kernel is over: X's block comes back (process_events completes the free) and is
    // the only free block that fits exactly (the spares in use left 2 MiB remainders).
    let z = allocator.malloc(SIZE, a).unwrap();
    let after = z.address();
    for (y, _) in held {
        allocator.free(y).unwrap();
    }
    allocator.free(z).unwrap();
    allocator.free(counter).unwrap();
    allocator.empty_cache().unwrap();
    Outcome { freed, while_running, still_running, corrupted, after }
}

/// The checks of a scenario on a backend whose events work.
fn assert_kept_until_the_kernel_ended(outcome: &Outcome) {
    assert!(outcome.still_running, "the kernel on B ended too early for the test to mean anything");
    assert!(
        outcome.while_running.iter().all(|&addr| addr != outcome.freed),
        "the block was handed out again while B's kernel still wrote it: {:#x} in {:x?}",
        outcome.freed,
        outcome.while_running
    );
    assert_eq!(outcome.corrupted, 0, "a block allocated while B's kernel ran was overwritten");
    assert_eq!(outcome.after, outcome.freed, "once B's kernel ended, the block is reused");
}

#[test]
fn a_block_in_use_on_another_stream_is_not_reused_until_its_kernel_ends() {
    let Some(device) = common::device("a_block_in_use_on_another_stream_is_not_reused_until_its_kernel_ends") else {
        return;
    };
    let kernels = CudaKernels::new(&device).expect("kernels");
    let (a, b) = (device.new_stream().unwrap(), device.new_stream().unwrap());

    let backend = CudaBackend::with_device(Arc::clone(&device)).unwrap();
    let mut allocator = CachingAllocator::new(backend, AllocatorConfig::default()).unwrap();
    let good = scenario(&mut allocator, &device, &kernels, a, b);
    assert_kept_until_the_kernel_ended(&good);
    let stats = allocator.stats();
    assert_eq!(stats.num_sync_all_streams, 1, "only the final empty_cache synchronized");

    // The same with the event logic removed: the checks above would fail.
    let backend = WithEvents::new(CudaBackend::with_device(Arc::clone(&device)).unwrap(), IgnoreEvents);
    let mut broken = CachingAllocator::new(backend, AllocatorConfig::default()).unwrap();
    let bad = scenario(&mut broken, &device, &kernels, a, b);
    assert!(bad.still_running, "the kernel on B ended too early for the control to mean anything");
    assert_eq!(bad.while_running[0], bad.freed, "without events the block comes back at once");
    assert!(bad.corrupted > 0, "without events, B's kernel overwrites the new allocation");
    println!(
        "with events: {:#x} kept out while the kernel ran ({} allocations elsewhere); without: reused at once, \
         {} of {WORDS} words overwritten",
        good.freed,
        good.while_running.len(),
        bad.corrupted
    );
}

/// The allocator's device takes streams it did not make (PyTorch's case): the kernel's stream
/// belongs to another owner, and the allocator's events on it keep the block as on its own.
#[test]
fn a_block_in_use_on_a_foreign_stream_is_not_reused_until_its_kernel_ends() {
    let Some(owner) = common::device("a_block_in_use_on_a_foreign_stream_is_not_reused_until_its_kernel_ends") else {
        return;
    };
    let kernels = CudaKernels::new(&owner).expect("kernels");
    let (a, b) = (owner.new_stream().unwrap(), owner.new_stream().unwrap());
    // SAFETY: `a` and `b` are live streams of device 0's primary context, held by `owner` until
    // the end of the test.
    let device = unsafe { CudaDevice::open_with_foreign_streams(0) }.unwrap();
    assert!(device.takes_foreign_streams() && !device.has_stream(a) && !device.has_stream(b));
    let mut plain = CudaBackend::with_device(CudaDevice::open(0).unwrap()).unwrap();
    assert!(plain.record_event(b).is_err(), "a device that takes no foreign streams refuses one");

    let backend = CudaBackend::with_device(device).unwrap();
    let mut allocator = CachingAllocator::new(backend, AllocatorConfig::default()).unwrap();
    assert_kept_until_the_kernel_ended(&scenario(&mut allocator, &owner, &kernels, a, b));
}

/// Pages used on a foreign stream are unmapped after it: `empty_cache` synchronizes that
/// stream (through the borrowed handle) and gives every page back; a foreign stream also
/// answers whether it is capturing a CUDA graph.
#[test]
fn pages_used_on_a_foreign_stream_are_unmapped_after_it() {
    let Some(owner) = common::device("pages_used_on_a_foreign_stream_are_unmapped_after_it") else { return };
    let kernels = CudaKernels::new(&owner).expect("kernels");
    let stream = owner.new_stream().unwrap();
    // SAFETY: `stream` is a live stream of device 0's primary context, held by `owner` until
    // the end of the test.
    let device = unsafe { CudaDevice::open_with_foreign_streams(0) }.unwrap();
    assert!(!device.is_capturing(stream).unwrap());
    assert!(owner.is_capturing(StreamId(0xdead_beef)).is_err(), "a stream the owner never made");
    let backend = CudaBackend::with_device(device).unwrap();
    if !backend.device().supports_expandable_segments {
        let _ = writeln!(std::io::stderr(), "skipped pages_used_on_a_foreign_stream_are_unmapped_after_it: no VMM");
        return;
    }
    let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let mut allocator = CachingAllocator::new(backend, config).unwrap();
    allocator.record_history(true, usize::MAX, &[], false);
    let x = allocator.malloc(SIZE, stream).unwrap();
    kernels.spin_fill_pattern(stream, DeviceSpan::block(&x), WORDS, 5, Duration::from_millis(100), 2).unwrap();
    allocator.free(x).unwrap();
    allocator.empty_cache().unwrap();
    assert_eq!((allocator.memory_reserved(), allocator.backend().mapped_bytes()), (0, 0));
    assert!(allocator.trace().iter().any(|e| e.action == TraceAction::SegmentUnmap && e.stream == stream));
}

#[test]
fn process_events_hands_the_block_back_only_after_completion() {
    let Some(device) = common::device("process_events_hands_the_block_back_only_after_completion") else { return };
    let (mut allocator, kernels) = common::allocator_and_kernels(&device, AllocatorConfig::default());
    let (a, b) = (device.new_stream().unwrap(), device.new_stream().unwrap());
    let x = allocator.malloc(SIZE, a).unwrap();
    cache_spares(&mut allocator, a, 1);
    device.wait_stream(b, a).unwrap();
    kernels.spin_fill_pattern(b, DeviceSpan::block(&x), WORDS, 3, Duration::from_millis(300), 2).unwrap();
    let done = device.record_event(b).unwrap();
    allocator.record_stream(&x, b).unwrap();
    let freed = x.address();
    allocator.free(x).unwrap();
    // Poll: every same-size allocation made while the kernel runs is served by the spare
    // segment; once the kernel has ended, X's block (the better fit) comes back.
    let (mut polls_running, mut polls_after) = (0, 0);
    loop {
        let done_before = done.is_complete();
        let y = allocator.malloc(SIZE, a).unwrap();
        let reused = y.address() == freed;
        allocator.free(y).unwrap();
        if reused {
            // The allocator saw its event (recorded after `done` on B) complete.
            assert!(done.is_complete(), "poll {polls_running}: reused while the kernel ran");
            break;
        }
        if done_before {
            polls_after += 1;
            assert!(polls_after < 100, "the kernel is done, but the block does not come back");
        } else {
            polls_running += 1;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(polls_running > 5, "the kernel should have run for many polls, ran for {polls_running}");
    assert_eq!(allocator.memory_allocated(), 0);
    allocator.empty_cache().unwrap();
    assert_eq!(allocator.memory_reserved(), 0);
}
