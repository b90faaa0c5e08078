//! A private pool's checkpoint and its restore (CUDA-graph trees' `getCheckpointState` and
//! `setCheckpointPoolState`): after the restore the checkpointed segments have the
//! checkpoint's blocks, allocated where they were, the stats agree with a recount, the delta
//! names what the caller lost and gained, and a restore that cannot be made changes nothing.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use cachalot_core::{
    AllocatorConfig, AllocatorError, BlockState, CachingAllocator, PoolCheckpoint, PoolError, PoolFilter, PoolId,
    SimBackend, StreamId, TraceAction,
};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;
const POOL: PoolId = PoolId(1, 0);

fn allocator(settings: &str) -> CachingAllocator<SimBackend> {
    CachingAllocator::new(SimBackend::new(80 << 30), AllocatorConfig::parse(settings).unwrap()).unwrap()
}

/// A segment as (address, [(address, size, allocated)]).
type Layout = (u64, Vec<(u64, u64, bool)>);

/// The pool's segments, from the snapshot.
fn layout(a: &CachingAllocator<SimBackend>) -> Vec<Layout> {
    a.snapshot()
        .iter()
        .filter(|s| s.pool_id == POOL)
        .map(|s| {
            let blocks = s.blocks.iter().map(|b| (b.address, b.size, b.state == BlockState::ActiveAllocated)).collect();
            (s.address, blocks)
        })
        .collect()
}

/// A graph tree's first recording: a pool with small and large segments, some blocks freed.
fn recorded(a: &mut CachingAllocator<SimBackend>) -> Vec<cachalot_core::Allocation> {
    a.begin_allocate_to_pool(POOL, PoolFilter::AllStreams).unwrap();
    let sizes = [512, 4096, 700, 3 * MIB, 5 * MIB, 2 * MIB, 30 * MIB, 1000];
    let mut live: Vec<_> = sizes.iter().map(|&s| a.malloc(s, S0).unwrap()).collect();
    // Freed during the recording: holes in the small segment and in the 20 MiB one.
    for i in [6, 4, 1] {
        a.free(live.remove(i)).unwrap();
    }
    a.end_allocate_to_pool(POOL).unwrap();
    live
}

#[test]
fn a_restored_pool_has_the_checkpointed_blocks_and_consistent_stats() {
    let mut a = allocator("");
    a.create_pool(POOL).unwrap();
    let default_block = a.malloc(7 * MIB, S0).unwrap();
    let live = recorded(&mut a);
    let checkpoint = a.checkpoint_pool(POOL).unwrap();
    let at_checkpoint = layout(&a);
    assert_eq!(checkpoint.segments.len(), at_checkpoint.len());
    let allocated_at_checkpoint = a.memory_allocated();

    // Replays create tensors the allocator does not see; then the tree warms up or records
    // something else into the pool: the layout changes, and a new segment joins.
    for x in live.iter().take(3) {
        a.free(*x).unwrap();
    }
    a.begin_allocate_to_pool(POOL, PoolFilter::AllStreams).unwrap();
    let later: Vec<_> = [1536, 4 * MIB, 60 * MIB, 9 * MIB].iter().map(|&s| a.malloc(s, S0).unwrap()).collect();
    a.end_allocate_to_pool(POOL).unwrap();
    assert_ne!(layout(&a), at_checkpoint);
    let reserved = a.memory_reserved();
    let mut allocated_before: Vec<u64> = live[3..].iter().chain(&later).map(|x| x.address()).collect();
    allocated_before.sort_unstable();

    a.record_history(true, usize::MAX, &[], false);
    let delta = a.restore_pool(&checkpoint).unwrap();
    a.check_consistency().unwrap();

    // The pool's allocations then were freed, in address order.
    assert_eq!(delta.freed, allocated_before);
    // The checkpointed segments are as they were; the new one is one free block.
    let now = layout(&a);
    let (restored, new): (Vec<_>, Vec<_>) = now.into_iter().partition(|s| at_checkpoint.iter().any(|c| c.0 == s.0));
    assert_eq!(restored, at_checkpoint);
    assert_eq!(new.len(), 1);
    assert!(new[0].1.len() == 1 && !new[0].1[0].2, "a segment made after the checkpoint is left free");
    // The caller owns one allocation per block allocated at the checkpoint, in its order.
    let expected: Vec<(u64, u64)> = checkpoint
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter().filter(|b| b.allocated).map(|b| (b.ptr, b.size)))
        .collect();
    let owned: Vec<(u64, u64)> = delta.allocated.iter().map(|x| (x.address(), x.size())).collect();
    assert_eq!(owned, expected);
    assert!(delta.allocated.iter().all(|x| x.requested_size() == x.size()), "PyTorch requests the block's size");
    assert_eq!(a.memory_allocated(), allocated_at_checkpoint, "the same blocks are allocated as at the checkpoint");
    assert_eq!(a.memory_reserved(), reserved, "a restore neither allocates nor releases device memory");

    // The trace: the frees, then every checkpointed block allocated, then the free ones freed.
    let trace = a.trace();
    let actions: Vec<TraceAction> = trace.iter().map(|e| e.action).collect();
    let frees = 2 * delta.freed.len();
    assert!(actions[..frees].chunks(2).all(|p| p == [TraceAction::FreeRequested, TraceAction::FreeCompleted]));
    let carved: usize = checkpoint.segments.iter().map(|s| s.blocks.len()).sum();
    assert_eq!(trace.len(), frees + carved + 2 * (carved - expected.len()));
    assert!(
        trace[frees..].iter().all(|e| e.action != TraceAction::SegmentAlloc && e.action != TraceAction::SegmentFree)
    );

    // Old handles are stale; the new ones free as any other, and the default pools are untouched.
    assert!(matches!(a.free(later[0]), Err(AllocatorError::InvalidHandle(_))));
    for x in delta.allocated {
        a.free(x).unwrap();
    }
    a.free(default_block).unwrap();
    assert_eq!(a.memory_allocated(), 0);
    a.check_consistency().unwrap();
}

