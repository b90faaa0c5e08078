//! `releases_of_malloc` and `reservations_of_failing_malloc` read off the state what a malloc
//! would do (how many segments it releases, how many VA reservations a failing one makes), so
//! that a replay need not try it on a copy. Here each answer is checked against the malloc
//! itself, made on a copy, at every malloc of random workloads over the configurations whose
//! steps it plans: the garbage collector, the oversize and the full release of the retry chain,
//! expandable segments, `policy:cachalot` (its return of cached memory before a new peak, and
//! with `max_split_size_mb` the room that return may open in a free block of the request's own
//! stream), on devices small enough to refuse.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use cachalot_core::size::PoolKind;
use cachalot_core::{
    AllocatorConfig, AllocatorError, BlockState, CachingAllocator, PoolFilter, PoolId, SimBackend, StreamId,
    TraceAction,
};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// One step of a workload: a malloc of `size` on stream `stream % 3`, a free of the live
/// allocation `pick % live` (after its use on a busy side stream, with `deferred`, so that the
/// free waits for it), the side stream's work finishing, `empty_cache`, a call on one of two
/// private pools, or expandable segments switched on or off at run time.
#[derive(Clone, Debug)]
enum Op {
    Malloc { size: u64, stream: u64 },
    Free { pick: usize, deferred: bool },
    FinishSideStream,
    EmptyCache,
    Pool { pool: u64, call: PoolCall },
    SetExpandable(bool),
}

/// A private-pool call of [`Op::Pool`] (one that the pool's state refuses changes nothing).
#[derive(Clone, Copy, Debug)]
enum PoolCall {
    /// `MemPool()`.
    Create,
    /// `use_mem_pool` entering (every stream) or a capture beginning on stream `0x100 + n`.
    Route(Option<u64>),
    /// `use_mem_pool` leaving, or a capture ending.
    Unroute,
    /// One user gone.
    Release,
    /// `empty_cache` of the pool.
    EmptyCache,
}

/// [`op`], with private pools and expandable segments switched at run time.
fn pool_op() -> impl Strategy<Value = Op> {
    let call = prop_oneof![
        Just(PoolCall::Create),
        prop::option::of(0u64..3).prop_map(PoolCall::Route),
        Just(PoolCall::Unroute),
        Just(PoolCall::Release),
        Just(PoolCall::EmptyCache),
    ];
    prop_oneof![
        8 => op(),
        2 => (0u64..2, call).prop_map(|(pool, call)| Op::Pool { pool, call }),
        1 => any::<bool>().prop_map(Op::SetExpandable),
    ]
}

/// The stream whose work a deferred free waits for.
const SIDE: StreamId = StreamId(0x900);

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop_oneof![1u64..(1 << 20), (1u64 << 20)..(12 << 20), (12u64 << 20)..(160 << 20)], 0u64..3)
            .prop_map(|(size, stream)| Op::Malloc { size, stream }),
        // Larger than some devices, or than the VA an expandable segment reserves on them.
        1 => ((400u64 << 20)..(1200 << 20), 0u64..3).prop_map(|(size, stream)| Op::Malloc { size, stream }),
        3 => (any::<usize>(), prop::bool::weighted(0.2)).prop_map(|(pick, deferred)| Op::Free { pick, deferred }),
        1 => Just(Op::FinishSideStream),
        1 => Just(Op::EmptyCache),
    ]
}

/// Steps that leave holes in expandable segments: large blocks on one stream, freed, their pages
/// unmapped by `empty_cache` while their neighbours stay, so that a later request grows a free
/// block over several unmapped ones (pages mapped in more than one piece).
fn hole_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (16u64 << 20..30 << 20).prop_map(|size| Op::Malloc { size, stream: 0 }),
        // Larger than a hole and the free block beside it.
        1 => (60u64 << 20..200 << 20).prop_map(|size| Op::Malloc { size, stream: 0 }),
        3 => (any::<usize>(), prop::bool::weighted(0.2)).prop_map(|(pick, deferred)| Op::Free { pick, deferred }),
        1 => Just(Op::FinishSideStream),
        1 => Just(Op::EmptyCache),
    ]
}

