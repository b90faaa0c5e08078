//! Looking at the state: PyTorch-shaped snapshots of segments and blocks, and a full
//! consistency check used by the tests after every operation.

use super::CachingAllocator;
use super::planned_cuts::{CutView, Part};
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

/// What a `malloc` would give back to the device before it is served, told from the state
/// without making it ([`CachingAllocator::releases_of_malloc`]).
struct ReleasePlan {
    /// Free blocks it would return, as whole segments (the collector and the oversize release
    /// take only these).
    gone: std::collections::HashSet<u32>,
    /// `segment_free` and `segment_unmap` entries so far.
    releases: u64,
    /// Device bytes released so far.
    bytes: u64,
    /// Free expandable blocks `policy:cachalot` gives pages back from: the block, and the first
    /// and the end address of the pages unmapped (the block's pages below and its partial page
    /// above stay mapped and free).
    cuts: Vec<(u32, u64, u64)>,
}

impl ReleasePlan {
    fn release(&mut self, id: u32, size: u64) {
        self.gone.insert(id);
        self.releases += 1;
        self.bytes += size;
    }
}

impl<B: Backend> CachingAllocator<B> {
    /// How many segments a `malloc(size, stream)` made now would release (its `segment_free` and
    /// `segment_unmap` trace entries, as `num_device_free` counts them) before it is served,
    /// found without making it: the cache hit it would take, `policy:cachalot`'s return of
    /// cached memory before a new peak, the garbage collector, the fraction's and the device's
    /// answer to the first device allocation (`device_free`: the bytes the device would still
    /// give), the oversize release and the full release of the retry chain, each as the malloc
    /// takes them. Where the last step is reached, the count is every segment and page the
    /// cache can give back, whether or not the retry then succeeds.
    ///
    /// It reads only the free blocks of the request's pool and the blocks the steps would
    /// touch, never the allocated ones, so a replay can ask it at every release it must
    /// explain (`cachalot replay`), where trying the malloc on a copy cost a copy of every live
    /// block. Cross-stream frees still outstanding are taken as not yet completed (call
    /// [`CachingAllocator::process_events`] first, as the malloc itself would, unless
    /// allocations are routed to a pool, when it queries no event): the steps before the full
    /// release leave them pending, and the full release completes them before it releases, so
    /// their blocks count with the free blocks they then join. Private pools are planned as the
    /// malloc takes them: a request routed to one searches, maps and releases oversize blocks
    /// there, and its chain has no full release; otherwise the full release also empties every
    /// pool all of whose users released it. Expandable pages are mapped one piece per run of
    /// unmapped space the request grows over, and a piece the device refuses leaves those
    /// before it mapped, free, for the full release to count. Rule 4's return of cached memory
    /// before a new peak (`policy:cachalot`) is planned with the walk the malloc itself takes,
    /// and what it leaves is what the later steps find (`planned_cuts.rs`): each block it gives
    /// pages back from cut below them (and above, at a partial page), those pages one unmapped
    /// run with the unmapped blocks beside them, a reservation left with nothing mapped
    /// released. The search for the pages to map runs over those blocks, as
    /// `find_expandable_block` does after the give-backs: under `max_split_size_mb` it may find
    /// room in a free block of the request's own stream that best fit passed over and the miss
    /// gave pages back from. `None` only where the device (`device_free`) would map a whole
    /// new reservation and still be asked for more, which no device does (a reservation spans
    /// 1 1/8 of it).
    pub fn releases_of_malloc(&self, size: u64, stream: StreamId, device_free: u64) -> Option<u64> {
        self.plan_malloc_releases(size, stream, device_free, true).map(|planned| planned.releases)
    }

