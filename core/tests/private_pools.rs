//! Private pools (`torch.cuda.MemPool` + `use_mem_pool`, CUDA-graph pools): requests routed to
//! a pool by id are served from its own blocks, the default pools never reuse them, and a pool's
//! segments go back to the device once every user released it and `empty_cache` runs. The
//! examples follow traces PyTorch 2.11 recorded (`testdata/conformance/pools/`); the property
//! test checks the invariants after every operation of random sequences, errors included.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use cachalot_core::{
    Allocation, AllocatorConfig, AllocatorError, CachingAllocator, PoolError, PoolFilter, PoolId, SimBackend, StreamId,
};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn allocator(settings: &str, total: u64) -> CachingAllocator<SimBackend> {
    CachingAllocator::new(SimBackend::new(total), AllocatorConfig::parse(settings).unwrap()).unwrap()
}

/// The pool of the segment holding `address`, from the snapshot.
fn pool_of(a: &CachingAllocator<SimBackend>, address: u64) -> PoolId {
    a.snapshot().iter().find(|s| (s.address..s.address + s.total_size).contains(&address)).map(|s| s.pool_id).unwrap()
}

/// `pool_basic` of the captures: the default pool's cached 20 MiB segment does not serve the
/// pool's request, the pool's freed block does not serve a default request, `empty_cache` keeps
/// a live pool's segments, and deleting the pool (release + `empty_cache` of it) frees them,
/// small pool first.
#[test]
fn a_pool_and_the_default_pools_never_share_blocks() {
    let mut a = allocator("", 80 << 30);
    let pool = PoolId(0, 1);
    let cached = a.malloc(3 * MIB, S0).unwrap();
    let default_small = a.malloc(4096, S0).unwrap();
    a.free(cached).unwrap();

    a.create_pool(pool).unwrap();
    a.begin_allocate_to_pool(pool, PoolFilter::AllStreams).unwrap();
    let x = a.malloc(3 * MIB, S0).unwrap();
    assert_ne!(x.address(), cached.address(), "the default pool's free block is not the pool's");
    let small = a.malloc(700, S0).unwrap();
    assert_eq!(pool_of(&a, x.address()), pool);
    assert_eq!(pool_of(&a, small.address()), pool);
    a.end_allocate_to_pool(pool).unwrap();
    a.release_pool(pool).unwrap();

    a.free(x).unwrap();
    let y = a.malloc(MIB, S0).unwrap();
    assert_eq!(pool_of(&a, y.address()), PoolId::DEFAULT, "the pool's free block is not the default pools'");
    a.empty_cache().unwrap();
    assert_eq!(a.snapshot().iter().filter(|s| s.pool_id == pool).count(), 2, "a live pool keeps its segments");
    a.check_consistency().unwrap();

    a.free(small).unwrap();
    a.record_history(true, usize::MAX, &[], false);
    a.release_pool(pool).unwrap();
    a.empty_pool_cache(pool).unwrap();
    let released: Vec<u64> = a.trace().iter().map(|e| e.size).collect();
    assert_eq!(released, [2 * MIB, 20 * MIB], "the pool's small segment goes first, then the large one");
    assert!(a.private_pools().is_empty(), "a released pool without segments is dropped");
    for x in [default_small, y] {
        a.free(x).unwrap();
    }
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    a.check_consistency().unwrap();
}

/// `pool_outlives`: a tensor outlives its MemPool; the segment holding it stays (the pool is
/// freeable, not gone) and a later `empty_cache` frees it once the tensor is freed.
#[test]
fn a_released_pool_keeps_segments_with_live_blocks_until_empty_cache() {
    let mut a = allocator("", 80 << 30);
    let pool = PoolId(0, 1);
    a.create_pool(pool).unwrap();
    a.begin_allocate_to_pool(pool, PoolFilter::AllStreams).unwrap();
    let keep = a.malloc(5 * MIB, S0).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    a.empty_pool_cache(pool).unwrap();
    assert_eq!(a.private_pools(), [(pool, 0)]);
    let other = a.malloc(8 * MIB, S0).unwrap();
    assert_eq!(pool_of(&a, other.address()), PoolId::DEFAULT, "a freeable pool serves nobody");
    a.free(keep).unwrap();
    assert_eq!(a.memory_reserved(), 40 * MIB);
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 20 * MIB, "empty_cache frees the freeable pool's segment");
    assert!(a.private_pools().is_empty());
    a.free(other).unwrap();
    a.check_consistency().unwrap();
}

