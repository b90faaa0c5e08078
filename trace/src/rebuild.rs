//! The allocator's segments, blocks and `memory_stats()` rebuilt from a recorded trace, entry
//! by entry, without running the allocator.
//!
//! A trace says *what* happened (`alloc` at an address, `free_completed`, `segment_alloc`, ...)
//! but not the block sizes: an `alloc` carries the requested bytes, and whether the free block
//! it came from was split depends on the state. [`PoolState::apply`] applies each entry with
//! PyTorch 2.11's rules, taken from `cachalot-core` (`round_size`, `should_split`, and the stat
//! updates of [`MemoryStats`]'s `count_*` methods), plus the merging of free neighbours, so the
//! state it rebuilds is the allocator's, block for block. A trace made under cachalot's own
//! policy (`policy:cachalot`) is rebuilt with that policy's rounding and splitting
//! ([`Rules::policy`]). Expandable segments are kept the way
//! `torch.cuda.memory_snapshot()` reports them: one segment per contiguous mapped range.
//!
//! # Why a second model beside the allocator
//!
//! Replaying the *calls* of a trace through `CachingAllocator` ([`crate::replay`]) answers
//! "what would cachalot do"; a viewer of a recording must answer "what happened", and the two
//! differ where the policy cannot reproduce the recording:
//!
//! - traces of other PyTorch versions, of private MemPools and CUDA-graph pools, or with
//!   settings the simulator lacks: the replay diverges, the recording stays true;
//! - traces whose start the ring buffer of `_record_memory_history(max_entries)` dropped: the
//!   replay refuses them (a free of memory it never allocated), while [`PoolState::before`]
//!   walks the trace backwards from the snapshot's end state to the state before its first
//!   entry;
//! - states *between* the entries of one allocator call (after a `segment_alloc`, before the
//!   `alloc` it was made for; between a `free_requested` and its `free_completed`): the
//!   allocator changes state one call at a time, the rebuild one entry at a time.
//!
//! It holds no policy of its own: it never chooses a block or a segment, it only applies the
//! consequences the trace records. `trace/tests/rebuild_matches_core.rs` checks it against the
//! allocator on every reference trace, at many points of each.

use std::collections::BTreeMap;

use cachalot_core::size::{MIN_BLOCK_SIZE, PoolKind, RoundupDivisions, SMALL_BUFFER, SMALL_SIZE, round_size};
use cachalot_core::{
    AllocatorConfig, BlockState, ContextId, MemoryStats, Policy, SegmentSnapshot, StreamId, TraceAction, TraceEntry,
};

/// "No trace entry" in the `event` fields.
pub const NO_EVENT: u32 = u32::MAX;

/// The allocator rules the rebuild needs (from the run's configuration).
#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    /// `roundup_power2_divisions`.
    pub divisions: RoundupDivisions,
    /// `max_split_size` in bytes, `u64::MAX` when unlimited.
    pub max_split: u64,
    /// `expandable_segments`.
    pub expandable: bool,
    /// Segment size of the large pool below 10 MiB requests (20 MiB by default).
    pub large_segment_size: u64,
    /// Whether the garbage collector may run (a threshold and a memory fraction are set); used
    /// only to tell the retry chain's releases apart.
    pub gc_possible: bool,
    /// The policy whose rounding and splitting the trace was made with: PyTorch's, or
    /// cachalot's own (`policy:cachalot`: 512-byte rounding, every remainder of 512 B or more
    /// split off, `docs/allocator-rules.md` §24).
    pub policy: Policy,
}

impl Default for Rules {
    fn default() -> Self {
        Rules::from_config(&AllocatorConfig::default())
    }
}

impl Rules {
    /// The rules of an allocator configuration.
    pub fn from_config(config: &AllocatorConfig) -> Self {
        Rules {
            divisions: *config.roundup_power2_divisions(),
            max_split: config.max_split_size().unwrap_or(u64::MAX),
            expandable: config.expandable_segments(),
            large_segment_size: config.large_segment_size(),
            gc_possible: config.garbage_collection_threshold() > 0.0,
            policy: config.policy(),
        }
    }

    /// The block size the policy rounds a request of `size` bytes to.
    pub fn round(&self, size: u64) -> u64 {
        match self.policy {
            Policy::PyTorch => round_size(size, &self.divisions),
            Policy::Cachalot => size.max(1).div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE,
        }
    }

    fn is_oversize(&self, size: u64) -> bool {
        size >= self.max_split
    }