    /// The releases a `malloc(size, stream)` made now records when it is then served with no
    /// segment allocated and no page mapped, or `None` where it would not be served so: a hit
    /// (which releases nothing), a miss that allocates or maps, or one that reaches the full
    /// release of the retry chain. The trace then shows the releases followed by the
    /// allocation itself. Three releases come before such a miss: `policy:cachalot`'s
    /// give-backs before a new peak (rule 4), which may leave the request room in the pages
    /// they keep; the garbage collector's; and the oversize release after the fraction refused
    /// the request; the last two under either policy, where `find_expandable_block` then finds
    /// the request's bytes in mapped memory that best fit passed over (an oversize block under
    /// `max_split_size_mb`). (The full release may also be followed by the allocation, when
    /// its synchronization completes a free whose block the retry takes; that is not this
    /// answer.) Read off the state as [`CachingAllocator::releases_of_malloc`] reads it.
    pub fn releases_of_malloc_served_in_place(&self, size: u64, stream: StreamId, device_free: u64) -> Option<u64> {
        // Never served in place after the full release: its count (every free block) is skipped.
        self.plan_malloc_releases(size, stream, device_free, false)
            .filter(|planned| planned.in_place)
            .map(|planned| planned.releases)
    }

    /// [`CachingAllocator::releases_of_malloc`], and whether the step that serves the miss
    /// needs no device allocation (an expandable request with no page to map). Without
    /// `count_full_release`, a chain that reaches the full release stops there, uncounted.
    fn plan_malloc_releases(
        &self,
        size: u64,
        stream: StreamId,
        device_free: u64,
        count_full_release: bool,
    ) -> Option<PlannedReleases> {
        use crate::size::MAX_REQUEST;
        let none = PlannedReleases { releases: 0, in_place: false };
        if size == 0 || size >= MAX_REQUEST {
            return Some(none);
        }
        let request = self.request(size, stream);
        // `policy:cachalot`'s rule 5 serves a large-pool miss at the peak from the small pool's
        // free pages, with nothing released, as a hit.
        if self.plan_hit(&request) || self.other_pool_block_at_peak(&request).is_some() {
            return Some(none);
        }
        let mut plan = ReleasePlan { gone: Default::default(), releases: 0, bytes: 0, cuts: Vec::new() };
        // Rule 4's walk is the malloc's own; the miss then searches the blocks its give-backs
        // leave.
        self.plan_give_backs_before_peak(&request, &mut plan);
        if self.gc_enabled() {
            self.plan_garbage_collection(&request, &mut plan);
        }
        let view = CutView::new(self, &plan.cuts);
        // The first device allocation served: the common answer, found without counting what
        // the cache could give back (every free block of both pools).
        let pieces = if request.expandable { self.pieces_to_map(&request, &view) } else { Vec::new() };
        // Served with nothing to allocate: an expandable request whose room needs no page.
        let in_place = request.expandable && pieces.is_empty();
        let (served, mut mapped) = self.plan_device_allocation(&request, &plan, device_free, &pieces, 0);
        if served {
            return Some(PlannedReleases { releases: plan.releases, in_place });
        }
        if !self.routing.is_empty() {
            // No full release while allocations are routed to a pool (it would synchronize,
            // which a capture must not): the oversize release is the last step that releases,
            // whatever the device answers after it.
            self.plan_oversize_release(&request, &mut plan);
            // Whether it is then served matters only to the in-place answer.
            let in_place = in_place && self.plan_device_allocation(&request, &plan, device_free, &pieces, mapped).0;
            return Some(PlannedReleases { releases: plan.releases, in_place });
        }
        if self.plan_oversize_release(&request, &mut plan) {
            let served;
            (served, mapped) = self.plan_device_allocation(&request, &plan, device_free, &pieces, mapped);
            if served {
                return Some(PlannedReleases { releases: plan.releases, in_place });
            }
        }
        if !count_full_release {
            return Some(PlannedReleases { releases: plan.releases, in_place: false });
        }
        // The full release releases all the cache still holds once the outstanding frees have
        // completed, the pages the refused allocations mapped included (free, joined to the
        // block they grew).
        if pieces[..mapped].iter().any(|piece| piece.hole == NIL) {
            return None; // a whole new reservation mapped, still too small: never served
        }
        let grown: Vec<u32> = pieces[..mapped].iter().flat_map(|piece| view.hole_blocks(piece.hole)).collect();
        let releases = plan.releases + self.releasable_after(&grown, &plan).0;
        Some(PlannedReleases { releases, in_place: false })
    }

