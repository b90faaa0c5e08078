//! Looking at the state: PyTorch-shaped snapshots of segments and blocks, and a full
//! consistency check used by the tests after every operation.

use super::CachingAllocator;
use crate::backend::{Backend, StreamId};
use crate::block::{Location, NIL};
use crate::pool::PoolId;
use crate::size::PoolKind;
use crate::stats::MemoryStats;
use crate::trace::ContextId;

/// State of a block in a snapshot (PyTorch's `state` strings).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum BlockState {
    /// Handed out to a user.
    ActiveAllocated,
    /// Freed, waiting for events of other streams.
    ActivePendingFree,
    /// Free in the cache.
    Inactive,
}

impl BlockState {
    /// PyTorch's name for the state.
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }

    /// Parses PyTorch's name.
    pub fn from_name(name: &str) -> Option<Self> {
        [BlockState::ActiveAllocated, BlockState::ActivePendingFree, BlockState::Inactive]
            .into_iter()
            .find(|s| s.name() == name)
    }
}

/// One block of a [`SegmentSnapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BlockSnapshot {
    /// Address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Requested size (stale for free blocks, as PyTorch reports it).
    pub requested_size: u64,
    /// Allocated, pending free, or free.
    pub state: BlockState,
    /// Stack of the allocation that holds it.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub context: Option<ContextId>,
}

/// One segment as `torch.cuda.memory_snapshot()` reports it (an expandable segment is reported
/// once per contiguous mapped range).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SegmentSnapshot {
    /// Address of the first block.
    pub address: u64,
    /// Bytes in the segment (or mapped range).
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of allocated and pending-free blocks.
    pub active_size: u64,
    /// Requested bytes of active blocks.
    pub requested_size: u64,
    /// Stream the segment belongs to.
    pub stream: StreamId,
    /// Small or large pool.
    pub pool: PoolKind,
    /// Whether it is (part of) an expandable segment.
    pub is_expandable: bool,
    /// The private pool it belongs to (`segment_pool_id`), [`PoolId::DEFAULT`] for the default
    /// pools.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "PoolId::is_default_ref"))]
    pub pool_id: PoolId,
    /// Stack of the allocation that created the segment.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub context: Option<ContextId>,
    /// Blocks in address order, tiling the segment.
    pub blocks: Vec<BlockSnapshot>,
}