/// `pool_two_pools`: with nested scopes the pool routed to last serves; a capture's pool serves
/// its stream only.
#[test]
fn the_pool_routed_to_last_serves_and_a_stream_filter_is_kept() {
    let mut a = allocator("", 80 << 30);
    let (p1, p2, graph) = (PoolId(0, 1), PoolId(0, 2), PoolId(1, 0));
    a.create_pool(p1).unwrap();
    a.create_pool(p2).unwrap();
    a.begin_allocate_to_pool(p1, PoolFilter::AllStreams).unwrap();
    a.begin_allocate_to_pool(p2, PoolFilter::AllStreams).unwrap();
    let x = a.malloc(6 * MIB, S0).unwrap();
    assert_eq!(pool_of(&a, x.address()), p2);
    a.end_allocate_to_pool(p2).unwrap();
    let y = a.malloc(6 * MIB, S0).unwrap();
    assert_eq!(pool_of(&a, y.address()), p1);
    a.end_allocate_to_pool(p1).unwrap();

    let capture = StreamId(0x77);
    a.begin_allocate_to_pool(graph, PoolFilter::Stream(capture)).unwrap();
    let on_capture = a.malloc(MIB, capture).unwrap();
    let elsewhere = a.malloc(MIB, S0).unwrap();
    assert_eq!(pool_of(&a, on_capture.address()), graph);
    assert_eq!(pool_of(&a, elsewhere.address()), PoolId::DEFAULT);
    // A capture must not synchronize: empty_cache leaves the default pools alone meanwhile.
    a.free(elsewhere).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().num_sync_all_streams, 0);
    assert_eq!(pool_of(&a, elsewhere.address()), PoolId::DEFAULT, "kept while the capture runs");
    a.end_allocate_to_pool(graph).unwrap();
    a.check_consistency().unwrap();
}

/// Misuse is an error naming the pool, and changes nothing.
#[test]
fn pool_calls_out_of_order_are_errors_that_change_nothing() {
    let mut a = allocator("", 80 << 30);
    let pool = PoolId(0, 1);
    let is = |r: Result<(), AllocatorError>, want: PoolError| match r {
        Err(AllocatorError::Pool(e)) => assert_eq!(e, want),
        other => panic!("expected {want:?}, got {other:?}"),
    };
    is(a.release_pool(pool), PoolError::Unknown(pool));
    is(a.end_allocate_to_pool(pool), PoolError::NotRouting(pool));
    is(a.create_pool(PoolId::DEFAULT), PoolError::Default);
    a.begin_allocate_to_pool(pool, PoolFilter::AllStreams).unwrap();
    is(a.begin_allocate_to_pool(pool, PoolFilter::AllStreams), PoolError::AlreadyRouting(pool));
    a.end_allocate_to_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    is(a.release_pool(pool), PoolError::AlreadyReleased(pool));
    is(a.create_pool(pool), PoolError::AlreadyReleased(pool));
    assert_eq!(a.private_pools(), [(pool, 0)]);
    a.check_consistency().unwrap();
    let message = a.release_pool(pool).unwrap_err().to_string();
    assert_eq!(message, "pool (0, 1) was already released by every user");
}

/// The OOM message counts free blocks of private pools as PyTorch does ("with N allocated in
/// private pools (e.g., CUDA Graphs)").
#[test]
fn the_oom_message_names_the_free_bytes_of_private_pools() {
    let mut a = allocator("", 256 * MIB);
    let pool = PoolId(0, 1);
    a.begin_allocate_to_pool(pool, PoolFilter::AllStreams).unwrap();
    let x = a.malloc(100 * MIB, S0).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    a.free(x).unwrap();
    let AllocatorError::OutOfMemory(oom) = a.malloc(200 * MIB, S0).unwrap_err() else { panic!("not an OOM") };
    assert!(
        oom.message.contains(
            "Of the allocated memory 100.00 MiB is allocated by PyTorch, with 100.00 MiB allocated in private pools \
             (e.g., CUDA Graphs), and 0 bytes is reserved by PyTorch but unallocated."
        ),
        "{}",
        oom.message
    );
    a.check_consistency().unwrap();
}

// ---- the property test ----

const STREAMS: [StreamId; 3] = [StreamId(0), StreamId(0x5000), StreamId(0x9000)];
const POOLS: [PoolId; 3] = [PoolId(0, 1), PoolId(0, 2), PoolId(1, 0)];