    /// `should_split` for a free block of `block_size` serving a rounded request, in a segment
    /// of mapped pages or not (`mapped`).
    fn should_split(&self, pool: PoolKind, mapped: bool, block_size: u64, rounded: u64) -> bool {
        match self.policy {
            Policy::PyTorch => {
                cachalot_core::size::should_split(pool, self.expandable, self.max_split, block_size, rounded)
            }
            // Every remainder that holds a block, except that oversize requests outside pages
            // keep PyTorch's meaning of never splitting.
            Policy::Cachalot => {
                block_size.saturating_sub(rounded) >= MIN_BLOCK_SIZE && (mapped || rounded < self.max_split)
            }
        }
    }

    /// The pool of a new segment or mapping, when no allocation follows to tell.
    pub fn pool_for_segment(&self, action: TraceAction, size: u64) -> PoolKind {
        let small = match action {
            TraceAction::SegmentMap => size < self.large_segment_size,
            _ => size == SMALL_BUFFER,
        };
        if small { PoolKind::Small } else { PoolKind::Large }
    }
}

/// One block of a [`Segment`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// Address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Requested bytes (stale for free blocks, as PyTorch reports it).
    pub requested: u64,
    /// Allocated, pending free (waiting for another stream) or free.
    pub state: BlockState,
    /// The trace entry that allocated the block ([`NO_EVENT`] for free blocks and blocks that
    /// predate the trace).
    pub event: u32,
    /// Stack of the allocation.
    pub context: Option<ContextId>,
}

impl Block {
    fn free(address: u64, size: u64, requested: u64) -> Self {
        Block { address, size, requested, state: BlockState::Inactive, event: NO_EVENT, context: None }
    }

    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.address + self.size
    }

    /// Whether it is free in the cache.
    pub fn is_free(&self) -> bool {
        self.state == BlockState::Inactive
    }
}

/// A segment (or, for expandable segments, one contiguous mapped range) and its blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Address of the first block.
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// Stream it belongs to.
    pub stream: StreamId,
    /// Small or large pool.
    pub pool: PoolKind,
    /// Part of an expandable segment.
    pub expandable: bool,
    /// The trace entry that created it ([`NO_EVENT`] if it predates the trace).
    pub event: u32,
    /// Stack of the creation.
    pub context: Option<ContextId>,
    /// Blocks in address order, tiling the segment.
    pub blocks: Vec<Block>,
}

impl Segment {
    /// The segment entry `e` (an alloc, a free seen backwards, or a map) creates: one free block
    /// over all of it, made by trace entry `event`.
    fn from_entry(e: &TraceEntry, pool: PoolKind, expandable: bool, event: u32) -> Self {
        Segment {
            address: e.addr,
            size: e.size,
            stream: e.stream,
            pool,
            expandable,
            event,
            context: e.context,
            blocks: vec![Block::free(e.addr, e.size, 0)],
        }
    }

    /// A segment as a snapshot recorded it (blocks made by no entry of the trace).
    pub fn from_snapshot(s: &SegmentSnapshot) -> Self {
        Segment {
            address: s.address,
            size: s.total_size,
            stream: s.stream,
            pool: s.pool,
            expandable: s.is_expandable,
            event: NO_EVENT,
            context: s.context,
            blocks: s
                .blocks
                .iter()
                .map(|b| Block {
                    address: b.address,
                    size: b.size,
                    requested: b.requested_size,
                    state: b.state,
                    event: NO_EVENT,
                    context: b.context,
                })
                .collect(),
        }
    }

    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.address + self.size
    }

    /// Bytes of allocated blocks.
    pub fn allocated(&self) -> u64 {
        self.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated).map(|b| b.size).sum()
    }

    /// Bytes of allocated and pending-free blocks.
    pub fn active(&self) -> u64 {
        self.blocks.iter().filter(|b| !b.is_free()).map(|b| b.size).sum()
    }

    /// Requested bytes of active blocks.
    pub fn requested(&self) -> u64 {
        self.blocks.iter().filter(|b| !b.is_free()).map(|b| b.requested).sum()
    }

    /// Whether the segment holds more than one block (its free blocks are "inactive split").
    pub fn is_split(&self) -> bool {
        self.blocks.len() > 1
    }

    /// Index of the block that contains `address`.
    pub fn block_index(&self, address: u64) -> Option<usize> {
        let i = self.blocks.partition_point(|b| b.end() <= address);
        (i < self.blocks.len() && self.blocks[i].address <= address).then_some(i)
    }
}

