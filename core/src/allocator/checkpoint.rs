//! Checkpoints of a private pool and their restore: PyTorch's `getCheckpointState` and
//! `setCheckpointPoolState` (Note [Checkpointing PrivatePoolState];
//! `docs/allocator-rules.md` §25).
//!
//! CUDA-graph trees (`torch.compile(mode="reduce-overhead")`) record a tree of graphs into one
//! private pool. Replaying a graph changes no allocator state, so after replays the pool no
//! longer shows which of its blocks hold live tensors. To record a new graph off the current
//! path, the tree takes the checkpoint it made after recording the graph it has just replayed
//! and puts the pool back into that state: every block allocated now is freed, then each
//! checkpointed segment is carved into its checkpointed blocks (all allocated, in address
//! order), and the blocks that were free at the checkpoint are freed again. This reuses the
//! ordinary allocation and free paths, so the stats and the trace entries (`alloc`,
//! `free_requested`, `free_completed`) are those PyTorch's restore records. The caller learns
//! which pointers it no longer owns and which allocations it owns now ([`RestoreDelta`]).
//!
//! Where PyTorch would stop half-way (a segment gone, a block waiting for events), the restore
//! says why before it changes anything.

use super::malloc::Request;
use super::{Allocation, CachingAllocator};
use crate::backend::{Backend, StreamId};
use crate::block::{Location, NIL};
use crate::error::{AllocatorError, PoolError};
use crate::pool::PoolId;
use crate::size::PoolKind;

/// One block of a [`SegmentCheckpoint`] (PyTorch's `BlockState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCheckpoint {
    /// Address.
    pub ptr: u64,
    /// Size in bytes.
    pub size: u64,
    /// The stream the block was allocated on.
    pub stream: StreamId,
    /// Whether it was allocated.
    pub allocated: bool,
    /// Whether it was mapped (`false` only for an expandable segment's unmapped rest).
    pub mapped: bool,
}

/// One segment of a [`PoolCheckpoint`] (PyTorch's `SegmentState`): its blocks in address
/// order, tiling it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentCheckpoint {
    /// Small or large pool.
    pub kind: PoolKind,
    /// The blocks, the first at the segment's base.
    pub blocks: Vec<BlockCheckpoint>,
}

/// The state of one private pool (PyTorch's `PrivatePoolState`), as
/// [`CachingAllocator::checkpoint_pool`] takes it and [`CachingAllocator::restore_pool`] puts
/// it back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolCheckpoint {
    /// The pool.
    pub pool: PoolId,
    /// Its segments whose first block is mapped, by address.
    pub segments: Vec<SegmentCheckpoint>,
}

/// What a restore changed for the caller (PyTorch's `CheckpointDelta`): a pointer may be in
/// both lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreDelta {
    /// Addresses of the allocations the restore freed: their handles are no longer valid.
    pub freed: Vec<u64>,
    /// The allocations the restore made, one per block allocated at the checkpoint, in the
    /// checkpoint's order: the caller owns them and frees them as any other.
    pub allocated: Vec<Allocation>,
}

impl<B: Backend> CachingAllocator<B> {
    /// `getCheckpointState(pool)`: the segments and blocks of private pool `id`. Events of frees
    /// deferred during a capture are recorded first, as PyTorch does; a block still waiting for
    /// another stream's work cannot be checkpointed.
    pub fn checkpoint_pool(&mut self, id: PoolId) -> Result<PoolCheckpoint, AllocatorError> {
        self.insert_deferred_events()?;
        let slot = self.live_pool_slot(id)?;
        let mut heads: Vec<(u64, u32)> = self
            .segments
            .iter()
            .filter(|(_, s)| s.private == slot && self.blocks[s.head].mapped)
            .map(|(_, s)| (s.base, s.head))
            .collect();
        heads.sort_unstable();
        let mut segments = Vec::with_capacity(heads.len());
        for (_, head) in heads {
            let mut blocks = Vec::new();
            for b in self.chain(head) {
                let block = &self.blocks[b];
                if !block.allocated && block.location == Location::Active {
                    return Err(checkpoint_error(
                        id,
                        format!(
                            "the block at {:#x} was freed but waits for the work of other streams \
                             (events should have synchronized when checkpointing a block)",
                            block.ptr
                        ),
                    ));
                }
                blocks.push(BlockCheckpoint {
                    ptr: block.ptr,
                    size: block.size,
                    stream: block.stream,
                    allocated: block.allocated,
                    mapped: block.mapped,
                });
            }
            segments.push(SegmentCheckpoint { kind: self.blocks[head].pool, blocks });
        }
        Ok(PoolCheckpoint { pool: id, segments })
    }

