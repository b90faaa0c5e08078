//! Why the cached, unallocated bytes could not serve a request: each block that is reserved
//! but not allocated is put in the first class that rules it out, in the order of the search
//! `malloc` makes (a pending free is not in the free sets at all; a private pool, the other
//! size pool and another stream are other sets; then the oversize rule and the size itself).
//! The rules are read off the allocator's configuration and the request as the allocator
//! rounded it, so the classes say what the allocator's own best fit saw.
//!
//! Two classes are seen when the request comes but mostly not after the retry chain, where the
//! main cause is read:
//!
//! - Oversize blocks are never split, so each is a whole segment. PyTorch 2.11's chain first
//!   releases those of the request's stream (`release_available_cached_blocks`: one at least as
//!   large as the request, else from the largest down until as many bytes are back), which
//!   always makes room for the request's segment when there are enough of them, then releases
//!   every whole free segment (`release_cached_blocks`). So an oversize block is left after a
//!   failed malloc only where that full release is not made (allocations routed to a private
//!   pool, by a graph capture or `use_mem_pool`; the other streams' blocks class first) or
//!   cannot unmap it (an expandable segment's block on pages shared with live blocks). Elsewhere
//!   the bytes went back to the device and the main cause is what still stood in the way:
//!   oversize blocks then show only among the classes when the request came.
//! - Pending frees are completed by the full release's synchronization. The class shows again
//!   after a failed malloc where it mattered: the completed free's block fits, but the retry
//!   asks the device for a new segment and does not search the free blocks again, so the
//!   free's completing too late is the main cause (`empty_cache()` before the request, which
//!   synchronizes first, lets the block serve it).

use cachalot_core::config::AllocatorConfig;
use cachalot_core::pool::PoolId;
use cachalot_core::size::PoolKind;
use cachalot_core::{BlockState, SegmentSnapshot, StreamId};

/// Why memory could not serve a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Live memory (and memory outside this allocator) leaves no room for the request on the
    /// device, however the cache were arranged: no allocator setting helps.
    LiveExceedsDevice,
    /// The memory fraction's allowance (`set_per_process_memory_fraction`,
    /// `per_process_memory_fraction`) refused memory the device had.
    FractionCap,
    /// Freed blocks still waiting for another stream's work (`record_stream`).
    PendingStreamFree,
    /// Free blocks in a private pool (`MemPool`, a CUDA graph's) the request is not routed to.
    PrivatePool,
    /// Free blocks in the small pool for a large request, or in the large pool for a small one.
    OtherPool,
    /// Free blocks of the request's pool that belong to another stream.
    OtherStream,
    /// Free blocks kept whole by `max_split_size_mb`: large enough, but not split for a request
    /// below the limit (or beyond `max_non_split_rounding_mb` of an oversize one). The retry
    /// chain gives these back before its last allocation but where allocations are routed to a
    /// pool or an expandable segment's page is shared (see the module doc), so it is the main
    /// cause only there.
    Oversize,
    /// Free blocks of the request's stream and pool, each smaller than the request
    /// (fragmentation: live blocks between them).
    TooSmall,
    /// Nothing cached stands in the way: the device or the allowance has room for the request's
    /// bytes but not for the whole segment a miss asks for (a large request's segment is rounded
    /// up to 2 MiB, a small one's is 2 MiB).
    SegmentSize,
}

impl Cause {
    /// Every class of block, in the order the classification tries them.
    pub const BLOCK_CLASSES: [Cause; 6] = [
        Cause::PendingStreamFree,
        Cause::PrivatePool,
        Cause::OtherPool,
        Cause::OtherStream,
        Cause::Oversize,
        Cause::TooSmall,
    ];