/// Something in a trace that does not fit the state rebuilt so far (an entry about a block
/// that was never allocated, say). The entry is skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Anomaly {
    /// Index of the entry.
    pub index: u32,
    /// What did not fit.
    pub message: String,
}

/// The allocator at one moment: segments by address and `memory_stats()`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolState {
    /// Segments (mapped ranges of expandable segments) by address.
    pub segments: BTreeMap<u64, Segment>,
    /// `memory_stats()`.
    pub stats: MemoryStats,
    /// Number of blocks in all segments.
    pub block_count: usize,
}

/// Why no block fits an entry: its address is outside every segment, or no block of the state
/// it needs starts there.
enum Miss {
    NoSegment,
    NoBlock,
}

/// The pool a `segment_alloc` / `segment_map` at `trace[i]` was made for: the pool of the
/// allocation that follows its run of segment creations (`None` if none follows, yet).
fn pool_hint(trace: &[TraceEntry], i: usize, rules: &Rules) -> Option<PoolKind> {
    trace[i..]
        .iter()
        .find(|e| !matches!(e.action, TraceAction::SegmentAlloc | TraceAction::SegmentMap))
        .filter(|e| e.action == TraceAction::Alloc)
        .map(|e| PoolKind::for_size(rules.round(e.size)))
}

/// The free remainders of free block `block` when `start..end` (inside it) leaves it, with the
/// stale requested size `requested`.
fn free_remainders(block: &Block, start: u64, end: u64, requested: u64) -> (Option<Block>, Option<Block>) {
    let before = (block.address < start).then(|| Block::free(block.address, start - block.address, requested));
    let after = (end < block.end()).then(|| Block::free(end, block.end() - end, requested));
    (before, after)
}

impl PoolState {
    /// An empty allocator whose stats report `max_split_size` as `rules` say.
    pub fn empty(rules: &Rules) -> Self {
        let mut state = PoolState::default();
        state.stats.max_split_size = if rules.max_split == u64::MAX { -1 } else { rules.max_split as i64 };
        state
    }

    /// The state before the first entry of `trace`, found by walking it backwards from the
    /// `end` state a snapshot recorded (for a trace whose start was dropped). Blocks still
    /// live at the end keep their recorded sizes. A block allocated before the trace and freed
    /// during it gets its rounded request plus whatever free end its allocation provably did
    /// not split off; a free end of more than 1 MiB stays free, since the trace cannot tell it
    /// from a free neighbour. The stale requested sizes of free blocks are guesses. Stats are
    /// recounted from the blocks: peaks are the current values and accumulated totals zero,
    /// the history before the trace being gone.
    pub fn before(trace: &[TraceEntry], end: &[SegmentSnapshot], rules: &Rules) -> Self {
        let mut state = PoolState::empty(rules);
        for s in end {
            state.segments.insert(s.address, Segment::from_snapshot(s));
            state.block_count += s.blocks.len();
        }
        for e in trace.iter().rev() {
            state.undo(e, rules);
        }
        state.absorb_unsplit_ends(rules);
        state.recount_stats(rules);
        state
    }

    /// Gives the blocks of [`PoolState::before`] whose size was estimated by rounding the free
    /// remainder after them that their allocation cannot have split off: in the large pool of
    /// ordinary segments a split leaves more than [`SMALL_SIZE`] free and every freed block is
    /// larger, so a free block of at most that size after an active one is the active block's
    /// unsplit end; and a segment of at least `max_split_size` serves only requests of that
    /// size, which never split, so it holds one block. A larger remainder stays free: the
    /// block's unsplit end and a free neighbour after it cannot be told apart.
    fn absorb_unsplit_ends(&mut self, rules: &Rules) {
        for segment in self.segments.values_mut().filter(|s| s.pool == PoolKind::Large && !s.expandable) {
            let unsplittable = rules.is_oversize(segment.size);
            let mut i = 1;
            while i < segment.blocks.len() {
                let block = &segment.blocks[i];
                if block.is_free() && (unsplittable || block.size <= SMALL_SIZE) && Self::give_to_previous(segment, i) {
                    self.block_count -= 1;
                } else {
                    i += 1;
                }
            }
        }
    }