#[test]
fn a_restore_to_the_same_state_frees_and_reallocates_the_same_blocks() {
    let mut a = allocator("");
    a.create_pool(POOL).unwrap();
    let live = recorded(&mut a);
    let checkpoint = a.checkpoint_pool(POOL).unwrap();
    let before = layout(&a);
    let stats = a.stats();
    let delta = a.restore_pool(&checkpoint).unwrap();
    assert_eq!(layout(&a), before);
    let mut freed = delta.freed.clone();
    freed.sort_unstable();
    let mut allocd: Vec<u64> = delta.allocated.iter().map(|x| x.address()).collect();
    allocd.sort_unstable();
    assert_eq!(freed, allocd, "a pointer may be freed and allocated again");
    assert_eq!(freed.len(), live.len());
    // Every current value is as it was. Each allocated byte was freed and allocated once
    // more, and each free byte of the checkpointed segments allocated and freed once.
    let after = a.stats();
    let blocks = || checkpoint.segments.iter().flat_map(|s| &s.blocks);
    let free_bytes: u64 = blocks().filter(|b| !b.allocated).map(|b| b.size).sum();
    let free_blocks = blocks().filter(|b| !b.allocated).count() as i64;
    let all = |s: &cachalot_core::stats::StatArray| s.0[0];
    let (now, then) = (all(&after.allocated_bytes), all(&stats.allocated_bytes));
    assert_eq!((now.current, now.peak), (then.current, then.peak));
    let again = then.current + free_bytes as i64;
    assert_eq!((now.allocated, now.freed), (then.allocated + again, then.freed + again));
    let (now, then) = (all(&after.allocation), all(&stats.allocation));
    assert_eq!(now.current, then.current);
    assert_eq!(now.allocated, then.allocated + then.current + free_blocks);
    assert_eq!(after.reserved_bytes, stats.reserved_bytes);
    a.check_consistency().unwrap();
}

#[test]
fn expandable_segments_are_restored_with_their_unmapped_rest() {
    let mut a = allocator("expandable_segments:True");
    a.create_pool(POOL).unwrap();
    let live = recorded(&mut a);
    let checkpoint = a.checkpoint_pool(POOL).unwrap();
    assert!(checkpoint.segments.iter().all(|s| s.blocks.last().is_some_and(|b| !b.mapped)));
    let before = layout(&a);
    a.free(live[0]).unwrap();
    a.free(live[3]).unwrap();
    a.begin_allocate_to_pool(POOL, PoolFilter::AllStreams).unwrap();
    let small = a.malloc(3000, S0).unwrap();
    a.end_allocate_to_pool(POOL).unwrap();
    let delta = a.restore_pool(&checkpoint).unwrap();
    assert!(delta.freed.contains(&small.address()));
    assert_eq!(layout(&a), before);
    a.check_consistency().unwrap();
}

#[test]
fn a_restore_that_cannot_be_made_says_why_and_changes_nothing() {
    let mut a = allocator("");
    a.create_pool(POOL).unwrap();
    let live = recorded(&mut a);
    let checkpoint = a.checkpoint_pool(POOL).unwrap();
    a.record_history(true, usize::MAX, &[], false);
    let before = (layout(&a), a.stats());
    let refused = |a: &mut CachingAllocator<SimBackend>, checkpoint: &PoolCheckpoint, why: &str| {
        let error = a.restore_pool(checkpoint).unwrap_err();
        assert!(matches!(error, AllocatorError::Pool(PoolError::Checkpoint { .. })), "{error}");
        assert!(error.to_string().contains(why), "{error}");
        assert_eq!((layout(a), a.stats()), before);
        assert!(a.trace().is_empty());
        a.check_consistency().unwrap();
    };

    let mut moved = checkpoint.clone();
    moved.segments[0].blocks[0].ptr += 512;
    refused(&mut a, &moved, "the pool has no segment at");
    let mut merged = checkpoint.clone();
    let blocks = &mut merged.segments.iter_mut().find(|s| s.blocks.len() > 2).unwrap().blocks;
    for b in blocks.iter_mut() {
        b.allocated = false;
    }
    refused(&mut a, &merged, "would have merged");
    let mut twice = checkpoint.clone();
    twice.segments.push(twice.segments[0].clone());
    refused(&mut a, &twice, "twice");

    // A block used on a side stream whose work is not done cannot be made free.
    let side = StreamId(7);
    a.backend_mut().hold_stream(side);
    a.record_stream(&live[0], side).unwrap();
    refused(&mut a, &checkpoint, "waits for the work of other streams");

    // A pool every user released is not restored.
    let mut b = allocator("");
    b.create_pool(POOL).unwrap();
    recorded(&mut b);
    let checkpoint = b.checkpoint_pool(POOL).unwrap();
    // The pool object's user and the recording's.
    b.release_pool(POOL).unwrap();
    b.release_pool(POOL).unwrap();
    assert!(b.restore_pool(&checkpoint).unwrap_err().to_string().contains("every user released the pool"));
    assert!(b.checkpoint_pool(POOL).is_err());
    assert!(matches!(b.checkpoint_pool(PoolId(0, 9)), Err(AllocatorError::Pool(PoolError::Unknown(_)))));
}