impl<B: Backend> CachingAllocator<B> {
    /// The segments and blocks now, sorted by address (`torch.cuda.memory_snapshot()`).
    pub fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let mut out = Vec::new();
        for (_, segment) in self.segments.iter() {
            let mut id = segment.head;
            let mut first = true;
            while id != NIL {
                if !self.blocks[id].mapped {
                    id = self.blocks[id].next;
                    first = false;
                    continue;
                }
                let start = &self.blocks[id];
                let mut snap = SegmentSnapshot {
                    address: start.ptr,
                    total_size: 0,
                    allocated_size: 0,
                    active_size: 0,
                    requested_size: 0,
                    stream: segment.stream,
                    pool: segment.pool,
                    is_expandable: segment.page_size.is_some(),
                    pool_id: self.pool_id_of_slot(segment.private),
                    context: if first { segment.context } else { None },
                    blocks: Vec::new(),
                };
                while id != NIL && self.blocks[id].mapped {
                    let b = &self.blocks[id];
                    let state = if b.allocated {
                        BlockState::ActiveAllocated
                    } else if b.location == Location::Active {
                        BlockState::ActivePendingFree
                    } else {
                        BlockState::Inactive
                    };
                    snap.total_size += b.size;
                    if b.allocated {
                        snap.allocated_size += b.size;
                    }
                    if state != BlockState::Inactive {
                        snap.active_size += b.size;
                        snap.requested_size += b.requested_size;
                    }
                    snap.blocks.push(BlockSnapshot {
                        address: b.ptr,
                        size: b.size,
                        requested_size: b.requested_size,
                        state,
                        context: if state == BlockState::Inactive { None } else { self.blocks.context(id) },
                    });
                    id = b.next;
                }
                out.push(snap);
                first = false;
            }
        }
        out.sort_by_key(|s| s.address);
        out
    }

    /// Checks every invariant of the state and returns the first violation: blocks tile every
    /// segment exactly; each block is in exactly one place (its pool's free set, the unmapped
    /// set, or active) matching its state; free neighbours that may merge are merged; the
    /// ordered sets are well formed; and every stat's current value equals a recount.
    pub fn check_consistency(&self) -> Result<(), String> {
        let mut recount = MemoryStats::default();
        let mut seen_blocks = 0usize;
        // Free and unmapped blocks counted per (pool slot, small/large), to compare with the sets.
        let mut free_blocks: std::collections::BTreeMap<(u32, usize), usize> = Default::default();
        let mut unmapped_blocks: std::collections::BTreeMap<(u32, usize), usize> = Default::default();
        let mut private_segments: std::collections::BTreeMap<u32, u32> = Default::default();
        let max_split = self.config.max_split_size_raw();
        let mut reserved_total = 0u64;
        for (seg_id, segment) in self.segments.iter() {
            let mut id = segment.head;
            let mut address = segment.base;
            let mut prev = NIL;
            let mut mapped_bytes = 0u64;
            let mut count = 0usize;
            if segment.private != NIL {
                if self.private.iter().all(|(slot, _)| slot != segment.private) {
                    return Err(format!(
                        "segment at {:#x}: its private pool {} does not exist",
                        segment.base, segment.private
                    ));
                }
                *private_segments.entry(segment.private).or_default() += 1;
            }
            while id != NIL {
                let b = self.blocks.get(id).ok_or(format!("segment {seg_id:#x}: link to vacant block {id}"))?;
                count += 1;
                if count > self.blocks.len() {
                    return Err(format!("segment at {:#x}: block list loops", segment.base));
                }
                if b.prev != prev {
                    return Err(format!("block {id} at {:#x}: prev link broken", b.ptr));
                }
                if b.ptr != address {
                    return Err(format!("block {id}: address {:#x}, expected {address:#x} (gap or overlap)", b.ptr));
                }
                if b.size == 0 || b.size % 512 != 0 {
                    return Err(format!(
                        "block {id} at {:#x}: size {} is not a positive multiple of 512",
                        b.ptr, b.size
                    ));
                }
                if b.segment != seg_id || b.pool != segment.pool || b.stream != segment.stream {
                    return Err(format!(
                        "block {id} at {:#x}: segment, pool or stream differs from its segment",
                        b.ptr
                    ));
                }
                if b.expandable != segment.page_size.is_some() {
                    return Err(format!("block {id} at {:#x}: expandable flag differs from its segment", b.ptr));
                }
                let pool_index = (b.pool == PoolKind::Large) as usize;
                let pending = !b.allocated && b.location == Location::Active;
                let expected = if b.allocated || b.event_count > 0 || pending {
                    Location::Active
                } else if b.mapped {
                    Location::Free
                } else {
                    Location::Unmapped
                };
                if b.location != expected {
                    return Err(format!("block {id} at {:#x}: in {:?}, expected {expected:?}", b.ptr, b.location));
                }
                if b.allocated && b.event_count > 0 {
                    return Err(format!("block {id} at {:#x}: allocated with pending events", b.ptr));
                }
                if pending && b.event_count == 0 && !self.deferred_frees.contains(&id) {
                    return Err(format!("block {id} at {:#x}: pending free without events", b.ptr));
                }
                match b.location {
                    Location::Free => *free_blocks.entry((segment.private, pool_index)).or_default() += 1,
                    Location::Unmapped => *unmapped_blocks.entry((segment.private, pool_index)).or_default() += 1,
                    _ => {}
                }
                // Free neighbours of the same mapping must have been merged.
                if prev != NIL {
                    let p = &self.blocks[prev];
                    let both_free = matches!(p.location, Location::Free | Location::Unmapped)
                        && matches!(b.location, Location::Free | Location::Unmapped);
                    if both_free && p.mapped == b.mapped {
                        return Err(format!("free neighbours at {:#x} and {:#x} were not merged", p.ptr, b.ptr));
                    }
                }
                let pool = b.pool;
                if b.mapped {
                    mapped_bytes += b.size;
                }
                if b.allocated {
                    recount.allocation.increase(pool, 1);
                    recount.allocated_bytes.increase(pool, b.size);
                    if b.size >= max_split {
                        recount.oversize_allocations.increase(1);
                    }
                }
                if b.location == Location::Active {
                    recount.active.increase(pool, 1);
                    recount.active_bytes.increase(pool, b.size);
                    recount.requested_bytes.increase(pool, b.requested_size);
                }
                if b.location == Location::Free && b.is_split() && !b.expandable {
                    recount.inactive_split.increase(pool, 1);
                    recount.inactive_split_bytes.increase(pool, b.size);
                }
                address += b.size;
                prev = id;
                id = b.next;
            }
            seen_blocks += count;
            if address != segment.base + segment.size {
                return Err(format!(
                    "segment at {:#x}: blocks cover {} bytes of {}",
                    segment.base,
                    address - segment.base,
                    segment.size
                ));
            }
            if segment.page_size.is_some() {
                recount.reserved_bytes.increase(segment.pool, mapped_bytes);
            } else {
                recount.segment.increase(segment.pool, 1);
                recount.reserved_bytes.increase(segment.pool, segment.size);
                if segment.size >= max_split {
                    recount.oversize_segments.increase(1);
                }
            }
            reserved_total += mapped_bytes;
        }
        if seen_blocks != self.blocks.len() {
            return Err(format!("{} blocks exist but {seen_blocks} are in segments", self.blocks.len()));
        }
        let slots = std::iter::once(NIL).chain(self.private.iter().map(|(slot, _)| slot));
        for slot in slots {
            let name = self.pool_id_of_slot(slot);
            for (i, kind) in [PoolKind::Small, PoolKind::Large].into_iter().enumerate() {
                let pool = self.pool(slot, kind);
                let (free, unmapped) = (
                    free_blocks.get(&(slot, i)).copied().unwrap_or(0),
                    unmapped_blocks.get(&(slot, i)).copied().unwrap_or(0),
                );
                let n = pool.free.check(&self.blocks)?;
                if n != free {
                    return Err(format!("pool {name} {}: free set holds {n} blocks, {free} are free", kind.name()));
                }
                let n = pool.unmapped.check(&self.blocks)?;
                if n != unmapped {
                    return Err(format!(
                        "pool {name} {}: unmapped set holds {n} blocks, {unmapped} are unmapped",
                        kind.name()
                    ));
                }
            }
            if slot != NIL {
                let (kept, counted) = (self.private[slot].segments, private_segments.get(&slot).copied().unwrap_or(0));
                if kept != counted {
                    return Err(format!("pool {name}: counts {kept} segments, {counted} belong to it"));
                }
            }
        }
        if self.private_ids.len() != self.private.len()
            || self.private_ids.iter().any(|(id, &slot)| self.private.iter().all(|(s, p)| s != slot || p.id != *id))
        {
            return Err("the private pools and their ids disagree".into());
        }
        for (id, slot, _) in &self.routing {
            if self.private_ids.get(id) != Some(slot) {
                return Err(format!("allocations are routed to pool {id}, which does not exist"));
            }
        }
        let pending: u32 = self.events.values().map(|q| q.len() as u32).sum();
        let counted: u32 = self.blocks.iter().map(|(_, b)| u32::from(b.event_count)).sum();
        if pending != counted {
            return Err(format!("{pending} events outstanding but blocks count {counted}"));
        }
        self.blocks.check_stream_uses()?;
        if reserved_total != self.total_allocated_memory {
            return Err(format!("device bytes {} but segments hold {reserved_total}", self.total_allocated_memory));
        }
        let s = &self.stats.to_stats();
        let arrays = [
            ("allocation", &s.allocation, &recount.allocation),
            ("segment", &s.segment, &recount.segment),
            ("active", &s.active, &recount.active),
            ("inactive_split", &s.inactive_split, &recount.inactive_split),
            ("allocated_bytes", &s.allocated_bytes, &recount.allocated_bytes),
            ("reserved_bytes", &s.reserved_bytes, &recount.reserved_bytes),
            ("active_bytes", &s.active_bytes, &recount.active_bytes),
            ("inactive_split_bytes", &s.inactive_split_bytes, &recount.inactive_split_bytes),
            ("requested_bytes", &s.requested_bytes, &recount.requested_bytes),
        ];
        for (name, kept, counted) in arrays {
            for (bucket, (k, c)) in ["all", "small_pool", "large_pool"].iter().zip(kept.0.iter().zip(&counted.0)) {
                if k.current != c.current {
                    return Err(format!("{name}.{bucket}.current is {} but a recount gives {}", k.current, c.current));
                }
                if k.peak < k.current {
                    return Err(format!("{name}.{bucket}: peak {} below current {}", k.peak, k.current));
                }
            }
        }
        for (name, k, c) in [
            ("oversize_allocations", &s.oversize_allocations, &recount.oversize_allocations),
            ("oversize_segments", &s.oversize_segments, &recount.oversize_segments),
        ] {
            if k.current != c.current {
                return Err(format!("{name}.current is {} but a recount gives {}", k.current, c.current));
            }
        }
        Ok(())
    }
}