    /// Merges free block `i` into the active block before it, as its unsplit end; returns
    /// whether there was such a block.
    fn give_to_previous(segment: &mut Segment, i: usize) -> bool {
        if i == 0 || !segment.blocks[i].is_free() || segment.blocks[i - 1].is_free() {
            return false;
        }
        let end = segment.blocks.remove(i);
        segment.blocks[i - 1].size += end.size;
        true
    }

    /// The segment that contains `address`.
    pub fn segment_at(&self, address: u64) -> Option<&Segment> {
        self.segment_key(address).and_then(|k| self.segments.get(&k))
    }

    fn segment_key(&self, address: u64) -> Option<u64> {
        self.segments.range(..=address).next_back().filter(|(_, s)| address < s.end()).map(|(k, _)| *k)
    }

    /// The block that contains `address`, with its segment.
    pub fn block_at(&self, address: u64) -> Option<(&Segment, &Block)> {
        let segment = self.segment_at(address)?;
        let block = &segment.blocks[segment.block_index(address)?];
        Some((segment, block))
    }

    /// The segment and index of the block that contains `address`.
    fn block_at_mut(&mut self, address: u64) -> Result<(&mut Segment, usize), Miss> {
        let key = self.segment_key(address).ok_or(Miss::NoSegment)?;
        let segment = self.segments.get_mut(&key).ok_or(Miss::NoSegment)?;
        let i = segment.block_index(address).ok_or(Miss::NoBlock)?;
        Ok((segment, i))
    }

    /// The segment and index of the block in `state` that starts at `address`.
    fn block_starting_at(&mut self, address: u64, state: BlockState) -> Result<(&mut Segment, usize), Miss> {
        let (segment, i) = self.block_at_mut(address)?;
        let b = &segment.blocks[i];
        if b.address == address && b.state == state { Ok((segment, i)) } else { Err(Miss::NoBlock) }
    }

    /// Applies `trace[i]`, with the pool of a segment creation taken from the allocation that
    /// follows it in `trace`.
    pub fn apply_entry(&mut self, trace: &[TraceEntry], i: usize, rules: &Rules) -> Result<(), Anomaly> {
        let e = &trace[i];
        let hint = match e.action {
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => pool_hint(trace, i, rules),
            _ => None,
        };
        self.apply(i as u32, e, hint, rules)
    }