/// Steps that make `policy:cachalot` under `max_split_size_mb` give back pages from a free block
/// of the request's own stream large enough for it: blocks above `max_split_size` made and freed
/// on one stream between live ones, requests below it on that stream (which best fit passes
/// over the oversize free blocks), at a peak kept by freeing rather than emptying the cache;
/// another stream's blocks for rule 4 to weigh against them, and requests near the device's
/// size for refusals.
fn corner_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop_oneof![(1u64 << 20)..(20 << 20), 1u64..(1 << 20)], prop::sample::select(&[0u64, 0, 0, 1][..]))
            .prop_map(|(size, stream)| Op::Malloc { size, stream }),
        3 => ((20u64 << 20)..(100 << 20)).prop_map(|size| Op::Malloc { size, stream: 0 }),
        1 => ((200u64 << 20)..(420 << 20), 0u64..2).prop_map(|(size, stream)| Op::Malloc { size, stream }),
        4 => (any::<usize>(), prop::bool::weighted(0.1)).prop_map(|(pick, deferred)| Op::Free { pick, deferred }),
        1 => Just(Op::FinishSideStream),
        1 => prop::bool::weighted(0.3).prop_map(|empty| if empty { Op::EmptyCache } else { Op::FinishSideStream }),
    ]
}

/// The configurations of [`CONFIGS`] with expandable segments.
const EXPANDABLE: [usize; 2] = [4, 5];

/// The configurations of [`CONFIGS`] where `policy:cachalot` meets `max_split_size_mb`.
const CORNER: [usize; 3] = [8, 9, 10];

/// Settings, memory fraction and device size of the configurations checked.
const CONFIGS: [(&str, Option<f64>, u64); 11] = [
    ("", None, 512 * MIB),
    ("garbage_collection_threshold:0.5", Some(0.6), 1024 * MIB),
    ("max_split_size_mb:20", None, 400 * MIB),
    ("max_split_size_mb:20,garbage_collection_threshold:0.4", Some(0.5), 800 * MIB),
    ("expandable_segments:True", None, 512 * MIB),
    ("expandable_segments:True,garbage_collection_threshold:0.5", Some(0.7), 512 * MIB),
    ("policy:cachalot", None, 512 * MIB),
    ("policy:cachalot,garbage_collection_threshold:0.5", Some(0.7), 1024 * MIB),
    ("policy:cachalot,max_split_size_mb:20", Some(0.9), 512 * MIB),
    ("policy:cachalot,max_split_size_mb:20,expandable_segments:True", None, 512 * MIB),
    ("policy:cachalot,max_split_size_mb:40,expandable_segments:True", Some(0.8), 384 * MIB),
];

/// How often a workload reached the shapes the plan once left to a trial, and how often the
/// plan answered there (and was then checked against the malloc).
#[derive(Clone, Copy, Debug, Default)]
struct Reached {
    /// A malloc whose full release (it synchronizes) found cross-stream frees outstanding.
    pending_full_release: usize,
    /// ... where `releases_of_malloc` answered.
    pending_full_release_planned: usize,
    /// A malloc that ran out of memory with cross-stream frees outstanding.
    pending_oom: usize,
    /// ... where `reservations_of_failing_malloc` answered.
    pending_oom_planned: usize,
    /// A malloc that mapped expandable pages in more than one piece.
    pieces: usize,
    /// ... where `releases_of_malloc` answered.
    pieces_planned: usize,
    /// A malloc whose device allocation mapped pages before the device refused the rest, and
    /// whose full release then ran.
    partly: usize,
    /// ... where `releases_of_malloc` answered.
    partly_planned: usize,
    /// A `policy:cachalot` miss that gave cached memory back and was still refused (then ran
    /// its full release).
    gave_back_refused: usize,
    /// ... where `releases_of_malloc` answered.
    gave_back_refused_planned: usize,
    /// A `policy:cachalot` miss that gave cached memory back and failed.
    gave_back_oom: usize,
    /// ... where `reservations_of_failing_malloc` answered.
    gave_back_oom_planned: usize,
    /// A malloc that released memory or failed while private pools existed, none routed to.
    private: usize,
    /// ... where `releases_of_malloc` answered.
    private_planned: usize,
    /// A malloc that released memory or failed while allocations were routed to a pool.
    routed: usize,
    /// ... where `releases_of_malloc` answered.
    routed_planned: usize,
    /// A malloc that failed while private pools existed, with expandable segments.
    private_oom: usize,
    /// ... where `reservations_of_failing_malloc` answered.
    private_oom_planned: usize,
    /// A `policy:cachalot` miss that gave back pages of a free block of its own stream and pool
    /// large enough for it (passed over by best fit under `max_split_size_mb`), whose run
    /// `find_expandable_block` may then take. (Such a miss hardly ever fails: the block it gave
    /// back from holds the request, so the full release leaves the device room for it; none
    /// failed in these workloads, so its reservations are checked where other mallocs fail.)
    corner: usize,
    /// ... where `releases_of_malloc` answered.
    corner_planned: usize,
    /// ... and the malloc was served in what was left of that block.
    corner_grown: usize,
    /// ... where `releases_of_malloc` answered.
    corner_grown_planned: usize,
    /// A malloc that released memory before any full release and was then served with nothing
    /// allocated or mapped (`policy:cachalot`'s give-backs leaving the request room in the
    /// pages they kept; the garbage collector or the oversize release before mapped memory
    /// best fit passed over), which `releases_of_malloc_served_in_place` answered.
    served_in_place: usize,
}