#[derive(Clone, Debug)]
enum Op {
    Malloc {
        size: u64,
        stream: usize,
    },
    Free {
        pick: usize,
    },
    RecordStream {
        pick: usize,
        stream: usize,
    },
    FinishStream {
        stream: usize,
    },
    EmptyCache,
    CreatePool {
        pool: usize,
    },
    /// `stream` of `None`: every stream (`use_mem_pool`).
    Begin {
        pool: usize,
        stream: Option<usize>,
    },
    End {
        pool: usize,
    },
    Release {
        pool: usize,
    },
    EmptyPoolCache {
        pool: usize,
    },
    ResetPeak,
    ResetAccumulated,
}

fn op() -> impl Strategy<Value = Op> {
    let size = (0u32..=25, any::<u64>()).prop_map(|(bits, r)| (1u64 << bits) + r % (1u64 << bits));
    prop_oneof![
        40 => (size, 0..STREAMS.len()).prop_map(|(size, stream)| Op::Malloc { size, stream }),
        30 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        3 => (any::<usize>(), 0..STREAMS.len()).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        3 => (0..STREAMS.len()).prop_map(|stream| Op::FinishStream { stream }),
        2 => Just(Op::EmptyCache),
        3 => (0..POOLS.len()).prop_map(|pool| Op::CreatePool { pool }),
        4 => (0..POOLS.len(), prop::option::of(0..STREAMS.len())).prop_map(|(pool, stream)| Op::Begin { pool, stream }),
        4 => (0..POOLS.len()).prop_map(|pool| Op::End { pool }),
        4 => (0..POOLS.len()).prop_map(|pool| Op::Release { pool }),
        2 => (0..POOLS.len()).prop_map(|pool| Op::EmptyPoolCache { pool }),
        2 => Just(Op::ResetPeak),
        2 => Just(Op::ResetAccumulated),
    ]
}

const CONFIGS: [&str; 3] = ["", "expandable_segments:True", "max_split_size_mb:24,roundup_power2_divisions:4"];

