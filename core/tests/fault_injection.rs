//! Fault injection: a workload runs once per device call, with that call failing. After every
//! failure the allocator's invariants hold, every stat equals a recount from scratch
//! (`check_consistency`), the reserved bytes equal what the device holds, and the workload
//! goes on and cleans up as if nothing had happened.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use cachalot_core::backend::{BackendError, DeviceFacts, Pages, Segments, StreamEvents, StreamId};
use cachalot_core::{Allocation, AllocatorConfig, AllocatorError, CachingAllocator, SimBackend};

const MIB: u64 = 1 << 20;

/// The simulator, with its `fail_at`-th device call (counting from 1) failing.
struct Faulty {
    sim: SimBackend,
    calls: u64,
    fail_at: u64,
    /// The error the failing call returns.
    error: BackendError,
}

impl Faulty {
    /// Counts a call; `Err` if it is the one to fail.
    fn call(&mut self) -> Result<(), BackendError> {
        self.calls += 1;
        if self.calls == self.fail_at { Err(self.error.clone()) } else { Ok(()) }
    }
}

impl Segments for Faulty {
    fn device(&self) -> &DeviceFacts {
        self.sim.device()
    }
    fn allocate_segment(&mut self, size: u64, stream: StreamId) -> Result<u64, BackendError> {
        self.call()?;
        self.sim.allocate_segment(size, stream)
    }
    fn free_segment(&mut self, address: u64, size: u64) -> Result<(), BackendError> {
        self.call()?;
        self.sim.free_segment(address, size)
    }
    fn memory_info(&mut self) -> Result<(u64, u64), BackendError> {
        self.call()?;
        self.sim.memory_info()
    }
}

impl Pages for Faulty {
    fn reserve_address_space(&mut self, size: u64, page_size: u64, stream: StreamId) -> Result<u64, BackendError> {
        self.call()?;
        self.sim.reserve_address_space(size, page_size, stream)
    }
    fn map_pages(&mut self, base: u64, offset: u64, size: u64) -> Result<(), BackendError> {
        self.call()?;
        self.sim.map_pages(base, offset, size)
    }
    fn unmap_pages(&mut self, base: u64, offset: u64, size: u64, stream: StreamId) -> Result<(), BackendError> {
        self.call()?;
        self.sim.unmap_pages(base, offset, size, stream)
    }
    fn release_address_space(&mut self, base: u64, size: u64) -> Result<(), BackendError> {
        self.call()?;
        self.sim.release_address_space(base, size)
    }
}

impl StreamEvents for Faulty {
    type Event = <SimBackend as StreamEvents>::Event;
    fn record_event(&mut self, stream: StreamId) -> Result<Self::Event, BackendError> {
        self.call()?;
        self.sim.record_event(stream)
    }
    fn query_event(&mut self, event: &Self::Event) -> Result<bool, BackendError> {
        self.call()?;
        self.sim.query_event(event)
    }
    fn synchronize_event(&mut self, event: &Self::Event) -> Result<(), BackendError> {
        self.call()?;
        self.sim.synchronize_event(event)
    }
    fn release_event(&mut self, event: Self::Event) {
        self.sim.release_event(event)
    }
}

/// Streams of the workload.
const STREAMS: [StreamId; 4] = [StreamId(0), StreamId(0x100), StreamId(0x200), StreamId(0x300)];

/// What one run saw: device calls made, and how many operations failed.
struct Run {
    calls: u64,
    failures: usize,
}

/// Checks the state after an operation; `what` names it in the failure.
fn check(a: &CachingAllocator<Faulty>, live: &[Allocation], what: &str) {
    if let Err(violation) = a.check_consistency() {
        panic!("{what}: {violation}");
    }
    assert_eq!(a.memory_reserved(), a.backend().sim.used(), "{what}: reserved bytes equal device bytes");
    assert_eq!(a.memory_allocated(), live.iter().map(Allocation::size).sum::<u64>(), "{what}: allocated bytes");
}