impl std::ops::AddAssign for Reached {
    fn add_assign(&mut self, other: Self) {
        self.pending_full_release += other.pending_full_release;
        self.pending_full_release_planned += other.pending_full_release_planned;
        self.pending_oom += other.pending_oom;
        self.pending_oom_planned += other.pending_oom_planned;
        self.pieces += other.pieces;
        self.pieces_planned += other.pieces_planned;
        self.partly += other.partly;
        self.partly_planned += other.partly_planned;
        self.gave_back_refused += other.gave_back_refused;
        self.gave_back_refused_planned += other.gave_back_refused_planned;
        self.gave_back_oom += other.gave_back_oom;
        self.gave_back_oom_planned += other.gave_back_oom_planned;
        self.private += other.private;
        self.private_planned += other.private_planned;
        self.routed += other.routed;
        self.routed_planned += other.routed_planned;
        self.private_oom += other.private_oom;
        self.private_oom_planned += other.private_oom_planned;
        self.corner += other.corner;
        self.corner_planned += other.corner_planned;
        self.corner_grown += other.corner_grown;
        self.corner_grown_planned += other.corner_grown_planned;
        self.served_in_place += other.served_in_place;
    }
}

fn check(config: usize, ops: &[Op]) -> Result<Reached, TestCaseError> {
    let mut reached = Reached::default();
    let (settings, fraction, total) = CONFIGS[config];
    let mut allocator =
        CachingAllocator::new(SimBackend::new(total), AllocatorConfig::parse(settings).unwrap()).unwrap();
    if let Some(fraction) = fraction {
        allocator.set_memory_fraction(fraction).unwrap();
    }
    // The history shows what each malloc mapped and released, in order.
    allocator.record_history(true, usize::MAX, &[], false);
    let mut live = Vec::new();
    for (n, op) in ops.iter().enumerate() {
        match *op {
            Op::Malloc { size, stream } => {
                let stream = StreamId(0x100 + stream);
                let routed = !allocator.routed_pools().is_empty();
                let private = !allocator.private_pools().is_empty();
                // As a replay does before asking: the malloc's own first step (none while
                // allocations are routed to a pool).
                if !routed {
                    allocator.process_events().unwrap();
                }
                let free = total - allocator.backend().used();
                let releases = allocator.releases_of_malloc(size, stream, free);
                // With room for anything, a miss releases only what rule 4 gives back (the
                // collector takes no pages, and under the policy every segment is pages).
                let gives_back = settings.starts_with("policy:cachalot")
                    && allocator.releases_of_malloc(size, stream, u64::MAX / 4).is_some_and(|n| n > 0);
                let reservations = allocator.reservations_of_failing_malloc(size, stream);
                let in_place = allocator.releases_of_malloc_served_in_place(size, stream, free);
                let stats = allocator.stats();
                let retries_before = stats.num_alloc_retries;
                // Blocks freed but waiting for events are active without being allocated.
                let pending = stats.active.all().current > stats.allocation.all().current;
                let (released_before, reserved_before, synced_before, mapped_before) = (
                    stats.num_device_free,
                    allocator.backend().reservations_made(),
                    stats.num_sync_all_streams,
                    stats.num_device_alloc,
                );
                // Where the corner can be: the free block of the request's own stream and pool, large
                // enough for it, that rule 4 gives back pages from.
                let corner = match settings.contains("max_split_size_mb") && settings.contains("policy:cachalot") {
                    true => block_given_back_that_holds(&allocator, size, stream),
                    false => None,
                };
                let entries_before = allocator.trace_len_total();
                let result = allocator.malloc(size, stream);
                // Pages mapped, then unmapped by the full release: a refused piece left them.
                let entries = allocator.trace_since(entries_before);
                let first_map = entries.iter().position(|e| e.action == TraceAction::SegmentMap);
                if first_map.is_some_and(|at| entries[at..].iter().any(|e| e.action == TraceAction::SegmentUnmap)) {
                    reached.partly += 1;
                    reached.partly_planned += usize::from(releases.is_some());
                }
                // Pages mapped in two pieces or more (in one device allocation, or in those of
                // the retry chain).
                if allocator.stats().num_device_alloc >= mapped_before + 2 && settings.contains("expandable") {
                    reached.pieces += 1;
                    reached.pieces_planned += usize::from(releases.is_some());
                }
                if let Some(block) = corner {
                    reached.corner += 1;
                    reached.corner_planned += usize::from(releases.is_some());
                    if let Ok(allocation) = &result
                        && block.0 <= allocation.address()
                        && allocation.address() < block.1
                    {
                        reached.corner_grown += 1;
                        reached.corner_grown_planned += usize::from(releases.is_some());
                    }
                }
                let released = allocator.stats().num_device_free - released_before;
                if let Some(planned) = releases {
                    prop_assert_eq!(planned, released, "{}: op {} ({:?}) released", settings, n, op);
                }
                // Served with nothing allocated or mapped after releasing: exactly where the plan
                // says so, with the releases it says.
                // (A hit, or a miss the pages already mapped serve, may be answered either way
                // when it releases nothing; a replay only asks after releases.)
                let served_in_place = result.is_ok() && allocator.stats().num_device_alloc == mapped_before;
                if let Some(planned) = in_place {
                    prop_assert!(served_in_place, "{}: op {} ({:?}) planned in place", settings, n, op);
                    prop_assert_eq!(planned, released, "{}: op {} ({:?}) released in place", settings, n, op);
                }
                // Not after the full release (the only retry counted in `num_alloc_retries`):
                // its synchronization can complete a free whose block the retry then takes,
                // under either policy, which the planner leaves out.
                let retried = allocator.stats().num_alloc_retries > retries_before;
                if served_in_place && released > 0 && !retried {
                    prop_assert_eq!(in_place, Some(released), "{}: op {} ({:?}) served in place", settings, n, op);
                    reached.served_in_place += 1;
                }
                if released > 0 || result.is_err() {
                    let (count, planned) = match routed {
                        true => (&mut reached.routed, &mut reached.routed_planned),
                        false => (&mut reached.private, &mut reached.private_planned),
                    };
                    if private {
                        *count += 1;
                        *planned += usize::from(releases.is_some());
                    }
                }
                if result.is_err() && private && allocator.config().expandable_segments() {
                    reached.private_oom += 1;
                    reached.private_oom_planned += usize::from(reservations.is_some());
                }
                if gives_back && allocator.stats().num_sync_all_streams > synced_before {
                    reached.gave_back_refused += 1;
                    reached.gave_back_refused_planned += usize::from(releases.is_some());
                }
                if pending && allocator.stats().num_sync_all_streams > synced_before {
                    reached.pending_full_release += 1;
                    reached.pending_full_release_planned += usize::from(releases.is_some());
                }
                match result {
                    Ok(allocation) => live.push(allocation),
                    Err(AllocatorError::OutOfMemory(_)) => {
                        let made = allocator.backend().reservations_made() - reserved_before;
                        if let Some(planned) = reservations {
                            prop_assert_eq!(planned, made, "{}: op {} ({:?}) reserved", settings, n, op);
                        }
                        if gives_back {
                            reached.gave_back_oom += 1;
                            reached.gave_back_oom_planned += usize::from(reservations.is_some());
                        }
                        if pending {
                            reached.pending_oom += 1;
                            reached.pending_oom_planned += usize::from(reservations.is_some());
                        }
                    }
                    Err(other) => return Err(TestCaseError::fail(format!("{settings}: op {n}: {other}"))),
                }
            }
            Op::Free { pick, deferred } => {
                if !live.is_empty() {
                    let allocation = live.swap_remove(pick % live.len());
                    if deferred {
                        allocator.backend_mut().hold_stream(SIDE);
                        allocator.record_stream(&allocation, SIDE).unwrap();
                    }
                    allocator.free(allocation).unwrap();
                }
            }
            Op::FinishSideStream => allocator.backend_mut().finish_stream(SIDE),
            Op::EmptyCache => allocator.empty_cache().unwrap(),
            Op::Pool { pool, call } => {
                let id = PoolId(0, 1 + pool);
                // A call the pool's state refuses (already routed, released, unknown) changes
                // nothing.
                let _ = match call {
                    PoolCall::Create => allocator.create_pool(id),
                    PoolCall::Route(stream) => allocator.begin_allocate_to_pool(
                        id,
                        stream.map_or(PoolFilter::AllStreams, |s| PoolFilter::Stream(StreamId(0x100 + s))),
                    ),
                    PoolCall::Unroute => allocator.end_allocate_to_pool(id),
                    PoolCall::Release => allocator.release_pool(id),
                    PoolCall::EmptyCache => allocator.empty_pool_cache(id),
                };
            }
            Op::SetExpandable(on) => {
                let settings = format!("{settings},expandable_segments:{}", if on { "True" } else { "False" });
                allocator.set_config(AllocatorConfig::parse(settings.trim_start_matches(',')).unwrap()).unwrap();
            }
        }
    }
    Ok(reached)
}