    /// The name in JSON and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Cause::LiveExceedsDevice => "live_exceeds_device",
            Cause::FractionCap => "fraction_cap",
            Cause::PendingStreamFree => "pending_stream_free",
            Cause::PrivatePool => "private_pool",
            Cause::OtherPool => "other_pool",
            Cause::OtherStream => "other_stream",
            Cause::Oversize => "oversize",
            Cause::TooSmall => "too_small",
            Cause::SegmentSize => "segment_size",
        }
    }

    /// What the class is, in words, for a request in `pool`.
    pub fn describe(self, pool: PoolKind) -> &'static str {
        match self {
            Cause::LiveExceedsDevice => "live memory alone leaves no room on the device",
            Cause::FractionCap => "the memory fraction's allowance refused memory the device had",
            Cause::PendingStreamFree => "freed blocks still waiting for another stream (record_stream)",
            Cause::PrivatePool => "free blocks in a private pool (MemPool / CUDA graph)",
            Cause::OtherPool => match pool {
                PoolKind::Large => "free blocks in the small pool (a large request cannot use them)",
                PoolKind::Small => "free blocks in the large pool (a small request cannot use them)",
            },
            Cause::OtherStream => "free blocks on another stream",
            Cause::Oversize => "oversize blocks kept whole by max_split_size_mb",
            Cause::TooSmall => "free blocks smaller than the request (fragmentation)",
            Cause::SegmentSize => "no cached bytes in the way, but no room for the whole segment a miss asks for",
        }
    }
}

/// The bytes of one class.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ClassBytes {
    /// The class.
    pub cause: Cause,
    /// Bytes in it.
    pub bytes: u64,
    /// Blocks in it.
    pub blocks: u64,
    /// Its largest block.
    pub largest_block: u64,
}

/// The address ranges of the frees in `segments` still waiting for another stream.
pub(crate) fn pending_ranges(segments: &[SegmentSnapshot]) -> Vec<(u64, u64)> {
    let blocks = segments.iter().flat_map(|s| &s.blocks);
    blocks.filter(|b| b.state == BlockState::ActivePendingFree).map(|b| (b.address, b.address + b.size)).collect()
}

/// The request as the allocator made it, for the classification.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Asked {
    /// The block size the allocator rounded the request to.
    pub rounded: u64,
    /// Its pool.
    pub pool: PoolKind,
    /// Its stream.
    pub stream: StreamId,
    /// The private pool it is routed to ([`PoolId::DEFAULT`] for none).
    pub pool_id: PoolId,
}

/// The class of a block that is reserved but not allocated, or `None` for one that could
/// serve the request.
fn class_of(
    config: &AllocatorConfig,
    asked: &Asked,
    segment: &SegmentSnapshot,
    size: u64,
    state: BlockState,
) -> Option<Cause> {
    if state == BlockState::ActivePendingFree {
        return Some(Cause::PendingStreamFree);
    }
    if segment.pool_id != asked.pool_id {
        return Some(Cause::PrivatePool);
    }
    if segment.pool != asked.pool {
        return Some(Cause::OtherPool);
    }
    if segment.stream != asked.stream {
        return Some(Cause::OtherStream);
    }
    if size < asked.rounded {
        return Some(Cause::TooSmall);
    }
    if config.oversize_rules_refuse(asked.rounded, size) {
        return Some(Cause::Oversize);
    }
    None
}