    /// `setCheckpointPoolState`: puts private pool `checkpoint.pool` back into the state of the
    /// checkpoint. Every block of the pool allocated now is freed (a block used on other streams
    /// waits for them, as any free); each checkpointed segment is then allocated block by block
    /// and its blocks free at the checkpoint are freed again. Segments made since keep their
    /// (now free) blocks.
    ///
    /// Fails, changing nothing, if the pool was released, if a checkpointed segment is gone or
    /// no longer has the checkpoint's extent, or if one of its blocks would not be free once the
    /// pool's allocations are (it waits for another stream's work).
    pub fn restore_pool(&mut self, checkpoint: &PoolCheckpoint) -> Result<RestoreDelta, AllocatorError> {
        let id = checkpoint.pool;
        let slot = self.live_pool_slot(id)?;
        let checkpointed = self.check_restorable(checkpoint, slot)?;

        // Free everything allocated in the pool, segment by segment in address order.
        let mut delta = RestoreDelta::default();
        let mut pool_heads: Vec<(u64, u32)> =
            self.segments.iter().filter(|(_, s)| s.private == slot).map(|(_, s)| (s.base, s.head)).collect();
        pool_heads.sort_unstable();
        for (_, head) in pool_heads {
            let mut b = head;
            while b != NIL {
                // A freed block survives its merges (it absorbs its neighbours), so its `next`
                // is the next block to look at.
                if self.blocks[b].allocated {
                    delta.freed.push(self.blocks[b].ptr);
                    self.free_held_block(b)?;
                }
                b = self.blocks[b].next;
            }
        }

        // Each checkpointed segment is one free block now (and an unmapped rest): carve the
        // checkpoint's blocks out of it, all allocated, then free those that were free.
        for (segment, index) in checkpoint.segments.iter().zip(checkpointed) {
            // Read now: the frees above may have merged the head away.
            let mut current = self.segments[index].head;
            let mut carved = Vec::with_capacity(segment.blocks.len());
            for block in segment.blocks.iter().filter(|b| b.mapped) {
                self.remove_free(current);
                let request = Request {
                    stream: block.stream,
                    pool: segment.kind,
                    size: block.size,
                    alloc_size: block.size,
                    expandable: self.blocks[current].expandable,
                    slot,
                };
                let split = self.blocks[current].size > block.size;
                let allocation = self.alloc_found_block(current, &request, block.size, split);
                carved.push((allocation, block.allocated));
                current = self.blocks[allocation.block].next;
            }
            for (allocation, allocated) in carved {
                if allocated {
                    delta.allocated.push(allocation);
                } else {
                    self.free_requested(allocation.block);
                    self.free_block(allocation.block);
                }
            }
        }
        Ok(delta)
    }

    /// The slot of private pool `id`, which must still have a user: a released pool's memory
    /// may be given back at any time, so it is neither checkpointed nor restored.
    fn live_pool_slot(&self, id: PoolId) -> Result<u32, AllocatorError> {
        let slot = self.pool_slot(id)?;
        if self.private[slot].use_count == 0 {
            return Err(checkpoint_error(
                id,
                "every user released the pool (not expected to checkpoint a freeable graph)".into(),
            ));
        }
        Ok(slot)
    }

    /// Frees allocated block `b` as `free` does: at once, or once the other streams that used
    /// it are done.
    fn free_held_block(&mut self, b: u32) -> Result<(), AllocatorError> {
        if self.blocks.has_stream_uses(b) {
            return self.free_used_on_other_streams(b);
        }
        self.free_requested(b);
        self.free_block(b);
        Ok(())
    }