/// The free block (first and end address) of the default pools that a `policy:cachalot`
/// malloc of `size` bytes on `stream` would give pages back from before its miss (rule 4), if
/// it is one of the request's own stream and pool at least as large as the request (which best
/// fit passed over only under `max_split_size_mb`). Told by the malloc itself, made on a copy
/// whose device and fraction refuse nothing: rule 4's give-backs are then all the pages it
/// unmaps (a refusal's full release unmaps pages too).
fn block_given_back_that_holds(
    allocator: &CachingAllocator<SimBackend>,
    size: u64,
    stream: StreamId,
) -> Option<(u64, u64)> {
    let rounded = size.div_ceil(512) * 512;
    if !allocator.routed_pools().is_empty() {
        return None;
    }
    let blocks: Vec<(u64, u64)> = allocator
        .snapshot()
        .iter()
        .filter(|s| s.stream == stream && s.pool == PoolKind::for_size(rounded) && s.pool_id == PoolId::DEFAULT)
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::Inactive && b.size >= rounded)
        .map(|b| (b.address, b.address + b.size))
        .collect();
    if blocks.is_empty() {
        return None;
    }
    let mut copy = allocator.trial_copy(allocator.backend().trial_copy());
    copy.backend_mut().set_free_memory_override(Some(1 << 50));
    copy.set_memory_fraction(1.0).unwrap();
    copy.record_history(true, usize::MAX, &[], false);
    let synced = copy.stats().num_sync_all_streams;
    // A request larger than a reservation fails on any device.
    if copy.malloc(size, stream).is_err() || copy.stats().num_sync_all_streams > synced {
        return None;
    }
    let unmaps: Vec<u64> =
        copy.trace_since(0).iter().filter(|e| e.action == TraceAction::SegmentUnmap).map(|e| e.addr).collect();
    blocks.into_iter().find(|&(begin, end)| unmaps.iter().any(|&at| begin <= at && at < end))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn the_planned_releases_and_reservations_are_the_mallocs(
        config in 0..CONFIGS.len(),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        check(config, &ops)?;
    }

    #[test]
    fn the_planned_releases_and_reservations_are_the_mallocs_with_private_pools(
        config in 0..CONFIGS.len(),
        ops in prop::collection::vec(pool_op(), 1..160),
    ) {
        check(config, &ops)?;
    }

    #[test]
    fn the_planned_releases_are_the_mallocs_among_holes_in_pages(
        config in prop::sample::select(&EXPANDABLE[..]),
        ops in prop::collection::vec(hole_op(), 1..200),
    ) {
        check(config, &ops)?;
    }

    #[test]
    fn the_planned_releases_are_the_mallocs_where_a_give_back_opens_room(
        config in prop::sample::select(&CORNER[..]),
        ops in prop::collection::vec(corner_op(), 1..160),
    ) {
        check(config, &ops)?;
    }
}

