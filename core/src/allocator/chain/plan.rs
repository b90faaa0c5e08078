//! The replay's questions about a malloc, answered by walking the retry chain ([`walk`]) over a
//! model of the device instead of the device: how many segments and pages a malloc made now
//! would release ([`CachingAllocator::releases_of_malloc`]), whether it is then served in
//! place, how many VA reservations a failing one makes, and whether a reservation outlives
//! the full release. Each step's decision is the malloc's own (the policy's give-backs,
//! [`CachingAllocator::garbage_to_collect`], [`CachingAllocator::oversize_to_release`]), taken
//! over an overlay of what the earlier steps took ([`ReleasePlan`]); what this file models is
//! what the device would answer and what the full release would find; where the pages a miss
//! maps go is [`CachingAllocator::pages_to_map`]'s, over the blocks the give-backs would leave
//! (`cuts.rs`).

use std::marker::PhantomData;

use super::cuts::CutView;
use super::{Outcome, Steps, walk};
use crate::allocator::CachingAllocator;
use crate::allocator::expandable::Piece;
use crate::allocator::malloc::Request;
use crate::allocator::policy::{PolicyRules, with_policy};
use crate::backend::{Backend, StreamId};
use crate::block::NIL;
use crate::size::PoolKind;

/// What a `malloc` would give back to the device before it is served, told from the state
/// without making it ([`CachingAllocator::releases_of_malloc`]).
#[derive(Default)]
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
    /// found without making it, by the malloc's own retry chain walked over a model of the
    /// device (`core/src/allocator/chain/`): the cache hit it would take, `policy:cachalot`'s
    /// return of cached memory before a new peak, the garbage collector, the fraction's and the
    /// device's answer to the first device allocation (`device_free`: the bytes the device
    /// would still give), the oversize release and the full release of the retry chain, each
    /// decided as the malloc decides it. Where the last step is reached, the count is every segment and page the
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
    /// and what it leaves is what the later steps find (`cuts.rs`): each block it gives
    /// pages back from cut below them (and above, at a partial page), those pages one unmapped
    /// run with the unmapped blocks beside them, a reservation left with nothing mapped
    /// released. The search for the pages to map runs over those blocks, as
    /// `find_expandable_block` does after the give-backs: under `max_split_size_mb` it may find
    /// room in a free block of the request's own stream that best fit passed over and the miss
    /// gave pages back from. `None` only where the device (`device_free`) would map a whole
    /// new reservation and still be asked for more, which no device does (a reservation spans
    /// 1 1/8 of it).
    pub fn releases_of_malloc(&self, size: u64, stream: StreamId, device_free: u64) -> Option<u64> {
        with_policy!(self.config.policy(), P => self.plan_malloc_releases::<P>(size, stream, device_free, true))
            .map(|planned| planned.releases)
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
        with_policy!(self.config.policy(), P => self.plan_malloc_releases::<P>(size, stream, device_free, false))
            .filter(|planned| planned.in_place)
            .map(|planned| planned.releases)
    }

    /// [`CachingAllocator::releases_of_malloc`], and whether the step that serves the miss
    /// needs no device allocation (an expandable request with no page to map). Without
    /// `count_full_release`, a chain that reaches the full release stops there, uncounted.
    fn plan_malloc_releases<P: PolicyRules>(
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
        let request = P::request(self, size, stream);
        if self.plan_hit::<P>(&request) {
            return Some(none);
        }
        let mut model = Releases::<B, P> {
            allocator: self,
            request,
            plan: ReleasePlan::default(),
            device_free,
            count_full_release,
            pages: None,
            mapped: 0,
            released_all: false,
            policy: PhantomData,
        };
        let outcome = walk(&mut model, self.gc_enabled(), !self.routing.is_empty());
        let releases = model.plan.releases;
        match outcome {
            // Served with nothing to allocate: an expandable request whose room needs no page,
            // before the full release.
            Ok(Outcome::Allocated) => {
                let in_place = request.expandable
                    && !model.released_all
                    && model.pages.as_ref().is_some_and(|(_, pieces)| pieces.is_empty());
                Some(PlannedReleases { releases, in_place })
            }
            Ok(Outcome::OtherPool | Outcome::OutOfMemory) | Err(Stop::Uncounted) => {
                Some(PlannedReleases { releases, in_place: false })
            }
            Err(Stop::Unanswerable) => None,
        }
    }

    /// How many VA reservations a `malloc(size, stream)` made now that runs out of memory
    /// would make on its way (each step of the retry chain that finds no segment of the stream
    /// and pool with room for the request reserves one, and keeps it), found without making it.
    /// The search for room runs over the blocks `policy:cachalot`'s give-backs before a new
    /// peak leave, as in [`CachingAllocator::releases_of_malloc`]. Every state is answered
    /// (`Some`).
    pub fn reservations_of_failing_malloc(&self, size: u64, stream: StreamId) -> Option<u64> {
        with_policy!(self.config.policy(), P => self.plan_failing_reservations::<P>(size, stream))
    }

    fn plan_failing_reservations<P: PolicyRules>(&self, size: u64, stream: StreamId) -> Option<u64> {
        use crate::size::MAX_REQUEST;
        if size == 0 || size >= MAX_REQUEST {
            return Some(0);
        }
        let request = P::request(self, size, stream);
        if !request.expandable || self.plan_hit::<P>(&request) {
            return Some(0);
        }
        let mut model = Reservations::<B, P> {
            allocator: self,
            request,
            plan: ReleasePlan::default(),
            view: None,
            fresh_has_room: size <= self.reservation_size(request.pool),
            made: 0,
            released_all: None,
            policy: PhantomData,
        };
        match walk(&mut model, self.gc_enabled(), !self.routing.is_empty()) {
            Ok(Outcome::OtherPool) => Some(0),
            Ok(Outcome::Allocated | Outcome::OutOfMemory) => Some(model.made),
        }
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
    /// larger whole segment into a miss: [`PolicyRules::keeps_hit`]), as the malloc's
    /// `get_free_block` decides it.
    fn plan_hit<P: PolicyRules>(&self, request: &Request) -> bool {
        self.best_fit(request).is_some_and(|block| P::keeps_hit(self, block, request))
    }

    /// The policy's give-backs before a miss (`policy:cachalot`'s rule 4), planned: the cached
    /// memory the miss gives back, as the policy chooses it for the malloc
    /// ([`PolicyRules::give_backs_before_miss`]), with what each leaves.
    fn plan_give_backs_before_miss<P: PolicyRules>(&self, request: &Request, plan: &mut ReleasePlan) {
        let mut scratch = crate::allocator::policy::GiveBacks::default();
        P::give_backs_before_miss(self, request, &mut scratch);
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
    fn room_after_release(&self, request: &Request) -> bool {
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

    /// Whether `alloc_block` would serve the request after the planned releases, and how many
    /// of `pieces` (the expandable pages it maps, [`Self::pages_to_map`]) are mapped then,
    /// `mapped` of them by refused allocations before: the fraction's allowance (over the
    /// device bytes those hold too), then the device's room for a new segment, or for each
    /// piece in turn. A refused piece leaves those before it mapped.
    fn plan_device_allocation(
        &self,
        request: &Request,
        plan: &ReleasePlan,
        device_free: u64,
        pieces: &[Piece],
        mapped: usize,
    ) -> (bool, usize) {
        let mapped_bytes: u64 = pieces[..mapped].iter().map(|piece| piece.bytes).sum();
        let total = self.total_allocated_memory + mapped_bytes - plan.bytes;
        if !self.fraction_allows(total, request.alloc_size) {
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
}

/// What [`CachingAllocator::plan_malloc_releases`] finds.
#[derive(Clone, Copy, Debug)]
struct PlannedReleases {
    /// The segments and page runs the malloc releases.
    releases: u64,
    /// Whether the step that serves it allocates and maps nothing.
    in_place: bool,
}

/// Why a model's [`walk`] stopped before its end.
enum Stop {
    /// The full release was reached where its count is not asked for.
    Uncounted,
    /// The chain maps a whole new reservation and still asks the device for more, which no
    /// device does: the count is not told.
    Unanswerable,
}

/// The retry chain's steps over a model of the device that has `device_free` bytes to give
/// ([`CachingAllocator::releases_of_malloc`]): what each step releases is counted in `plan`.
struct Releases<'a, B: Backend, P> {
    allocator: &'a CachingAllocator<B>,
    request: Request,
    plan: ReleasePlan,
    device_free: u64,
    /// Whether the full release is counted (or stops the walk, [`Stop::Uncounted`]).
    count_full_release: bool,
    /// The blocks the give-backs leave, and the pieces of pages the device allocations map
    /// there: found at the first allocation, after the steps that change them.
    pages: Option<(CutView<'a, B>, Vec<Piece>)>,
    /// How many of those pieces refused allocations mapped (each stays mapped, free).
    mapped: usize,
    /// Whether the full release was counted: what the last allocation does then releases
    /// nothing more.
    released_all: bool,
    policy: PhantomData<P>,
}

impl<B: Backend, P: PolicyRules> Steps for Releases<'_, B, P> {
    type Error = Stop;

    fn other_pool_block(&mut self) -> Result<bool, Stop> {
        Ok(P::other_pool_block(self.allocator, &self.request).is_some())
    }

    fn give_back_before_miss(&mut self) -> Result<(), Stop> {
        self.allocator.plan_give_backs_before_miss::<P>(&self.request, &mut self.plan);
        Ok(())
    }

    fn collect_garbage(&mut self) -> Result<(), Stop> {
        self.allocator.plan_garbage_collection(&self.request, &mut self.plan);
        Ok(())
    }

    fn allocate(&mut self, _is_retry: bool) -> Result<bool, Stop> {
        if self.released_all {
            return Ok(false);
        }
        let (allocator, request) = (self.allocator, &self.request);
        let (_, pieces) = self.pages.get_or_insert_with(|| {
            let view = CutView::new(allocator, &self.plan.cuts);
            let pieces = if request.expandable { allocator.pages_to_map(request, &view).1 } else { Vec::new() };
            (view, pieces)
        });
        let served;
        (served, self.mapped) =
            allocator.plan_device_allocation(request, &self.plan, self.device_free, pieces, self.mapped);
        Ok(served)
    }

    fn release_oversize(&mut self) -> Result<bool, Stop> {
        Ok(self.allocator.plan_oversize_release(&self.request, &mut self.plan))
    }

    fn release_all(&mut self) -> Result<(), Stop> {
        if !self.count_full_release {
            return Err(Stop::Uncounted);
        }
        // The full release releases all the cache still holds once the outstanding frees have
        // completed, the pages the refused allocations mapped included (free, joined to the
        // block they grew).
        let grown: Vec<u32> = match &self.pages {
            Some((view, pieces)) => {
                let mapped = &pieces[..self.mapped];
                if mapped.iter().any(|piece| piece.hole == NIL) {
                    return Err(Stop::Unanswerable); // a whole new reservation mapped, still too small
                }
                mapped.iter().flat_map(|piece| view.hole_blocks(piece.hole)).collect()
            }
            None => Vec::new(),
        };
        self.plan.releases += self.allocator.releasable_after(&grown, &self.plan).0;
        self.released_all = true;
        Ok(())
    }
}

/// The retry chain's steps of a malloc that runs out of memory
/// ([`CachingAllocator::reservations_of_failing_malloc`]): each allocation is refused, and
/// counts the VA reservation it makes on its way where no segment of the stream and pool has
/// room for the request.
struct Reservations<'a, B: Backend, P> {
    allocator: &'a CachingAllocator<B>,
    request: Request,
    plan: ReleasePlan,
    /// The blocks the give-backs leave: found at the first allocation.
    view: Option<CutView<'a, B>>,
    /// Whether a new reservation has room for the request. Every reservation the chain makes
    /// has the same size: it has room for the request in all, or in none. Pages a failing step
    /// maps stay free, in a run it found, so they change neither which runs have room nor,
    /// once the full release has unmapped them again, the bytes that release leaves reserved.
    fresh_has_room: bool,
    made: u64,
    /// The device bytes released by the full release and the steps before it, once taken.
    released_all: Option<u64>,
    policy: PhantomData<P>,
}

impl<B: Backend, P: PolicyRules> Steps for Reservations<'_, B, P> {
    type Error = std::convert::Infallible;

    fn other_pool_block(&mut self) -> Result<bool, Self::Error> {
        Ok(P::other_pool_block(self.allocator, &self.request).is_some())
    }

    fn give_back_before_miss(&mut self) -> Result<(), Self::Error> {
        self.allocator.plan_give_backs_before_miss::<P>(&self.request, &mut self.plan);
        Ok(())
    }

    fn collect_garbage(&mut self) -> Result<(), Self::Error> {
        self.allocator.plan_garbage_collection(&self.request, &mut self.plan);
        Ok(())
    }

    fn allocate(&mut self, _is_retry: bool) -> Result<bool, Self::Error> {
        let (allocator, request) = (self.allocator, &self.request);
        let within_fraction =
            |released: u64| allocator.fraction_allows(allocator.total_allocated_memory - released, request.alloc_size);
        // A reservation an earlier step made, with room: this step finds the room there.
        let made_with_room = self.made > 0 && self.fresh_has_room;
        let reserves = match self.released_all {
            // The search runs over the blocks the give-backs leave.
            None => {
                let view = self.view.get_or_insert_with(|| CutView::new(allocator, &self.plan.cuts));
                within_fraction(self.plan.bytes) && !made_with_room && view.room(request).is_none()
            }
            // After the full release, which unmapped every free page and released every
            // reservation left with nothing mapped (not one that never had a page mapped). The
            // give-backs change neither which runs have room once every free page is unmapped
            // nor which reservations are released.
            Some(released) => within_fraction(released) && !made_with_room && !allocator.room_after_release(request),
        };
        self.made += u64::from(reserves);
        Ok(false)
    }

    fn release_oversize(&mut self) -> Result<bool, Self::Error> {
        Ok(self.allocator.plan_oversize_release(&self.request, &mut self.plan))
    }

    fn release_all(&mut self) -> Result<(), Self::Error> {
        self.released_all = Some(self.plan.bytes + self.allocator.releasable_after(&[], &self.plan).1);
        Ok(())
    }
}

impl<B: Backend> CachingAllocator<B> {
    /// The garbage collector's step, planned: the blocks [`Self::garbage_to_collect`] takes,
    /// passing over those the earlier steps took, with the collector's clock ticked once more
    /// for the request's search when that is of the default large pool (the malloc's search
    /// ticks it before the chain starts; the plan's does not).
    fn plan_garbage_collection(&self, request: &Request, plan: &mut ReleasePlan) {
        let served_here = request.pool == PoolKind::Large && request.slot == NIL;
        let clock = self.large.free_blocks_call_count + i64::from(served_here);
        let held = self.total_allocated_memory - plan.bytes;
        for id in self.garbage_to_collect(clock, held, |id| plan.gone.contains(&id)) {
            plan.release(id, self.blocks[id].size);
        }
    }

    /// The oversize release, planned: the blocks [`Self::oversize_to_release`] takes, passing
    /// over those the earlier steps took; whether they are enough.
    fn plan_oversize_release(&self, request: &Request, plan: &mut ReleasePlan) -> bool {
        let mut victims = Vec::new();
        let enough = self.oversize_to_release(request, |id| plan.gone.contains(&id), &mut victims);
        for id in victims {
            plan.release(id, self.blocks[id].size);
        }
        enough
    }
}