    /// The blocks of a segment from `head`, in address order.
    fn chain(&self, head: u32) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(Some(head).filter(|&b| b != NIL), |&b| Some(self.blocks[b].next).filter(|&n| n != NIL))
    }

    /// Checks that `checkpoint` can be restored into the pool of `slot` as it is now, and
    /// returns the segment of each checkpointed segment, in the checkpoint's order. A
    /// segment can be restored if it still belongs to the pool, once all its allocated blocks
    /// are freed it is one free mapped block of the checkpoint's mapped extent (and the same
    /// unmapped rest), and the checkpoint's blocks tile it as an allocator can leave them.
    fn check_restorable(&self, checkpoint: &PoolCheckpoint, slot: u32) -> Result<Vec<u32>, AllocatorError> {
        let id = checkpoint.pool;
        let fail = |reason: String| Err(checkpoint_error(id, reason));
        let mut found_segments = Vec::with_capacity(checkpoint.segments.len());
        for (i, segment) in checkpoint.segments.iter().enumerate() {
            let Some(first) = segment.blocks.first() else {
                return fail(format!("segment {i} of the checkpoint has no blocks"));
            };
            let found = self.segments.iter().find(|(_, s)| s.private == slot && s.base == first.ptr);
            let Some((index, now)) = found else {
                return fail(format!("the pool has no segment at {:#x} (segment {i} of the checkpoint)", first.ptr));
            };
            if found_segments.contains(&index) {
                return fail(format!("the checkpoint names the segment at {:#x} twice", first.ptr));
            }
            if now.pool != segment.kind {
                return fail(format!(
                    "the segment at {:#x} is of the {:?} pool, not {:?}",
                    first.ptr, now.pool, segment.kind
                ));
            }
            // The checkpoint's blocks: contiguous, non-empty, no two free mapped neighbours
            // (they would have merged), an unmapped block only last.
            let mut end = first.ptr;
            for (j, block) in segment.blocks.iter().enumerate() {
                let at = block.ptr;
                if block.ptr != end || block.size == 0 {
                    return fail(format!(
                        "block {j} of the checkpoint's segment at {:#x} does not follow block {}",
                        first.ptr,
                        j.saturating_sub(1)
                    ));
                }
                if !block.mapped && (j + 1 != segment.blocks.len() || j == 0 || block.allocated) {
                    return fail(format!("the unmapped block at {at:#x} is not the free end of a mapped segment"));
                }
                if j > 0 && block.mapped && !block.allocated {
                    let before = &segment.blocks[j - 1];
                    if !before.allocated {
                        return fail(format!("the free blocks at {:#x} and {at:#x} would have merged", before.ptr));
                    }
                }
                end = block.ptr.saturating_add(block.size);
            }
            let mapped: u64 = segment.blocks.iter().filter(|b| b.mapped).map(|b| b.size).sum();
            let unmapped = segment.blocks.iter().find(|b| !b.mapped).map(|b| (b.ptr, b.size));
            // The segment now, as it will be once its allocations are freed.
            let (mut mapped_now, mut unmapped_now) = (0u64, Vec::new());
            for b in self.chain(now.head) {
                let block = &self.blocks[b];
                if block.location == Location::Active && (!block.allocated || self.blocks.has_stream_uses(b)) {
                    return fail(format!(
                        "the block at {:#x} waits for the work of other streams, so the segment at {:#x} \
                         cannot be made free (events should have synchronized when setting a checkpointed block)",
                        block.ptr, first.ptr
                    ));
                }
                if block.mapped {
                    if !unmapped_now.is_empty() {
                        return fail(format!("the segment at {:#x} has mapped pages after unmapped ones", first.ptr));
                    }
                    mapped_now += block.size;
                } else {
                    unmapped_now.push((block.ptr, block.size));
                }
            }
            if mapped_now != mapped || unmapped_now != unmapped.into_iter().collect::<Vec<_>>() {
                return fail(format!(
                    "the segment at {:#x} has {mapped_now} mapped bytes and {} unmapped now, the checkpoint {mapped} and {}",
                    first.ptr,
                    unmapped_now.iter().map(|u| u.1).sum::<u64>(),
                    unmapped.map_or(0, |u| u.1)
                ));
            }
            found_segments.push(index);
        }
        Ok(found_segments)
    }
}

fn checkpoint_error(pool: PoolId, reason: String) -> AllocatorError {
    PoolError::Checkpoint { pool, reason }.into()
}