/// The random workloads reach the shapes the plan once declined, and the plan answers there, so
/// the property above compares it with the malloc in them (a change of the workloads that no
/// longer reaches one fails here).
#[test]
fn the_workloads_reach_the_shapes_once_tried_on_a_copy() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut reached = Reached::default();
    for _ in 0..300 {
        let (config, ops) =
            (0..CONFIGS.len(), prop::collection::vec(op(), 1..120)).new_tree(&mut runner).unwrap().current();
        reached += check(config, &ops).unwrap();
        let (config, ops) = (prop::sample::select(&EXPANDABLE[..]), prop::collection::vec(hole_op(), 1..200))
            .new_tree(&mut runner)
            .unwrap()
            .current();
        reached += check(config, &ops).unwrap();
        let (config, ops) =
            (0..CONFIGS.len(), prop::collection::vec(pool_op(), 1..160)).new_tree(&mut runner).unwrap().current();
        reached += check(config, &ops).unwrap();
        let (config, ops) = (prop::sample::select(&CORNER[..]), prop::collection::vec(corner_op(), 1..160))
            .new_tree(&mut runner)
            .unwrap()
            .current();
        reached += check(config, &ops).unwrap();
    }
    println!("{reached:?}");
    assert!(reached.pending_full_release_planned > 0, "{reached:?}");
    assert!(reached.pending_oom_planned > 0, "{reached:?}");
    assert!(reached.pieces_planned > 0, "{reached:?}");
    assert!(reached.partly_planned > 0, "{reached:?}");
    assert!(reached.gave_back_refused_planned > 0, "{reached:?}");
    assert!(reached.gave_back_oom_planned > 0, "{reached:?}");
    assert!(reached.private_planned > 0, "{reached:?}");
    assert!(reached.routed_planned > 0, "{reached:?}");
    assert!(reached.private_oom_planned > 0, "{reached:?}");
    assert!(reached.corner_planned > 0, "{reached:?}");
    assert!(reached.corner_grown_planned > 0, "{reached:?}");
    assert!(reached.served_in_place > 0, "{reached:?}");
}