/// The reserved, unallocated bytes of `segments` by class, largest first, and the bytes of
/// blocks that could serve the request. A block that could serve it but lies where `pending`
/// (address ranges) had a free still waiting for another stream counts as
/// [`Cause::PendingStreamFree`]: after a failed malloc, that is the free the full release's
/// synchronization completed too late, as the retry after it asks the device for a new segment
/// and searches no free block again.
pub(crate) fn classify(
    config: &AllocatorConfig,
    asked: &Asked,
    segments: &[SegmentSnapshot],
    pending: &[(u64, u64)],
) -> (Vec<ClassBytes>, ClassBytes) {
    let mut classes: Vec<ClassBytes> =
        Cause::BLOCK_CLASSES.iter().map(|&cause| ClassBytes { cause, bytes: 0, blocks: 0, largest_block: 0 }).collect();
    // Free blocks that fit: none at an out-of-memory error; at a request served from the cache,
    // the block it took among them.
    let mut usable = ClassBytes { cause: Cause::TooSmall, bytes: 0, blocks: 0, largest_block: 0 };
    for segment in segments {
        for block in segment.blocks.iter().filter(|b| b.state != BlockState::ActiveAllocated) {
            let was_pending =
                || pending.iter().any(|&(start, end)| block.address < end && start < block.address + block.size);
            let class = class_of(config, asked, segment, block.size, block.state)
                .or_else(|| was_pending().then_some(Cause::PendingStreamFree));
            let slot = match class {
                Some(cause) => match classes.iter_mut().find(|c| c.cause == cause) {
                    Some(slot) => slot,
                    None => continue,
                },
                None => &mut usable,
            };
            slot.bytes += block.size;
            slot.blocks += 1;
            slot.largest_block = slot.largest_block.max(block.size);
        }
    }
    classes.retain(|c| c.bytes > 0);
    // Stable: equal bytes keep the order of the search.
    classes.sort_by_key(|c| std::cmp::Reverse(c.bytes));
    (classes, usable)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test")]

    use super::*;
    use cachalot_core::BlockSnapshot;

    fn segment(stream: u64, pool: PoolKind, blocks: &[(u64, BlockState)]) -> SegmentSnapshot {
        let mut address = 0;
        SegmentSnapshot {
            address: 0,
            total_size: blocks.iter().map(|b| b.0).sum(),
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: StreamId(stream),
            pool,
            is_expandable: false,
            pool_id: PoolId::DEFAULT,
            context: None,
            blocks: blocks
                .iter()
                .map(|&(size, state)| {
                    address += size;
                    BlockSnapshot { address: address - size, size, requested_size: size, state, context: None }
                })
                .collect(),
        }
    }

    /// Each block goes to the first rule that rules it out, and the classes come largest first.
    #[test]
    fn blocks_are_classed_by_the_first_rule_that_rules_them_out() {
        use BlockState::*;
        const MIB: u64 = 1 << 20;
        let config = AllocatorConfig::parse("max_split_size_mb:40").unwrap();
        let asked = Asked { rounded: 30 * MIB, pool: PoolKind::Large, stream: StreamId(1), pool_id: PoolId::DEFAULT };
        let segments = [
            segment(1, PoolKind::Large, &[(10 * MIB, Inactive), (4 * MIB, ActiveAllocated), (12 * MIB, Inactive)]),
            segment(1, PoolKind::Large, &[(64 * MIB, Inactive)]),
            segment(2, PoolKind::Large, &[(50 * MIB, Inactive), (2 * MIB, ActiveAllocated)]),
            segment(1, PoolKind::Small, &[(MIB, Inactive), (MIB, ActiveAllocated)]),
            segment(1, PoolKind::Large, &[(32 * MIB, ActivePendingFree)]),
            segment(1, PoolKind::Large, &[(36 * MIB, Inactive)]),
        ];
        let (classes, usable) = classify(&config, &asked, &segments, &[]);
        // Where a free was pending before, a block that fits is the late completion's.
        let (classes_after, _) = classify(&config, &asked, &segments[5..], &[(0, MIB)]);
        assert_eq!(classes_after[0].cause, Cause::PendingStreamFree);
        let got: Vec<(Cause, u64, u64, u64)> =
            classes.iter().map(|c| (c.cause, c.bytes / MIB, c.blocks, c.largest_block / MIB)).collect();
        assert_eq!(
            got,
            [
                (Cause::Oversize, 64, 1, 64),
                (Cause::OtherStream, 50, 1, 50),
                (Cause::PendingStreamFree, 32, 1, 32),
                (Cause::TooSmall, 22, 2, 12),
                (Cause::OtherPool, 1, 1, 1),
            ]
        );
        assert_eq!((usable.bytes / MIB, usable.blocks), (36, 1));
    }
}