    /// Applies trace entry number `index`. `pool` is the pool of the allocation that a
    /// `segment_alloc` / `segment_map` was made for (the next `alloc` of the trace), if known.
    pub fn apply(&mut self, index: u32, e: &TraceEntry, pool: Option<PoolKind>, rules: &Rules) -> Result<(), Anomaly> {
        let fail = |message: String| Anomaly { index, message };
        match e.action {
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
                if self.segment_at(e.addr).is_some() || e.size == 0 {
                    let what = if e.action == TraceAction::SegmentMap { "mapped memory" } else { "a live segment" };
                    return Err(fail(format!("{} at {:#x} overlaps {what}", e.action.name(), e.addr)));
                }
                let pool = pool.unwrap_or_else(|| rules.pool_for_segment(e.action, e.size));
                let whole_segment = e.action == TraceAction::SegmentAlloc;
                if whole_segment {
                    self.segments.insert(e.addr, Segment::from_entry(e, pool, false, index));
                    self.block_count += 1;
                } else {
                    self.map(index, e, pool);
                }
                let oversize = whole_segment && rules.is_oversize(e.size);
                self.stats.count_device_alloc(pool, e.size, whole_segment, oversize);
            }
            TraceAction::SegmentFree => {
                let segment = self
                    .segments
                    .get(&e.addr)
                    .filter(|s| !s.expandable && s.blocks.len() == 1 && s.blocks[0].is_free())
                    .ok_or_else(|| fail(format!("segment_free of {:#x}, which is not a free segment", e.addr)))?;
                let (pool, size) = (segment.pool, segment.size);
                self.segments.remove(&e.addr);
                self.block_count -= 1;
                self.stats.count_device_free(pool, size, true, rules.is_oversize(size));
            }
            TraceAction::SegmentUnmap => {
                let pool = self.unmap(e.addr, e.size).map_err(fail)?;
                self.stats.count_device_free(pool, e.size, false, false);
            }
            TraceAction::Alloc => self.alloc(index, e, rules).map_err(fail)?,
            TraceAction::FreeRequested => {
                let Ok((segment, i)) = self.block_starting_at(e.addr, BlockState::ActiveAllocated) else {
                    return Err(fail(format!("free_requested of {:#x}, which is not allocated", e.addr)));
                };
                let pool = segment.pool;
                let block = &mut segment.blocks[i];
                block.state = BlockState::ActivePendingFree;
                let size = block.size;
                self.stats.count_free_requested(pool, size, rules.is_oversize(size));
            }
            TraceAction::FreeCompleted => self.free_completed(e.addr).map_err(fail)?,
            TraceAction::Oom => self.stats.num_ooms += 1,
            TraceAction::Snapshot => {}
        }
        Ok(())
    }

    /// `alloc_found_block`: the free block at the entry's address serves the request, split if
    /// `should_split` says so (the tail keeps the free block's stale requested size).
    fn alloc(&mut self, index: u32, e: &TraceEntry, rules: &Rules) -> Result<(), String> {
        if e.size == 0 {
            return Ok(()); // PyTorch hands out an empty pointer without touching the cache
        }
        let (segment, i) = self.block_starting_at(e.addr, BlockState::Inactive).map_err(|miss| match miss {
            Miss::NoSegment => format!("alloc at {:#x}, outside every segment", e.addr),
            Miss::NoBlock => format!("alloc at {:#x}, where no free block starts", e.addr),
        })?;
        let rounded = rules.round(e.size);
        let (pool, expandable, already_split) = (segment.pool, segment.expandable, segment.is_split());
        let free_size = segment.blocks[i].size;
        if free_size < rounded {
            return Err(format!("alloc of {} B at {:#x} into a free block of {free_size} B", e.size, e.addr));
        }
        let split = rules.should_split(pool, expandable, free_size, rounded);
        let mut new_blocks = 0;
        if split
            && let (_, Some(tail)) =
                free_remainders(&segment.blocks[i], e.addr, e.addr + rounded, segment.blocks[i].requested)
        {
            segment.blocks[i].size = rounded;
            segment.blocks.insert(i + 1, tail);
            new_blocks = 1;
        }
        let block = &mut segment.blocks[i];
        block.state = BlockState::ActiveAllocated;
        block.requested = e.size;
        block.event = index;
        block.context = e.context;
        let size = block.size;
        self.block_count += new_blocks;
        self.stats.count_split_on_alloc(pool, expandable, already_split, split, free_size, rounded);
        self.stats.count_alloc(pool, size, e.size, rules.is_oversize(size));
        Ok(())
    }

    /// `free_block`: the block goes back to the cache and merges with free neighbours; the
    /// inactive-split stats move by the net change, as one increase or one decrease.
    fn free_completed(&mut self, address: u64) -> Result<(), String> {
        let (segment, i) =
            self.block_starting_at(address, BlockState::ActivePendingFree).map_err(|miss| match miss {
                Miss::NoSegment => format!("free_completed of {address:#x}, outside every segment"),
                Miss::NoBlock => format!("free_completed of {address:#x}, which was not freed"),
            })?;
        let (pool, expandable) = (segment.pool, segment.expandable);
        let (original, requested) = (segment.blocks[i].size, segment.blocks[i].requested);
        segment.blocks[i].state = BlockState::Inactive;
        segment.blocks[i].event = NO_EVENT;
        segment.blocks[i].context = None;
        let (i, merged_blocks, merged_bytes) = Self::merge_free_neighbours(segment, i);
        let mut net_blocks = -(merged_blocks as i64);
        let mut net_bytes = -(merged_bytes as i64);
        if segment.is_split() {
            net_blocks += 1;
            net_bytes += segment.blocks[i].size as i64;
        }
        self.block_count -= merged_blocks;
        let split_net = (!expandable).then_some((net_blocks, net_bytes));
        self.stats.count_free_completed(pool, original, requested, split_net);
        Ok(())
    }

    /// Merges the free block `i` with its free neighbours; returns its new index and the
    /// number and bytes of the neighbours it absorbed.
    fn merge_free_neighbours(segment: &mut Segment, mut i: usize) -> (usize, usize, u64) {
        let (mut blocks, mut bytes) = (0, 0);
        if i > 0 && segment.blocks[i - 1].is_free() {
            let prev = segment.blocks.remove(i - 1);
            i -= 1;
            segment.blocks[i].address = prev.address;
            segment.blocks[i].size += prev.size;
            (blocks, bytes) = (blocks + 1, bytes + prev.size);
        }
        if i + 1 < segment.blocks.len() && segment.blocks[i + 1].is_free() {
            let next = segment.blocks.remove(i + 1);
            segment.blocks[i].size += next.size;
            (blocks, bytes) = (blocks + 1, bytes + next.size);
        }
        (i, blocks, bytes)
    }

    /// `map_block`: a new free mapped range, joined with the mapped ranges of the same
    /// reservation right before and after it (free blocks at the seams merge).
    fn map(&mut self, index: u32, e: &TraceEntry, pool: PoolKind) {
        let joins = |s: &Segment| s.expandable && s.stream == e.stream && s.pool == pool;
        let mut segment = Segment::from_entry(e, pool, true, index);
        self.block_count += 1;
        let before = self.segments.range(..e.addr).next_back().filter(|(_, s)| s.end() == e.addr && joins(s));
        if let Some(&key) = before.map(|(k, _)| k)
            && let Some(mut prev) = self.segments.remove(&key)
        {
            self.block_count -= Self::append(&mut prev, segment, true);
            segment = prev;
        }
        let after = e.addr + e.size;
        if self.segments.get(&after).is_some_and(joins)
            && let Some(next) = self.segments.remove(&after)
        {
            self.block_count -= Self::append(&mut segment, next, false);
        }
        self.segments.insert(segment.address, segment);
    }

    /// Appends `next` (which starts where `segment` ends); returns how many blocks merged away.
    /// Free blocks at the seam merge into the block of the newly mapped pages (`new_is_next`
    /// says which side that is), which keeps its stale requested size, as `map_block` does.
    fn append(segment: &mut Segment, next: Segment, new_is_next: bool) -> usize {
        segment.size += next.size;
        let mut blocks = next.blocks.into_iter();
        let mut merged = 0;
        if let (Some(last), Some(first)) = (segment.blocks.last_mut(), blocks.as_slice().first())
            && last.is_free()
            && first.is_free()
        {
            last.size += first.size;
            if new_is_next {
                last.requested = first.requested;
            }
            blocks.next();
            merged = 1;
        }
        segment.blocks.extend(blocks);
        merged
    }

    /// `unmap_block`: the range leaves the free block that holds it, splitting its mapped range.
    fn unmap(&mut self, address: u64, size: u64) -> Result<PoolKind, String> {
        let fail = || format!("segment_unmap of {size} B at {address:#x}, which is not free mapped memory");
        let key = self.segment_key(address).ok_or_else(fail)?;
        let Some(mut segment) = self.segments.remove(&key) else { return Err(fail()) };
        let Some(i) = segment.block_index(address).filter(|&i| {
            let b = &segment.blocks[i];
            b.is_free() && address + size <= b.end()
        }) else {
            self.segments.insert(key, segment);
            return Err(fail());
        };
        let pool = segment.pool;
        let block = segment.blocks.remove(i);
        self.block_count -= 1;
        let mut tail_blocks = segment.blocks.split_off(i);
        // The pages leave in the block object; the mapped rests are new blocks (requested 0).
        let (before, after) = free_remainders(&block, address, address + size, 0);
        self.block_count += usize::from(before.is_some()) + usize::from(after.is_some());
        segment.blocks.extend(before);
        if let Some(after) = after {
            tail_blocks.insert(0, after);
        }
        let end = segment.end();
        if !tail_blocks.is_empty() {
            let tail = Segment {
                address: address + size,
                size: end - address - size,
                blocks: tail_blocks,
                event: NO_EVENT,
                context: None,
                ..segment.clone()
            };
            self.segments.insert(tail.address, tail);
        }
        if !segment.blocks.is_empty() {
            segment.size = address - segment.address;
            self.segments.insert(segment.address, segment);
        }
        Ok(pool)
    }

    /// Whether any ordinary segment is entirely free (a full release would have freed it).
    pub fn has_whole_free_segment(&self) -> bool {
        self.segments.values().any(|s| !s.expandable && s.blocks.len() == 1 && s.blocks[0].is_free())
    }

    /// Recounts the current value of every stat from the blocks (for a state that was not
    /// reached by replaying from empty); peaks become the current values and the accumulated
    /// totals zero, as after `reset_peak_memory_stats` and `reset_accumulated_memory_stats`.
    fn recount_stats(&mut self, rules: &Rules) {
        let mut s = PoolState::empty(rules).stats;
        let mut blocks = 0;
        for segment in self.segments.values() {
            let pool = segment.pool;
            blocks += segment.blocks.len();
            let whole_segment = !segment.expandable;
            s.count_device_alloc(pool, segment.size, whole_segment, whole_segment && rules.is_oversize(segment.size));
            for b in &segment.blocks {
                // A pending free is a block allocated and then free-requested.
                if !b.is_free() {
                    s.count_alloc(pool, b.size, b.requested, rules.is_oversize(b.size));
                }
                if b.state == BlockState::ActivePendingFree {
                    s.count_free_requested(pool, b.size, rules.is_oversize(b.size));
                }
                if b.is_free() && segment.is_split() && !segment.expandable {
                    s.inactive_split.increase(pool, 1);
                    s.inactive_split_bytes.increase(pool, b.size);
                }
            }
        }
        s.reset_peak();
        s.reset_accumulated();
        self.stats = s;
        self.block_count = blocks;
    }

    /// Undoes entry `e` (walking a trace backwards from its end state, for
    /// [`PoolState::before`]). The block of a completed free gets the rounded requested size
    /// (see [`PoolState::absorb_unsplit_ends`] for what it may have had beyond).
    fn undo(&mut self, e: &TraceEntry, rules: &Rules) {
        match e.action {
            TraceAction::Alloc => {
                if let Ok((segment, mut i)) = self.block_at_mut(e.addr) {
                    // An allocation takes the start of a free block, so the block before it was
                    // active: a free block there is the unsplit end of the one before that,
                    // whose size was estimated.
                    let absorbed = i >= 1 && Self::give_to_previous(segment, i - 1);
                    i -= usize::from(absorbed);
                    segment.blocks[i].state = BlockState::Inactive;
                    segment.blocks[i].event = NO_EVENT;
                    let (_, merged, _) = Self::merge_free_neighbours(segment, i);
                    self.block_count -= merged + usize::from(absorbed);
                }
            }
            TraceAction::FreeRequested => {
                if let Ok((segment, i)) = self.block_at_mut(e.addr)
                    && segment.blocks[i].state == BlockState::ActivePendingFree
                {
                    segment.blocks[i].state = BlockState::ActiveAllocated;
                }
            }
            TraceAction::FreeCompleted => {
                let Ok((segment, i)) = self.block_at_mut(e.addr) else { return };
                if !segment.blocks[i].is_free() {
                    return;
                }
                let free = segment.blocks.remove(i);
                let size = rules.round(e.size).clamp(1, free.end() - e.addr);
                let (before, after) = free_remainders(&free, e.addr, e.addr + size, free.requested);
                let remainders = usize::from(before.is_some()) + usize::from(after.is_some());
                let freed = Block {
                    address: e.addr,
                    size,
                    requested: e.size,
                    state: BlockState::ActivePendingFree,
                    event: NO_EVENT,
                    context: e.context,
                };
                segment.blocks.splice(i..i, before.into_iter().chain([freed]).chain(after));
                self.block_count += remainders;
            }
            TraceAction::SegmentAlloc => {
                if let Some(segment) = self.segments.remove(&e.addr) {
                    self.block_count -= segment.blocks.len();
                }
            }
            TraceAction::SegmentFree => {
                if self.segment_at(e.addr).is_none() {
                    let pool = rules.pool_for_segment(e.action, e.size);
                    self.segments.insert(e.addr, Segment::from_entry(e, pool, false, NO_EVENT));
                    self.block_count += 1;
                }
            }
            TraceAction::SegmentMap => {
                let _ = self.unmap(e.addr, e.size);
            }
            TraceAction::SegmentUnmap => {
                if self.segment_at(e.addr).is_none() {
                    let pool = rules.pool_for_segment(TraceAction::SegmentMap, e.size);
                    self.map(NO_EVENT, e, pool);
                }
            }
            TraceAction::Oom | TraceAction::Snapshot => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(action: TraceAction, addr: u64, size: u64) -> TraceEntry {
        TraceEntry { action, addr, size, stream: StreamId::DEFAULT, time_us: 0, context: None, annotation: None }
    }

    #[test]
    fn splits_and_merges_like_pytorch() {
        let rules = Rules::default();
        let mut s = PoolState::empty(&rules);
        let base = 0x7f00_0000_0000;
        s.apply(0, &entry(TraceAction::SegmentAlloc, base, 20 << 20), None, &rules).unwrap();
        s.apply(1, &entry(TraceAction::Alloc, base, 3 << 20), None, &rules).unwrap();
        assert_eq!(s.segments[&base].blocks.len(), 2);
        assert_eq!(s.stats.inactive_split_bytes.all().current, 17 << 20);
        s.apply(2, &entry(TraceAction::Alloc, base + (3 << 20), (16 << 20) + 1), None, &rules).unwrap();
        // 17 MiB free, 16 MiB + 512 asked: the remainder of just under 1 MiB is not split off.
        assert_eq!(s.segments[&base].blocks[1].size, 17 << 20);
        assert_eq!(s.stats.inactive_split.all().current, 0);
        s.apply(3, &entry(TraceAction::FreeRequested, base, 3 << 20), None, &rules).unwrap();
        assert_eq!(s.stats.allocated_bytes.all().current, 17 << 20);
        assert_eq!(s.stats.active_bytes.all().current, 20 << 20);
        s.apply(4, &entry(TraceAction::FreeCompleted, base, 3 << 20), None, &rules).unwrap();
        s.apply(5, &entry(TraceAction::FreeRequested, base + (3 << 20), (16 << 20) + 1), None, &rules).unwrap();
        s.apply(6, &entry(TraceAction::FreeCompleted, base + (3 << 20), (16 << 20) + 1), None, &rules).unwrap();
        assert_eq!(s.segments[&base].blocks.len(), 1);
        assert_eq!(s.stats.inactive_split.all().current, 0);
        s.apply(7, &entry(TraceAction::SegmentFree, base, 20 << 20), None, &rules).unwrap();
        assert!(s.segments.is_empty());
        assert_eq!(s.stats.reserved_bytes.all().peak, 20 << 20);
        assert_eq!(s.block_count, 0);
    }

    #[test]
    fn mapped_ranges_join_and_split() {
        let rules = Rules { expandable: true, ..Rules::default() };
        let mut s = PoolState::empty(&rules);
        let base = 0x1000_0000;
        let page = 20 << 20;
        s.apply(0, &entry(TraceAction::SegmentMap, base, page), Some(PoolKind::Large), &rules).unwrap();
        s.apply(1, &entry(TraceAction::Alloc, base, 5 << 20), None, &rules).unwrap();
        s.apply(2, &entry(TraceAction::SegmentMap, base + page, page), Some(PoolKind::Large), &rules).unwrap();
        assert_eq!(s.segments.len(), 1);
        assert_eq!(s.segments[&base].blocks.len(), 2, "the free tail merged with the new pages");
        s.apply(3, &entry(TraceAction::SegmentUnmap, base + page, page), None, &rules).unwrap();
        assert_eq!(s.segments[&base].size, page);
        assert_eq!(s.stats.reserved_bytes.all().current, page as i64);
        assert!(s.apply(4, &entry(TraceAction::SegmentUnmap, base, page), None, &rules).is_err());
        assert_eq!(s.segments.len(), 1, "a refused unmap changes nothing");
    }

    #[test]
    fn bad_entries_are_anomalies_not_panics() {
        let rules = Rules::default();
        let mut s = PoolState::empty(&rules);
        for action in TraceAction::ALL {
            let _ = s.apply(0, &entry(action, 42, 7), None, &rules);
        }
        assert!(s.apply(0, &entry(TraceAction::FreeRequested, 1, 1), None, &rules).is_err());
    }

    #[test]
    fn a_block_freed_after_a_dropped_start_gets_back_its_unsplit_end() {
        use cachalot_core::{CachingAllocator, SimBackend};
        let mut a = CachingAllocator::new(SimBackend::new(1 << 34), AllocatorConfig::default()).unwrap();
        a.record_history(true, usize::MAX, &[], false);
        let _x = a.malloc(3 << 20, StreamId::DEFAULT).unwrap();
        // 17 MiB free, 16 MiB + 512 asked: the block is all 17 MiB, the rest not split off.
        let y = a.malloc((16 << 20) + 1, StreamId::DEFAULT).unwrap();
        let at_cut = a.snapshot();
        let cut = a.trace().len();
        a.free(y).unwrap();
        let rules = Rules::default();
        let before = PoolState::before(&a.trace()[cut..], &a.snapshot(), &rules);
        let rebuilt: Vec<(u64, u64)> =
            before.segments.values().flat_map(|s| s.blocks.iter().map(|b| (b.address, b.size))).collect();
        let recorded: Vec<(u64, u64)> =
            at_cut.iter().flat_map(|s| s.blocks.iter().map(|b| (b.address, b.size))).collect();
        assert_eq!(rebuilt, recorded);
        assert_eq!(before.stats.allocated_bytes.all().current, 20 << 20);
        assert_eq!(before.block_count, 2);
    }
}