/// A workload over every path that calls the device: new segments in both pools, oversize
/// releases, cross-stream frees with events, garbage collection, the retry after releasing the
/// cache, expandable segments mapped and unmapped, and `empty_cache`.
fn workload(settings: &str, fail_at: u64, error: BackendError) -> Run {
    let config = AllocatorConfig::parse(settings).unwrap();
    let sim = SimBackend::new(160 * MIB);
    let faulty = Faulty { sim, calls: 0, fail_at, error };
    let mut a = CachingAllocator::new(faulty, config).unwrap();
    let mut live: Vec<Allocation> = Vec::new();
    let mut failures = 0;
    let sizes = [512, 3 * MIB, 700 * 1024, 24 * MIB, 2 * MIB, 45 * MIB, 1000, 13 * MIB, 70 * MIB];
    for round in 0..6usize {
        for (i, &size) in sizes.iter().enumerate() {
            let stream = STREAMS[(round + i) % STREAMS.len()];
            let what = format!("fail_at {fail_at}, round {round}, malloc {size} on {stream:?}");
            match a.malloc(size, stream) {
                Ok(x) => live.push(x),
                Err(AllocatorError::OutOfMemory(_) | AllocatorError::Backend(_)) => failures += 1,
                Err(other) => panic!("{what}: {other}"),
            }
            check(&a, &live, &what);
            if i % 3 == 2 && !live.is_empty() {
                let x = live.swap_remove((round * 7 + i) % live.len());
                let other = STREAMS[(round + i + 1) % STREAMS.len()];
                if round % 2 == 1 {
                    a.backend_mut().sim.hold_stream(other);
                    if a.record_stream(&x, other).is_err() {
                        failures += 1;
                    }
                }
                let what = format!("fail_at {fail_at}, round {round}, free after {i}");
                if a.free(x).is_err() {
                    // A free that fails leaves the block allocated and intact.
                    failures += 1;
                    live.push(x);
                }
                check(&a, &live, &what);
                a.backend_mut().sim.finish_stream(other);
            }
        }
        if round % 2 == 0 && a.empty_cache().is_err() {
            failures += 1;
        }
        check(&a, &live, &format!("fail_at {fail_at}, round {round}, empty_cache"));
    }
    // Clean up: everything can be freed and released once the fault has passed.
    while let Some(x) = live.pop() {
        if a.free(x).is_err() {
            failures += 1;
            a.free(x).unwrap();
        }
    }
    for s in STREAMS {
        a.backend_mut().sim.finish_stream(s);
    }
    if a.empty_cache().is_err() {
        failures += 1;
        a.empty_cache().unwrap();
    }
    check(&a, &live, &format!("fail_at {fail_at}, end"));
    assert_eq!(a.memory_reserved(), 0, "fail_at {fail_at}: the cache empties");
    assert_eq!(a.backend().sim.used(), 0, "fail_at {fail_at}: the device empties");
    Run { calls: a.backend().calls, failures }
}

/// Every device call of the workload fails once, under each configuration family, both as the
/// device's out-of-memory and as another device error.
#[test]
fn every_device_call_can_fail() {
    for settings in [
        "",
        "max_split_size_mb:40,garbage_collection_threshold:0.5",
        "expandable_segments:True",
        "expandable_segments:True,max_split_size_mb:20",
    ] {
        let clean = workload(settings, 0, BackendError::out_of_memory());
        assert!(clean.calls > 20, "{settings}: the workload makes {} device calls", clean.calls);
        for error in [BackendError::out_of_memory(), BackendError::Device("injected failure".into())] {
            let mut failed_runs = 0;
            for n in 1..=clean.calls {
                let run = workload(settings, n, error.clone());
                failed_runs += usize::from(run.failures > 0);
            }
            // Not every failure reaches the caller (a failed query is retried, an out-of-memory
            // is answered by releasing the cache), but most do.
            assert!(failed_runs > 0, "{settings}: no injected failure was seen");
        }
    }
}