/// The plan answers for the shapes it was made for, rather than leaving them to a trial.
#[test]
fn the_plan_answers_without_a_trial() {
    let mut allocator = CachingAllocator::new(
        SimBackend::new(80 << 30),
        AllocatorConfig::parse("garbage_collection_threshold:0.3").unwrap(),
    )
    .unwrap();
    allocator.set_memory_fraction((64 * MIB) as f64 / (80u64 << 30) as f64).unwrap();
    let kept = allocator.malloc(512, StreamId(1)).unwrap();
    let cached = allocator.malloc(24 * MIB, StreamId(1)).unwrap();
    allocator.free(cached).unwrap();
    let free = (80 << 30) - allocator.backend().used();
    // Another stream's 24 MiB: the collector releases the cached segment, then the device serves.
    assert_eq!(allocator.releases_of_malloc(24 * MIB, StreamId(2), free), Some(1));
    // The same stream's: a cache hit, nothing released.
    assert_eq!(allocator.releases_of_malloc(24 * MIB, StreamId(1), free), Some(0));
    assert_eq!(allocator.reservations_of_failing_malloc(24 * MIB, StreamId(2)), Some(0));
    allocator.free(kept).unwrap();
}

/// Under `policy:cachalot` a miss that would pass the peak gives back only the excess, from the
/// largest free blocks of any stream; the plan answers with the same walk, without a trial.
#[test]
fn the_plan_answers_policy_cachalot_without_a_trial() {
    let mut allocator =
        CachingAllocator::new(SimBackend::new(512 * MIB), AllocatorConfig::parse("policy:cachalot").unwrap()).unwrap();
    let _kept = allocator.malloc(8 * MIB, StreamId(4)).unwrap();
    let side = allocator.malloc(24 * MIB, StreamId(2)).unwrap();
    let other = allocator.malloc(16 * MIB, StreamId(3)).unwrap();
    allocator.free(side).unwrap();
    allocator.free(other).unwrap();
    let free = 512 * MIB - allocator.backend().used();
    // 48 MiB reserved, the peak, 40 of them cached on other streams. 8 MiB more takes 4 pages
    // from the largest free block (one unmap); 30 MiB all 12 of its pages and 3 of the next
    // block's; 60 MiB both blocks, and the peak then rises by the 20 MiB missing.
    for (size, releases) in [(8 * MIB, 1), (30 * MIB, 2), (60 * MIB, 2)] {
        assert_eq!(allocator.releases_of_malloc(size, StreamId(1), free), Some(releases), "{size}");
        let mut trial = allocator.trial_copy(allocator.backend().trial_copy());
        let released = trial.stats().num_device_free;
        trial.malloc(size, StreamId(1)).unwrap();
        assert_eq!(trial.stats().num_device_free - released, releases, "{size}");
        assert_eq!(trial.memory_reserved(), (48 * MIB).max(8 * MIB + size), "{size}");
    }
}

