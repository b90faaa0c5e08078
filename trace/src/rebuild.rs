//! The allocator's segments, blocks and `memory_stats()` rebuilt from its trace.
//!
//! A trace says *what* happened (`alloc` at an address, `free_completed`, `segment_alloc`, ...)
//! but not the block sizes: an `alloc` carries the requested bytes, and whether the free block
//! it came from was split depends on the state. [`PoolState::apply`] replays each entry with
//! PyTorch 2.11's rules (`round_size`, `should_split`, merging of free neighbours, the
//! inactive-split accounting), so the state it rebuilds is the allocator's, block for block.
//! Expandable segments are kept the way `torch.cuda.memory_snapshot()` reports them: one
//! segment per contiguous mapped range.

use std::collections::BTreeMap;

use cachalot_core::size::{PoolKind, RoundupDivisions, SMALL_BUFFER, round_size};
use cachalot_core::stats::StatArray;
use cachalot_core::{AllocatorConfig, BlockState, ContextId, MemoryStats, StreamId, TraceAction, TraceEntry};

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
        }
    }

    /// The block size PyTorch rounds a request of `size` bytes to.
    pub fn round(&self, size: u64) -> u64 {
        round_size(size, &self.divisions)
    }

    fn is_oversize(&self, size: u64) -> bool {
        size >= self.max_split
    }

    /// `should_split` for a free block of `block_size` serving a rounded request.
    fn should_split(&self, pool: PoolKind, block_size: u64, rounded: u64) -> bool {
        cachalot_core::size::should_split(pool, self.expandable, self.max_split, block_size, rounded)
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

fn pool_add(array: &mut StatArray, pool: PoolKind, delta: i64) {
    if delta > 0 {
        array.increase(pool, delta as u64);
    } else if delta < 0 {
        array.decrease(pool, delta.unsigned_abs());
    }
}

impl PoolState {
    /// An empty allocator whose stats report `max_split_size` as `rules` say.
    pub fn empty(rules: &Rules) -> Self {
        let mut state = PoolState::default();
        state.stats.max_split_size = if rules.max_split == u64::MAX { -1 } else { rules.max_split as i64 };
        state
    }

    /// The segment that contains `address`.
    pub fn segment_at(&self, address: u64) -> Option<&Segment> {
        self.segments.range(..=address).next_back().map(|(_, s)| s).filter(|s| address < s.end())
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

    /// Applies trace entry number `index`. `pool` is the pool of the allocation that a
    /// `segment_alloc` / `segment_map` was made for (the next `alloc` of the trace), if known.
    pub fn apply(&mut self, index: u32, e: &TraceEntry, pool: Option<PoolKind>, rules: &Rules) -> Result<(), Anomaly> {
        let fail = |message: String| Anomaly { index, message };
        match e.action {
            TraceAction::SegmentAlloc => {
                if self.segment_at(e.addr).is_some() || e.size == 0 {
                    return Err(fail(format!("segment_alloc at {:#x} overlaps a live segment", e.addr)));
                }
                let pool = pool.unwrap_or_else(|| rules.pool_for_segment(e.action, e.size));
                self.segments.insert(e.addr, Segment::from_entry(e, pool, false, index));
                self.block_count += 1;
                let s = &mut self.stats;
                s.segment.increase(pool, 1);
                s.reserved_bytes.increase(pool, e.size);
                if rules.is_oversize(e.size) {
                    s.oversize_segments.increase(1);
                }
                s.num_device_alloc += 1;
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
                let s = &mut self.stats;
                s.segment.decrease(pool, 1);
                s.reserved_bytes.decrease(pool, size);
                if rules.is_oversize(size) {
                    s.oversize_segments.decrease(1);
                }
                s.num_device_free += 1;
            }
            TraceAction::SegmentMap => {
                if self.segment_at(e.addr).is_some() || e.size == 0 {
                    return Err(fail(format!("segment_map at {:#x} overlaps mapped memory", e.addr)));
                }
                let pool = pool.unwrap_or_else(|| rules.pool_for_segment(e.action, e.size));
                self.map(index, e, pool);
                self.stats.reserved_bytes.increase(pool, e.size);
                self.stats.num_device_alloc += 1;
            }
            TraceAction::SegmentUnmap => {
                let pool = self.unmap(e.addr, e.size).map_err(fail)?;
                self.stats.reserved_bytes.decrease(pool, e.size);
                self.stats.num_device_free += 1;
            }
            TraceAction::Alloc => self.alloc(index, e, rules).map_err(fail)?,
            TraceAction::FreeRequested => {
                let key = self.segment_key(e.addr);
                let segment = key.and_then(|k| self.segments.get_mut(&k));
                let block = segment
                    .and_then(|s| {
                        let i = s.block_index(e.addr)?;
                        Some((s.pool, &mut s.blocks[i]))
                    })
                    .filter(|(_, b)| b.address == e.addr && b.state == BlockState::ActiveAllocated);
                let Some((pool, block)) = block else {
                    return Err(fail(format!("free_requested of {:#x}, which is not allocated", e.addr)));
                };
                block.state = BlockState::ActivePendingFree;
                let size = block.size;
                let s = &mut self.stats;
                s.allocation.decrease(pool, 1);
                s.allocated_bytes.decrease(pool, size);
                if rules.is_oversize(size) {
                    s.oversize_allocations.decrease(1);
                }
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
        let key = self.segment_key(e.addr).ok_or_else(|| format!("alloc at {:#x}, outside every segment", e.addr))?;
        let Some(segment) = self.segments.get_mut(&key) else { return Err("segment vanished".into()) };
        let i = segment
            .block_index(e.addr)
            .filter(|&i| segment.blocks[i].address == e.addr && segment.blocks[i].is_free())
            .ok_or_else(|| format!("alloc at {:#x}, where no free block starts", e.addr))?;
        let rounded = rules.round(e.size);
        let pool = segment.pool;
        let expandable = segment.expandable;
        let already_split = segment.is_split();
        let free_size = segment.blocks[i].size;
        if free_size < rounded {
            return Err(format!("alloc of {} B at {:#x} into a free block of {free_size} B", e.size, e.addr));
        }
        let split = rules.should_split(pool, free_size, rounded);
        let s = &mut self.stats;
        if split {
            let tail = Block::free(e.addr + rounded, free_size - rounded, segment.blocks[i].requested);
            let tail_size = tail.size;
            segment.blocks[i].size = rounded;
            segment.blocks.insert(i + 1, tail);
            self.block_count += 1;
            if !expandable {
                if already_split {
                    s.inactive_split_bytes.decrease(pool, rounded);
                } else {
                    s.inactive_split_bytes.increase(pool, tail_size);
                    s.inactive_split.increase(pool, 1);
                }
            }
        } else if already_split && !expandable {
            s.inactive_split_bytes.decrease(pool, free_size);
            s.inactive_split.decrease(pool, 1);
        }
        let block = &mut segment.blocks[i];
        block.state = BlockState::ActiveAllocated;
        block.requested = e.size;
        block.event = index;
        block.context = e.context;
        let size = block.size;
        s.allocation.increase(pool, 1);
        s.allocated_bytes.increase(pool, size);
        s.active.increase(pool, 1);
        s.active_bytes.increase(pool, size);
        s.requested_bytes.increase(pool, e.size);
        if rules.is_oversize(size) {
            s.oversize_allocations.increase(1);
        }
        Ok(())
    }

    /// `free_block`: the block goes back to the cache and merges with free neighbours; the
    /// inactive-split stats move by the net change, as one increase or one decrease.
    fn free_completed(&mut self, address: u64) -> Result<(), String> {
        let key = self.segment_key(address);
        let Some(segment) = key.and_then(|k| self.segments.get_mut(&k)) else {
            return Err(format!("free_completed of {address:#x}, outside every segment"));
        };
        let Some(i) = segment.block_index(address).filter(|&i| {
            segment.blocks[i].address == address && segment.blocks[i].state == BlockState::ActivePendingFree
        }) else {
            return Err(format!("free_completed of {address:#x}, which was not freed"));
        };
        let (pool, expandable) = (segment.pool, segment.expandable);
        let original = segment.blocks[i].size;
        let requested = segment.blocks[i].requested;
        segment.blocks[i].state = BlockState::Inactive;
        segment.blocks[i].event = NO_EVENT;
        segment.blocks[i].context = None;
        let mut net_blocks = 0i64;
        let mut net_bytes = 0i64;
        let mut i = i;
        if i > 0 && segment.blocks[i - 1].is_free() {
            let prev = segment.blocks.remove(i - 1);
            i -= 1;
            segment.blocks[i].address = prev.address;
            segment.blocks[i].size += prev.size;
            net_blocks -= 1;
            net_bytes -= prev.size as i64;
            self.block_count -= 1;
        }
        if i + 1 < segment.blocks.len() && segment.blocks[i + 1].is_free() {
            let next = segment.blocks.remove(i + 1);
            segment.blocks[i].size += next.size;
            net_blocks -= 1;
            net_bytes -= next.size as i64;
            self.block_count -= 1;
        }
        if segment.is_split() {
            net_blocks += 1;
            net_bytes += segment.blocks[i].size as i64;
        }
        let s = &mut self.stats;
        if !expandable {
            pool_add(&mut s.inactive_split, pool, net_blocks);
            pool_add(&mut s.inactive_split_bytes, pool, net_bytes);
        }
        s.active.decrease(pool, 1);
        s.active_bytes.decrease(pool, original);
        s.requested_bytes.decrease(pool, requested);
        Ok(())
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
            self.block_count -= Self::append(&mut prev, segment);
            segment = prev;
        }
        let after = e.addr + e.size;
        if self.segments.get(&after).is_some_and(joins)
            && let Some(next) = self.segments.remove(&after)
        {
            self.block_count -= Self::append(&mut segment, next);
        }
        self.segments.insert(segment.address, segment);
    }

    /// Appends `next` (which starts where `segment` ends); returns how many blocks merged away.
    fn append(segment: &mut Segment, next: Segment) -> usize {
        segment.size += next.size;
        let mut blocks = next.blocks.into_iter();
        let mut merged = 0;
        if let (Some(last), Some(first)) = (segment.blocks.last_mut(), blocks.as_slice().first())
            && last.is_free()
            && first.is_free()
        {
            last.size += first.size;
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
        if block.address < address {
            segment.blocks.push(Block::free(block.address, address - block.address, block.requested));
            self.block_count += 1;
        }
        if address + size < block.end() {
            tail_blocks.insert(0, Block::free(address + size, block.end() - address - size, block.requested));
            self.block_count += 1;
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
    pub fn recount_stats(&mut self, rules: &Rules) {
        let mut s = PoolState::empty(rules).stats;
        let mut blocks = 0;
        for segment in self.segments.values() {
            let pool = segment.pool;
            blocks += segment.blocks.len();
            if !segment.expandable {
                s.segment.increase(pool, 1);
                if rules.is_oversize(segment.size) {
                    s.oversize_segments.increase(1);
                }
            }
            s.reserved_bytes.increase(pool, segment.size);
            for b in &segment.blocks {
                match b.state {
                    BlockState::ActiveAllocated => {
                        s.allocation.increase(pool, 1);
                        s.allocated_bytes.increase(pool, b.size);
                        if rules.is_oversize(b.size) {
                            s.oversize_allocations.increase(1);
                        }
                    }
                    BlockState::Inactive => {
                        if segment.is_split() && !segment.expandable {
                            s.inactive_split.increase(pool, 1);
                            s.inactive_split_bytes.increase(pool, b.size);
                        }
                    }
                    BlockState::ActivePendingFree => {}
                }
                if !b.is_free() {
                    s.active.increase(pool, 1);
                    s.active_bytes.increase(pool, b.size);
                    s.requested_bytes.increase(pool, b.requested);
                }
            }
        }
        s.reset_accumulated();
        self.stats = s;
        self.block_count = blocks;
    }

    /// Undoes entry `e` (walking a trace backwards from its end state, to find the state
    /// before its first entry when earlier entries were dropped). Block sizes of frees are
    /// taken from `block_size` where a forward pass knew them, else from rounding the request.
    pub fn undo(&mut self, e: &TraceEntry, block_size: Option<u64>, rules: &Rules) {
        match e.action {
            TraceAction::Alloc => {
                if let Some(key) = self.segment_key(e.addr)
                    && let Some(segment) = self.segments.get_mut(&key)
                    && let Some(i) = segment.block_index(e.addr)
                {
                    segment.blocks[i].state = BlockState::Inactive;
                    segment.blocks[i].event = NO_EVENT;
                    Self::merge_free_around(segment, i);
                }
            }
            TraceAction::FreeRequested => {
                if let Some(key) = self.segment_key(e.addr)
                    && let Some(segment) = self.segments.get_mut(&key)
                    && let Some(i) = segment.block_index(e.addr)
                {
                    let b = &mut segment.blocks[i];
                    if b.state == BlockState::ActivePendingFree {
                        b.state = BlockState::ActiveAllocated;
                    }
                }
            }
            TraceAction::FreeCompleted => {
                let Some(key) = self.segment_key(e.addr) else { return };
                let Some(segment) = self.segments.get_mut(&key) else { return };
                let Some(i) = segment.block_index(e.addr) else { return };
                if !segment.blocks[i].is_free() {
                    return;
                }
                let free = segment.blocks.remove(i);
                let size = block_size.unwrap_or_else(|| rules.round(e.size)).clamp(1, free.end() - e.addr);
                let mut pieces = Vec::with_capacity(3);
                if free.address < e.addr {
                    pieces.push(Block::free(free.address, e.addr - free.address, free.requested));
                }
                pieces.push(Block {
                    address: e.addr,
                    size,
                    requested: e.size,
                    state: BlockState::ActivePendingFree,
                    event: NO_EVENT,
                    context: e.context,
                });
                if e.addr + size < free.end() {
                    pieces.push(Block::free(e.addr + size, free.end() - e.addr - size, free.requested));
                }
                segment.blocks.splice(i..i, pieces);
            }
            TraceAction::SegmentAlloc => {
                self.segments.remove(&e.addr);
            }
            TraceAction::SegmentFree => {
                if self.segment_at(e.addr).is_none() {
                    let pool = rules.pool_for_segment(e.action, e.size);
                    self.segments.insert(e.addr, Segment::from_entry(e, pool, false, NO_EVENT));
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

    fn merge_free_around(segment: &mut Segment, mut i: usize) {
        if i + 1 < segment.blocks.len() && segment.blocks[i + 1].is_free() {
            let next = segment.blocks.remove(i + 1);
            segment.blocks[i].size += next.size;
        }
        if i > 0 && segment.blocks[i - 1].is_free() {
            let this = segment.blocks.remove(i);
            i -= 1;
            segment.blocks[i].size += this.size;
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
}