    /// How many VA reservations a `malloc(size, stream)` made now that runs out of memory
    /// would make on its way (each step of the retry chain that finds no segment of the stream
    /// and pool with room for the request reserves one, and keeps it), found without making it.
    /// The search for room runs over the blocks `policy:cachalot`'s give-backs before a new
    /// peak leave, as in [`CachingAllocator::releases_of_malloc`]. Every state is answered
    /// (`Some`).
    pub fn reservations_of_failing_malloc(&self, size: u64, stream: StreamId) -> Option<u64> {
        use crate::size::MAX_REQUEST;
        if size == 0 || size >= MAX_REQUEST {
            return Some(0);
        }
        let request = self.request(size, stream);
        if !request.expandable || self.plan_hit(&request) || self.other_pool_block_at_peak(&request).is_some() {
            return Some(0);
        }
        let mut plan = ReleasePlan { gone: Default::default(), releases: 0, bytes: 0, cuts: Vec::new() };
        self.plan_give_backs_before_peak(&request, &mut plan);
        if self.gc_enabled() {
            self.plan_garbage_collection(&request, &mut plan);
        }
        // The search runs over the blocks rule 4's give-backs leave.
        let view = CutView::new(self, &plan.cuts);
        let within_fraction = |released: u64| {
            self.allowed_memory_maximum.is_none_or(|allowed| {
                (self.total_allocated_memory - released).saturating_add(request.alloc_size) <= allowed
            })
        };
        // Every reservation the chain makes has the same size: it has room for the request in
        // all, or in none. Pages a failing step maps stay free, in a run it found, so they
        // change neither which runs have room nor, once the full release has unmapped them
        // again, the bytes that release leaves reserved.
        let fresh_has_room = size <= self.reservation_size(request.pool);
        let mut made = 0;
        // The first device allocation: a reservation where no segment has room.
        if within_fraction(plan.bytes) && view.room(&request).is_none() {
            made += 1;
        }
        let made_with_room = |made: u64| made > 0 && fresh_has_room;
        // The retry after an oversize release that freed enough: the same search, where a
        // reservation the first step made may now have room.
        if self.plan_oversize_release(&request, &mut plan)
            && within_fraction(plan.bytes)
            && !made_with_room(made)
            && view.room(&request).is_none()
        {
            made += 1;
        }
        if !self.routing.is_empty() {
            return Some(made); // no full release while allocations are routed to a pool
        }
        // The retry after the full release, which unmapped every free page and released every
        // reservation left with nothing mapped (not one that never had a page mapped), beside
        // the `plan.bytes` the steps before gave back. Rule 4's give-backs change neither which
        // runs have room once every free page is unmapped nor which reservations are released.
        let released = plan.bytes + self.releasable_after(&[], &plan).1;
        if within_fraction(released) && !made_with_room(made) && !self.room_after_release(&request) {
            made += 1;
        }
        Some(made)
    }

    /// Whether the VA reservation holding `address`, if any, outlives the full release of a
    /// failing malloc's retry chain: it does unless every block in it is free once the
    /// outstanding cross-stream frees have completed (which the release does first) and some
    /// page of it mapped, when unmapping its pages leaves nothing mapped and it is released.
    /// In a private pool every user released, the release drops it once every block is free,
    /// mapped or not; in one still used, it stays. While allocations are routed to a pool the
    /// chain has no full release: every reservation outlives it.
    pub fn reservation_outlives_release(&self, address: u64) -> bool {
        let Some((_, segment)) =
            self.segments.iter().find(|(_, s)| s.page_size.is_some() && s.base <= address && address - s.base < s.size)
        else {
            return false;
        };
        if !self.routing.is_empty() {
            return true;
        }
        let private = segment.private != NIL;
        if private && self.private[segment.private].use_count > 0 {
            return true;
        }
        let mut b = segment.head;
        let mut mapped = false;
        while b != NIL {
            if self.blocks[b].allocated {
                return true;
            }
            mapped |= self.blocks[b].mapped;
            b = self.blocks[b].next;
        }
        !mapped && !private
    }