fn run(settings: &str, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut a = allocator(settings, 256 * MIB);
    let mut live: Vec<Allocation> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        // The pool the next request of each stream must come from: the last routed that accepts it.
        let expected_pool = |a: &CachingAllocator<SimBackend>, stream: StreamId| {
            a.routed_pools()
                .iter()
                .rev()
                .find(|(_, f)| *f == PoolFilter::AllStreams || *f == PoolFilter::Stream(stream))
                .map_or(PoolId::DEFAULT, |(id, _)| *id)
        };
        let before = a.private_pools();
        let result = match *op {
            Op::Malloc { size, stream } => {
                let want = expected_pool(&a, STREAMS[stream]);
                match a.malloc(size, STREAMS[stream]) {
                    Ok(x) => {
                        let got = pool_of(&a, x.address());
                        prop_assert_eq!(got, want, "step {}: served from the wrong pool", step);
                        live.push(x);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Op::Free { pick } if !live.is_empty() => a.free(live.swap_remove(pick % live.len())),
            Op::RecordStream { pick, stream } if !live.is_empty() => {
                a.record_stream(&live[pick % live.len()], STREAMS[stream])
            }
            Op::FinishStream { stream } => {
                a.backend_mut().finish_stream(STREAMS[stream]);
                Ok(())
            }
            Op::EmptyCache => a.empty_cache(),
            Op::CreatePool { pool } => a.create_pool(POOLS[pool]),
            Op::Begin { pool, stream } => {
                let filter = stream.map_or(PoolFilter::AllStreams, |s| PoolFilter::Stream(STREAMS[s]));
                a.begin_allocate_to_pool(POOLS[pool], filter)
            }
            Op::End { pool } => a.end_allocate_to_pool(POOLS[pool]),
            Op::Release { pool } => a.release_pool(POOLS[pool]),
            Op::EmptyPoolCache { pool } => a.empty_pool_cache(POOLS[pool]),
            Op::ResetPeak => {
                a.reset_peak_stats();
                Ok(())
            }
            Op::ResetAccumulated => {
                a.reset_accumulated_stats();
                Ok(())
            }
            _ => Ok(()),
        };
        match result {
            Ok(()) | Err(AllocatorError::OutOfMemory(_)) => {}
            Err(AllocatorError::Pool(_)) => {
                prop_assert_eq!(a.private_pools(), before, "step {}: a refused pool call changed the pools", step)
            }
            Err(other) => return Err(TestCaseError::fail(format!("step {step} ({op:?}): {other}"))),
        }
        if let Err(violation) = a.check_consistency() {
            return Err(TestCaseError::fail(format!("config {settings:?}, step {step} ({op:?}): {violation}")));
        }
        prop_assert_eq!(a.memory_reserved(), a.backend().used(), "reserved bytes equal device bytes");
        let allocated: u64 = live.iter().map(|x| x.size()).sum();
        prop_assert_eq!(a.memory_allocated(), allocated);
    }
    // Everything freed, every scope ended, every pool released: empty_cache empties the device
    // and drops every pool.
    for x in live {
        a.free(x).unwrap();
    }
    for s in STREAMS {
        a.backend_mut().finish_stream(s);
    }
    for (id, _) in a.routed_pools() {
        a.end_allocate_to_pool(id).unwrap();
    }
    for (id, users) in a.private_pools() {
        for _ in 0..users {
            a.release_pool(id).unwrap();
        }
    }
    a.empty_cache().unwrap();
    a.check_consistency().map_err(TestCaseError::fail)?;
    prop_assert!(
        a.private_pools().is_empty(),
        "config {:?}: pools left: {:?}, segments {:?}",
        settings,
        a.private_pools(),
        a.snapshot()
    );
    prop_assert_eq!(a.memory_reserved(), 0);
    prop_assert_eq!(a.backend().used(), 0);
    Ok(())
}

proptest! {
    // 24 cases x 3 configurations x 1,200 operations = 86,400 operations, each followed by the
    // full consistency check (about 10 s in a debug build on two cores).
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn pool_invariants_hold_after_every_operation(ops in prop::collection::vec(op(), 1_200)) {
        for settings in CONFIGS {
            run(settings, &ops)?;
        }
    }
}

/// A pool routed with [`PoolFilter::Caller`] serves exactly the requests its caller names it for
/// (PyTorch's own filters, asked by the plug-in before each request), and another routed pool's
/// filter is still asked where the caller names none.
#[test]
fn a_caller_filter_routes_the_requests_its_caller_names() {
    let mut a = allocator("", 80 << 30);
    let (graph, mem_pool) = (PoolId(1, 0), PoolId(0, 1));
    a.begin_allocate_to_pool(mem_pool, PoolFilter::Stream(StreamId(7))).unwrap();
    a.begin_allocate_to_pool(graph, PoolFilter::Caller).unwrap();
    a.set_caller_route(Some(graph));
    let captured = a.malloc(MIB, S0).unwrap();
    a.set_caller_route(None);
    let outside = a.malloc(MIB, S0).unwrap();
    let on_seven = a.malloc(MIB, StreamId(7)).unwrap();
    assert_eq!(pool_of(&a, captured.address()), graph);
    assert_eq!(pool_of(&a, outside.address()), PoolId::DEFAULT);
    assert_eq!(pool_of(&a, on_seven.address()), mem_pool);
    assert_eq!(a.pool_live_allocations(graph), Some(vec![captured.address()]));
    assert_eq!(a.pool_live_allocations(PoolId(5, 5)), None);
    a.free(captured).unwrap();
    assert_eq!(a.pool_live_allocations(graph), Some(vec![]));
    a.check_consistency().unwrap();
}

/// A block used on another stream and freed while a pool is routed to (a graph capture) records
/// its events only once no pool is routed to, as PyTorch defers them
/// (`needs_events_deferred_until_no_capture`): meanwhile it is pending, not reusable, and no
/// event exists to be queried.
#[test]
fn frees_during_a_capture_record_their_events_after_it() {
    let mut a = allocator("", 80 << 30);
    let side = StreamId(9);
    let graph = PoolId(1, 0);
    a.begin_allocate_to_pool(graph, PoolFilter::AllStreams).unwrap();
    let x = a.malloc(MIB, S0).unwrap();
    a.record_stream(&x, side).unwrap();
    a.backend_mut().hold_stream(side);
    a.free(x).unwrap();
    let stats = a.stats();
    assert_eq!(stats.allocated_bytes.all().current, 0);
    assert_eq!(stats.active_bytes.all().current, MIB as i64, "pending, not yet free");
    a.check_consistency().unwrap();
    let y = a.malloc(MIB, S0).unwrap();
    assert_ne!(y.address(), x.address(), "a deferred free is not reused inside the capture");
    a.end_allocate_to_pool(graph).unwrap();
    // The events are recorded now, on a stream still busy: the block still waits.
    a.process_events().unwrap();
    assert_eq!(a.stats().active_bytes.all().current, 2 * MIB as i64);
    a.check_consistency().unwrap();
    a.backend_mut().finish_stream(side);
    a.process_events().unwrap();
    assert_eq!(a.stats().active_bytes.all().current, MIB as i64, "its free completed");
    a.check_consistency().unwrap();
}