/// Under `policy:cachalot` a large-pool miss at the peak that a free run of the small pool's
/// pages holds is served there (rule 5): the plan releases nothing and reserves nothing, as
/// the malloc on a copy, which maps nothing either; a request the small pool cannot hold
/// (3 MiB) gives back its page and maps, as rule 4 has it, and the plan counts the release.
#[test]
fn the_plan_answers_a_large_request_served_by_the_small_pool_at_the_peak() {
    let total = 512 * MIB;
    let mut allocator =
        CachingAllocator::new(SimBackend::new(total), AllocatorConfig::parse("policy:cachalot").unwrap()).unwrap();
    let small: Vec<_> = (0..2).map(|_| allocator.malloc(MIB, StreamId::DEFAULT).unwrap()).collect();
    let _large = allocator.malloc(4 * MIB, StreamId::DEFAULT).unwrap();
    let _another = allocator.malloc(4 * MIB, StreamId(5)).unwrap();
    for freed in small {
        allocator.free(freed).unwrap();
    }
    let free = total - allocator.backend().used();
    for (size, releases, mapped) in [(3 * MIB / 2, 0, 0), (2 * MIB, 0, 0), (3 * MIB, 1, 1)] {
        assert_eq!(allocator.releases_of_malloc(size, StreamId::DEFAULT, free), Some(releases), "{size}");
        assert_eq!(allocator.reservations_of_failing_malloc(size, StreamId::DEFAULT), Some(0), "{size}");
        let mut trial = allocator.trial_copy(allocator.backend().trial_copy());
        let (allocs, frees) = (trial.stats().num_device_alloc, trial.stats().num_device_free);
        trial.malloc(size, StreamId::DEFAULT).unwrap();
        assert_eq!(trial.stats().num_device_free - frees, releases, "{size}");
        assert_eq!(trial.stats().num_device_alloc - allocs, mapped, "{size}");
        trial.check_consistency().unwrap();
    }
}

/// An oversize release that frees enough to retry, at a failing malloc: expandable segments
/// switched on at run time meet cached oversize segments from before, which only that release
/// returns. The retry searches again, where the reservation of the first step (if it made one)
/// has room; the plan counts that step too, as the malloc makes it.
#[test]
fn the_plan_answers_an_oversize_release_that_frees_enough_at_a_failure() {
    // The first device allocation (102 MiB beside 510) is refused by the device (120 MiB of
    // pages, 2 MiB free) after it reserved VA, which the retry finds; or, with a fraction of
    // about 511 MiB, by the fraction before it reserved, and the retry (102 beside 400) reserves.
    // Routed to a private pool, the chain ends there (no full release), so the retry's own
    // reservation is the last one made.
    for (fraction, routed) in [(None, false), (Some(0.999), false), (None, true), (Some(0.999), true)] {
        let mut allocator =
            CachingAllocator::new(SimBackend::new(512 * MIB), AllocatorConfig::parse("max_split_size_mb:20").unwrap())
                .unwrap();
        if routed {
            allocator.begin_allocate_to_pool(PoolId(0, 1), PoolFilter::AllStreams).unwrap();
        }
        let _kept = allocator.malloc(400 * MIB, StreamId(1)).unwrap();
        let cached =
            [allocator.malloc(60 * MIB, StreamId(1)).unwrap(), allocator.malloc(50 * MIB, StreamId(1)).unwrap()];
        for allocation in cached {
            allocator.free(allocation).unwrap();
        }
        if let Some(fraction) = fraction {
            allocator.set_memory_fraction(fraction).unwrap();
        }
        allocator.set_config(AllocatorConfig::parse("max_split_size_mb:20,expandable_segments:True").unwrap()).unwrap();
        assert_eq!(allocator.stats().oversize_segments.current, 3);
        let planned = allocator.reservations_of_failing_malloc(101 * MIB, StreamId(1));
        let before = allocator.backend().reservations_made();
        assert!(matches!(allocator.malloc(101 * MIB, StreamId(1)), Err(AllocatorError::OutOfMemory(_))));
        // Both cached oversize segments went back (60 MiB, then 50 MiB: 110 of the 101 asked).
        assert_eq!(allocator.stats().oversize_segments.current, 1);
        let case = format!("fraction {fraction:?}, routed {routed}");
        assert_eq!(planned, Some(allocator.backend().reservations_made() - before), "{case}");
        assert_eq!(planned, Some(1), "{case}");
    }
}