    /// Whether the malloc would be served from the cache (`policy:cachalot` turns a hit on a
    /// larger whole segment into a miss: `compact_keep_hit`).
    fn plan_hit(&self, request: &super::malloc::Request) -> bool {
        self.best_fit(request).is_some_and(|block| {
            let b = &self.blocks[block];
            self.config.policy() == crate::config::Policy::PyTorch
                || b.expandable
                || b.is_split()
                || b.size <= request.alloc_size
        })
    }

    /// `policy:cachalot`'s rule 4 (`compact.rs`), planned: the cached memory a miss gives back
    /// before it would raise reserved memory above its peak, as the malloc's own walk chooses
    /// it (`give_backs_before_peak`, shared with the malloc). Whether it gave anything back.
    fn plan_give_backs_before_peak(&self, request: &super::malloc::Request, plan: &mut ReleasePlan) -> bool {
        if self.config.policy() != crate::config::Policy::Cachalot {
            return false;
        }
        let mut scratch = super::compact::GiveBackScratch::default();
        self.give_backs_before_peak(request, &mut scratch);
        let give_backs = scratch.plan;
        for give_back in &give_backs {
            let b = &self.blocks[give_back.block];
            if b.expandable {
                // Pages at the top of a free block: the block stays (smaller, or unmapped).
                plan.releases += 1;
                plan.bytes += give_back.bytes;
                if let Some((begin, end, page)) = self.pages_given_back_from(give_back.block, give_back.wanted) {
                    let base = self.segments[b.segment].base;
                    plan.cuts.push((give_back.block, base + begin * page, base + end * page));
                }
            } else {
                plan.release(give_back.block, give_back.bytes);
            }
        }
        !give_backs.is_empty()
    }

    /// The `segment_free` and `segment_unmap` entries the full release of a malloc's retry
    /// chain would record once the steps of `plan` have been taken (and `empty_cache` now, for
    /// an empty plan): every free whole segment and every free expandable block holding a
    /// whole page, of both default pools and of every private pool all of whose users released
    /// it (`release_freeable_pools`; a pool still used keeps its memory), less the whole
    /// segments the plan released, with the pages it gave back from free blocks unmapped (which
    /// cuts their runs), and with the blocks `grown` mapped whole (by a device allocation
    /// refused after them: the unmapped ones, and the cut ones whose pages given back they
    /// hold, which are then whole again), joined to the free blocks beside them. Also the device
    /// bytes they hold. Cross-stream frees still outstanding count as completed, as
    /// `release_cached_blocks` completes them before it releases
    /// (`synchronize_and_free_events`): each such block merges with the free blocks beside it,
    /// and the run they make is what is released.
    fn releasable_after(&self, grown: &[u32], plan: &ReleasePlan) -> (u64, u64) {
        let pending = self.frees_pending();
        // Whether runs of free blocks may be longer than one block, or cut.
        let joined = pending || !grown.is_empty() || !plan.cuts.is_empty();
        let merges = |id: u32| self.merges_after_sync(id) || grown.contains(&id);
        // A cut whose pages a refused allocation mapped again (all of them, with the unmapped
        // blocks beside them) is undone: the block is one run again.
        let cut_of = |id: u32| match grown.contains(&id) {
            true => None,
            false => plan.cuts.iter().find(|cut| cut.0 == id).map(|&(_, begin, end)| (begin, end)),
        };
        let freeable = self.private.iter().filter(|(_, p)| p.use_count == 0).map(|(slot, _)| slot);
        let mut candidates = Vec::new();
        for slot in std::iter::once(NIL).chain(freeable) {
            for kind in [PoolKind::Large, PoolKind::Small] {
                candidates.extend(self.pool(slot, kind).free.to_vec());
            }
            if pending {
                candidates.extend(self.pending_blocks(slot));
            }
        }
        candidates.extend_from_slice(grown);
        candidates.retain(|id| !plan.gone.contains(id));
        if joined {
            // A block waiting for several events is listed once per event.
            candidates.sort_unstable();
            candidates.dedup();
        }
        let (mut count, mut bytes) = (0, 0);
        for id in candidates {
            let b = &self.blocks[id];
            // Otherwise every free block is already all of its run.
            if joined && b.prev != NIL && merges(b.prev) {
                continue; // within a run counted from its first block
            }
            let (base, page) = self.segment_pages(b.segment);
            // The whole pages of the mapped range [begin, end), which one unmap releases.
            let mut count_pages = |begin: u64, end: u64| {
                let released = ((end - base) / page).saturating_sub((begin - base).div_ceil(page)) * page;
                count += u64::from(released > 0);
                bytes += released;
            };
            // The run's blocks, a range of them cut off at each block pages were given back
            // from: what is below those pages ends one range, what is above starts the next.
            let (mut begin, mut last) = (b.ptr, id);
            loop {
                if let Some((cut, top)) = cut_of(last) {
                    count_pages(begin, cut);
                    begin = top;
                }
                let next = self.blocks[last].next;
                if !(joined && next != NIL && merges(next)) {
                    break;
                }
                last = next;
            }
            let (end, after) = (self.blocks[last].ptr + self.blocks[last].size, self.blocks[last].next);
            if b.expandable {
                count_pages(begin, end);
            } else if b.prev == NIL && after == NIL {
                // Ordinary segments are released whole, when all of one is free.
                count += 1;
                bytes += end - b.ptr;
            }
        }
        (count, bytes)
    }

