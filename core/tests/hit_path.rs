//! The cache-hit path makes no heap allocation and no backend call: after a warm-up, allocating
//! and freeing from the cache touches neither the global allocator nor the device.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::alloc::{GlobalAlloc, Layout, System};

use cachalot_core::backend::{BackendError, DeviceFacts, Pages, Segments, StreamEvents, StreamId};
use cachalot_core::sim::SimEvent;
use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend};

/// Counts heap allocations per thread, so tests running in parallel don't see each other's.
struct Counting;

thread_local! {
    static HEAP_ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn heap_allocations() -> u64 {
    HEAP_ALLOCATIONS.with(|c| c.get())
}

fn count() {
    // `try_with`: during thread teardown the counter may be gone; those allocations don't matter.
    let _ = HEAP_ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The simulator, counting every call the allocator makes to it.
struct CountingBackend {
    sim: SimBackend,
    calls: u64,
}

impl Segments for CountingBackend {
    fn device(&self) -> &DeviceFacts {
        self.sim.device()
    }
    fn allocate_segment(&mut self, size: u64, stream: StreamId) -> Result<u64, BackendError> {
        self.calls += 1;
        self.sim.allocate_segment(size, stream)
    }
    fn free_segment(&mut self, address: u64, size: u64) -> Result<(), BackendError> {
        self.calls += 1;
        self.sim.free_segment(address, size)
    }
    fn memory_info(&mut self) -> Result<(u64, u64), BackendError> {
        self.calls += 1;
        self.sim.memory_info()
    }
    fn now_us(&mut self) -> i64 {
        self.calls += 1;
        0
    }
}

impl Pages for CountingBackend {
    fn reserve_address_space(&mut self, size: u64, page_size: u64, stream: StreamId) -> Result<u64, BackendError> {
        self.calls += 1;
        self.sim.reserve_address_space(size, page_size, stream)
    }
    fn map_pages(&mut self, base: u64, offset: u64, size: u64) -> Result<(), BackendError> {
        self.calls += 1;
        self.sim.map_pages(base, offset, size)
    }
    fn unmap_pages(&mut self, base: u64, offset: u64, size: u64, stream: StreamId) -> Result<(), BackendError> {
        self.calls += 1;
        self.sim.unmap_pages(base, offset, size, stream)
    }
    fn release_address_space(&mut self, base: u64, size: u64) -> Result<(), BackendError> {
        self.calls += 1;
        self.sim.release_address_space(base, size)
    }
}

impl StreamEvents for CountingBackend {
    type Event = SimEvent;
    fn record_event(&mut self, stream: StreamId) -> Result<SimEvent, BackendError> {
        self.calls += 1;
        self.sim.record_event(stream)
    }
    fn query_event(&mut self, event: &SimEvent) -> Result<bool, BackendError> {
        self.calls += 1;
        self.sim.query_event(event)
    }
    fn synchronize_event(&mut self, event: &SimEvent) -> Result<(), BackendError> {
        self.calls += 1;
        self.sim.synchronize_event(event)
    }
}

#[test]
fn cache_hits_allocate_nothing_and_call_no_backend() {
    for settings in ["", "max_split_size_mb:64,roundup_power2_divisions:4", "expandable_segments:True"] {
        let backend = CountingBackend { sim: SimBackend::new(64 << 30), calls: 0 };
        let mut a = CachingAllocator::new(backend, AllocatorConfig::parse(settings).unwrap()).unwrap();
        let sizes: Vec<u64> = (0..400u64).map(|i| 512 + (i * 7919 % 97) * 4096 + (i % 3) * (3 << 20)).collect();
        let mut live = Vec::with_capacity(sizes.len());
        // Warm up: the segments, the block slab and the index grow to their working size.
        for _ in 0..3 {
            for &size in &sizes {
                live.push(a.malloc(size, StreamId::DEFAULT).unwrap());
            }
            for x in live.drain(..).rev() {
                a.free(x).unwrap();
            }
        }
        let heap_before = heap_allocations();
        let calls_before = a.backend().calls;
        for _ in 0..5 {
            for &size in &sizes {
                live.push(a.malloc(size, StreamId::DEFAULT).unwrap());
            }
            for x in live.drain(..).rev() {
                a.free(x).unwrap();
            }
        }
        let heap = heap_allocations() - heap_before;
        let calls = a.backend().calls - calls_before;
        assert_eq!(heap, 0, "{settings:?}: heap allocations on the cache-hit path");
        assert_eq!(calls, 0, "{settings:?}: backend calls on the cache-hit path");
        a.check_consistency().unwrap();
    }
}

/// The same counters do see the misses, so the test above can fail.
#[test]
fn misses_are_counted() {
    let backend = CountingBackend { sim: SimBackend::new(64 << 30), calls: 0 };
    let mut a = CachingAllocator::new(backend, AllocatorConfig::default()).unwrap();
    let x = a.malloc(3 << 20, StreamId::DEFAULT).unwrap();
    assert!(a.backend().calls > 0, "a new segment calls the backend");
    a.free(x).unwrap();
    let heap_before = heap_allocations();
    let mut held = Vec::new();
    for _ in 0..10_000 {
        held.push(a.malloc(512, StreamId::DEFAULT).unwrap());
    }
    assert!(heap_allocations() > heap_before, "growing the slab allocates");
}