/// A device allocation that maps pages over a hole, then is refused the rest: the pages it
/// mapped join the free blocks on both sides into one, which the full release then unmaps at
/// once (one `segment_unmap` where the two free blocks alone would make two).
#[test]
fn the_plan_counts_the_pages_a_refused_allocation_left_mapped() {
    // 90 MiB: beside 60 mapped, room for the first piece (the 20 MiB hole) but not the second.
    let mut allocator =
        CachingAllocator::new(SimBackend::new(90 * MIB), AllocatorConfig::parse("expandable_segments:True").unwrap())
            .unwrap();
    let stream = StreamId(1);
    let _kept = allocator.malloc(20 * MIB, stream).unwrap();
    let [below, hole, above] = [0; 3].map(|_| allocator.malloc(20 * MIB, stream).unwrap());
    allocator.free(hole).unwrap();
    allocator.empty_cache().unwrap();
    allocator.free(below).unwrap();
    allocator.free(above).unwrap();
    // 20 MiB free, the hole, 20 MiB free, then unmapped pages: 100 MiB grows over the hole
    // (one piece) and on into the unmapped pages after (the second, refused).
    let free = 90 * MIB - allocator.backend().used();
    let planned = allocator.releases_of_malloc(100 * MIB, stream, free);
    let (released, mapped) = (allocator.stats().num_device_free, allocator.stats().num_device_alloc);
    assert!(matches!(allocator.malloc(100 * MIB, stream), Err(AllocatorError::OutOfMemory(_))));
    assert_eq!(allocator.stats().num_device_alloc - mapped, 1, "the hole was mapped, then the device refused");
    assert_eq!(planned, Some(allocator.stats().num_device_free - released));
    assert_eq!(planned, Some(1));
}

/// Under `policy:cachalot` with `max_split_size_mb`, a miss below `max_split_size` passes over an
/// oversize free block of its own stream (30 MiB between live blocks) and, at the peak, gives
/// back the top pages of that block first (rule 4: it is the largest free block, and outside
/// the run the miss planned to grow over, the stream's unmapped pages above). The block's pages
/// kept and the pages given back then make a run that `find_expandable_block` visits first, so
/// the miss grows there: with 10 MiB from the 20 MiB kept (mapping nothing), with 16 MiB by
/// mapping one page of the 16 given back (14 kept), with 19.5 MiB by mapping again 20 of the
/// 20 MiB of a block given back whole. The plan reads that off the blocks the give-backs leave
/// (the plan once left it to a trial).
#[test]
fn the_plan_answers_a_miss_that_grows_into_the_block_it_gave_back_from() {
    // The request, the oversize block, the pages the miss maps, the memory reserved after it.
    for (size, block, maps, reserved) in [
        (10 * MIB, 30 * MIB, 0, 28 * MIB),
        (16 * MIB, 30 * MIB, 2 * MIB, 24 * MIB),
        (19 * MIB + MIB / 2, 20 * MIB, 20 * MIB, 28 * MIB),
    ] {
        let config = AllocatorConfig::parse("policy:cachalot,max_split_size_mb:20,expandable_segments:True").unwrap();
        let mut allocator = CachingAllocator::new(SimBackend::new(512 * MIB), config).unwrap();
        let stream = StreamId(1);
        let _below = allocator.malloc(4 * MIB, stream).unwrap();
        let oversize = allocator.malloc(block, stream).unwrap();
        let _above = allocator.malloc(4 * MIB, stream).unwrap();
        let address = oversize.address();
        allocator.free(oversize).unwrap();
        let peak = allocator.memory_reserved();
        assert_eq!(allocator.stats().max_memory_reserved(), peak);
        let free = 512 * MIB - allocator.backend().used();
        let planned = allocator.releases_of_malloc(size, stream, free);
        let reservations = allocator.reservations_of_failing_malloc(size, stream);
        let mut trial = allocator.trial_copy(allocator.backend().trial_copy());
        let (released, mapped) = (trial.stats().num_device_free, trial.stats().num_device_alloc);
        let allocation = trial.malloc(size, stream).unwrap();
        assert_eq!(allocation.address(), address, "{size}: the miss grew into the block it gave back from");
        assert_eq!(trial.stats().num_device_free - released, 1, "{size}: one unmap");
        assert_eq!(trial.stats().num_device_alloc - mapped, u64::from(maps > 0), "{size}");
        assert_eq!(trial.memory_reserved(), reserved, "{size}");
        trial.check_consistency().unwrap();
        assert_eq!(planned, Some(1), "{size}");
        // The miss has room in the stream's reservation: no new one, were it to fail.
        assert_eq!(reservations, Some(0), "{size}");
    }
}