    /// Whether a cross-stream free is still outstanding: its block waits for events.
    fn frees_pending(&self) -> bool {
        self.events.values().any(|q| !q.is_empty())
    }

    /// The blocks of pool `slot` whose free waits for events (once per event), which the full
    /// release's synchronization completes.
    fn pending_blocks(&self, slot: u32) -> impl Iterator<Item = u32> + '_ {
        self.events
            .values()
            .flatten()
            .map(|&(_, id)| id)
            .filter(move |&id| self.segments[self.blocks[id].segment].private == slot)
    }

    /// Whether block `id` is a free mapped block once outstanding frees have completed: free
    /// now, or freed and waiting only for events. Such neighbours are merged by then.
    fn merges_after_sync(&self, id: u32) -> bool {
        let b = &self.blocks[id];
        !b.allocated && b.mapped
    }

    /// Whether a segment of the request's stream and pool would have room for it once the full
    /// release has completed the outstanding frees and unmapped every free page: a run of free
    /// and unmapped blocks holding an unmapped page and the request's bytes, in a reservation
    /// the release keeps.
    fn room_after_release(&self, request: &super::malloc::Request) -> bool {
        let (stream, size) = (request.stream, request.size);
        let pool = self.pool(request.slot, request.pool);
        let mut seeds: Vec<u32> = pool.unmapped.walk_stream(&self.blocks, stream).collect();
        let mut cursor = pool.free.lower_bound(stream, 0);
        while let Some(id) = cursor.filter(|&id| self.blocks[id].stream == stream) {
            if self.blocks[id].expandable {
                seeds.push(id);
            }
            cursor = pool.free.successor(&self.blocks, id);
        }
        seeds.extend(self.pending_blocks(request.slot).filter(|&id| {
            let b = &self.blocks[id];
            b.expandable && b.stream == stream && b.pool == request.pool
        }));
        // Free once the outstanding frees have completed.
        let free = |id: u32| !self.blocks[id].allocated;
        let mut seen = std::collections::HashSet::new();
        for seed in seeds {
            let mut start = seed;
            while self.blocks[start].prev != NIL && free(self.blocks[start].prev) {
                start = self.blocks[start].prev;
            }
            if !seen.insert(start) {
                continue;
            }
            let (base, page) = self.segment_pages(self.blocks[start].segment);
            let holds_page = |(begin, end): (u64, u64)| (begin - base).div_ceil(page) < (end - base) / page;
            // Whether an unmapped page is left after the release: an unmapped block, or a whole
            // page within a run of mapped blocks (merged by then, and unmapped).
            let (mut b, mut bytes, mut whole_page, mut mapped) = (start, 0u64, false, false);
            let mut piece: Option<(u64, u64)> = None;
            while b != NIL && free(b) {
                let block = &self.blocks[b];
                bytes += block.size;
                if block.mapped {
                    mapped = true;
                    let end = block.ptr + block.size;
                    piece = Some(piece.map_or((block.ptr, end), |(begin, _)| (begin, end)));
                } else {
                    whole_page = true;
                    piece = None;
                }
                b = block.next;
            }
            whole_page |= piece.is_some_and(holds_page);
            // A run reaching both ends of its segment is all of it: released if mapped.
            let kept = self.blocks[start].prev != NIL || b != NIL || !mapped;
            if kept && whole_page && bytes >= size {
                return true;
            }
        }
        false
    }

    /// `garbage_collect_cached_blocks`, planned: the collector's clock has ticked once more
    /// for the request's search when it is of the large pool.
    fn plan_garbage_collection(&self, request: &super::malloc::Request, plan: &mut ReleasePlan) {
        let Some(allowed) = self.allowed_memory_maximum else { return };
        let threshold = (self.config.garbage_collection_threshold() * allowed as f64) as u64;
        let total = self.total_allocated_memory - plan.bytes;
        if total <= threshold {
            return;
        }
        let target = total - threshold;
        // The request's search ticks its own pool's clock: the default large pool's only if
        // the request is served there.
        let served_here = request.pool == PoolKind::Large && request.slot == NIL;
        let clock = self.large.free_blocks_call_count + i64::from(served_here);
        let age = |id: u32| clock - self.blocks.cold(id).gc_count_base;
        let candidates: Vec<u32> = self
            .large
            .free
            .to_vec()
            .into_iter()
            .filter(|id| !plan.gone.contains(id) && !self.blocks[*id].is_split() && !self.blocks[*id].expandable)
            .collect();
        let mut total_age: i64 = candidates.iter().map(|&id| age(id)).sum();
        let mut count = candidates.len() as i64;
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && count > 0 {
            let average = total_age as f64 / count as f64;
            freed_any = false;
            for &id in &candidates {
                if !plan.gone.contains(&id) && age(id) as f64 >= average {
                    freed_any = true;
                    reclaimed += self.blocks[id].size;
                    total_age -= age(id);
                    count -= 1;
                    plan.release(id, self.blocks[id].size);
                }
            }
        }
    }

    /// `release_available_cached_blocks`, planned; whether it would release enough.
    fn plan_oversize_release(&self, request: &super::malloc::Request, plan: &mut ReleasePlan) -> bool {
        let max_split = self.config.max_split_size_raw();
        if max_split == u64::MAX {
            return false;
        }
        let stream = request.stream;
        let key_size = request.size.max(max_split);
        let tree = &self.pool(request.slot, request.pool).free;
        let whole = |id: u32| !self.blocks[id].expandable && !self.blocks[id].is_split();
        let mut found = tree.lower_bound(stream, key_size);
        while let Some(id) = found.filter(|id| plan.gone.contains(id)) {
            found = tree.successor(&self.blocks, id);
        }
        if let Some(id) = found
            && self.blocks[id].stream == stream
            && whole(id)
        {
            plan.release(id, self.blocks[id].size);
            return true;
        }
        let mut cursor = match found {
            Some(id) => tree.predecessor(&self.blocks, id),
            None => tree.last_below(stream, key_size),
        };
        let mut released = 0u64;
        while let Some(id) = cursor {
            if plan.gone.contains(&id) {
                cursor = tree.predecessor(&self.blocks, id);
                continue;
            }
            let b = &self.blocks[id];
            if released >= key_size || b.size < max_split || b.stream != stream {
                break;
            }
            cursor = tree.predecessor(&self.blocks, id);
            if whole(id) {
                released += b.size;
                plan.release(id, b.size);
            }
        }
        released >= key_size
    }

    /// Whether `alloc_block` would serve the request after the planned releases, and how many
    /// of `pieces` (the expandable pages it maps, [`Self::pieces_to_map`]) are mapped then,
    /// `mapped` of them by refused allocations before: the fraction's allowance (over the
    /// device bytes those hold too), then the device's room for a new segment, or for each
    /// piece in turn. A refused piece leaves those before it mapped.
    fn plan_device_allocation(
        &self,
        request: &super::malloc::Request,
        plan: &ReleasePlan,
        device_free: u64,
        pieces: &[Piece],
        mapped: usize,
    ) -> (bool, usize) {
        let mapped_bytes: u64 = pieces[..mapped].iter().map(|piece| piece.bytes).sum();
        let total = self.total_allocated_memory + mapped_bytes - plan.bytes;
        if let Some(allowed) = self.allowed_memory_maximum
            && total.saturating_add(request.alloc_size) > allowed
        {
            return (false, mapped);
        }
        // The device's free bytes, less what the pieces mapped before took.
        let mut room = device_free.saturating_add(plan.bytes) - mapped_bytes;
        if !request.expandable {
            return (request.alloc_size <= room, mapped);
        }
        let mut now = mapped;
        while let Some(piece) = pieces.get(now).filter(|piece| piece.bytes <= room) {
            room -= piece.bytes;
            now += 1;
        }
        (now == pieces.len(), now)
    }

    /// The pieces `try_allocate_expandable_block` would map for `request`, in order, read off
    /// the blocks rule 4's give-backs leave (`view`): one per hole of the run
    /// `find_expandable_block` chooses (each but the last mapped whole), until the free block
    /// grown from there holds the request; or the first pages of a new reservation ([`NIL`]),
    /// all of it where it is smaller than the request (which no second piece then completes:
    /// one of all the device's bytes stands for it).
    fn pieces_to_map(&self, request: &super::malloc::Request, view: &CutView<'_, B>) -> Vec<Piece> {
        let size = request.size;
        let Some(start) = view.room(request) else {
            let (page, reserved) = (self.expandable_page_size(request.pool), self.reservation_size(request.pool));
            return match size <= reserved {
                true => vec![Piece { hole: NIL, bytes: size.div_ceil(page) * page }],
                false => vec![Piece { hole: NIL, bytes: reserved }, Piece { hole: NIL, bytes: u64::MAX }],
            };
        };
        // The free part grown so far, and the hole after it: the candidate itself when
        // unmapped, else the one after it (the run alternates free and unmapped parts).
        let (mut have, mut cursor) = match view.span(start) {
            (_, _, false) => (0, Some(start)),
            (_, bytes, true) => (bytes, view.next(start)),
        };
        let mut pieces = Vec::new();
        while have < size {
            let Some(hole @ Part::Hole(first)) = cursor else {
                debug_assert!(false, "the run offers the request's bytes");
                break;
            };
            let (ptr, hole_size, _) = view.span(hole);
            let to_map = (size - have).min(hole_size);
            let (base, page) = self.segment_pages(self.blocks[first].segment);
            let bytes = ((ptr + to_map - base).div_ceil(page) - (ptr - base) / page) * page;
            pieces.push(Piece { hole: first, bytes });
            have += bytes;
            // Wholly mapped, the piece joins the free part after it.
            cursor = view.next(hole);
            if let Some(next) = cursor.filter(|&next| bytes == hole_size && view.is_allocatable(next)) {
                let (_, next_size, mapped) = view.span(next);
                if mapped {
                    have += next_size;
                    cursor = view.next(next);
                }
            }
        }
        pieces
    }
}

/// What [`CachingAllocator::plan_malloc_releases`] finds.
#[derive(Clone, Copy, Debug)]
struct PlannedReleases {
    /// The segments and page runs the malloc releases.
    releases: u64,
    /// Whether the step that serves it allocates and maps nothing.
    in_place: bool,
}

/// One piece of the pages a malloc maps ([`CachingAllocator::pieces_to_map`]).
#[derive(Clone, Copy, Debug)]
struct Piece {
    /// The hole mapped from its start, named by its lowest block ([`Part::Hole`]; [`NIL`]: a
    /// new reservation's).
    hole: u32,
    /// Bytes mapped.
    bytes: u64,
}
