//! Every allocation of a run as a lifetime, and the stacked picture of them that the Active
//! Memory Timeline draws: PyTorch memory_viz's "Active Memory Timeline", made to stay fast on
//! millions of entries.
//!
//! # What is stacked, and in which order
//!
//! memory_viz keeps the live allocations on a stack in the order they were made; when one is
//! freed, the ones above it slide down by its size. So at any moment the picture is the live
//! allocations in allocation order, each on top of the sum of those before it. That is what
//! [`Lifetimes::stack_at`] returns. An allocation lives from its `alloc` entry until its
//! `free_completed` entry (it is *active* until then, like memory_viz's bands); heights are the
//! requested sizes the trace records, as memory_viz draws them. Blocks already allocated before
//! the first entry (a trace whose start the ring buffer dropped) sit at the bottom from the
//! start, as memory_viz puts them.
//!
//! # Why it stays fast
//!
//! memory_viz records every band's offset at every change, which grows with entries × live
//! allocations, and draws only the 15,000 largest allocations to cope. Here nothing per entry is
//! stored beyond the lifetimes themselves: they are kept in allocation order with a tree of the
//! latest free position over each range of them, so the allocations live at a moment are found
//! without looking at those already freed (O(live · log n)). A picture is then built per pixel
//! column ([`Lifetimes::layout`]): each column shows the moment of its span where the active
//! bytes peak (so no spike is lost between pixels), runs of allocations thinner than a pixel are
//! merged into one band, and a band that stays put over neighbouring columns is one rectangle.
//! The layout depends on the range and size in view, not on the cursor, so moving the cursor
//! redraws a cached layout.

use std::collections::HashMap;

use cachalot_core::{BlockState, ContextId, StreamId, TraceAction, TraceEntry};

use super::{Run, StateCache};

/// Where a lifetime that has not ended (yet) ends.
pub const NEVER: u32 = u32::MAX;

/// One allocation from its `alloc` to its `free_completed`, in cursor positions (position `p` is
/// the state after `p` entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    /// First position where it is allocated (0 for blocks that predate the trace).
    pub start: u32,
    /// First position after the user freed it (`free_requested`); [`NEVER`] if not freed.
    pub freed: u32,
    /// First position where it is no longer active (`free_completed`); [`NEVER`] if never.
    pub end: u32,
    /// Requested bytes.
    pub size: u64,
    /// Address of the block.
    pub address: u64,
    /// Stream of the block.
    pub stream: StreamId,
    /// The stack it was allocated from.
    pub context: Option<ContextId>,
}

impl Lifetime {
    /// Whether it is active at cursor position `p`.
    pub fn is_live_at(&self, p: u32) -> bool {
        self.start <= p && p < self.end
    }
}

/// What a band of a layout stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BandItem {
    /// One allocation: index into [`Lifetimes::items`].
    Allocation(u32),
    /// Consecutive allocations each thinner than a pixel, drawn as one band.
    Merged {
        /// How many.
        count: u32,
    },
}

/// A rectangle of the stacked picture: pixel columns `x0..x1` of the layout, bytes `y0..y1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackBand {
    /// First column.
    pub x0: u32,
    /// One past the last column.
    pub x1: u32,
    /// Bytes below the band.
    pub y0: u64,
    /// Bytes below its top.
    pub y1: u64,
    /// What it is.
    pub item: BandItem,
}

/// The stacked picture of a range of cursor positions on a number of pixel columns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// The cursor positions shown, half-open.
    pub range: (usize, usize),
    /// Pixel columns.
    pub columns: u32,
    /// The moment each column shows (where the active bytes of its span peak).
    pub samples: Vec<u32>,
    /// Rectangles, in no particular order; they do not overlap.
    pub bands: Vec<StackBand>,
    /// The highest stack of the layout, in bytes.
    pub top: u64,
}

impl Layout {
    /// The band at column `x` whose bytes contain `y`, if any.
    pub fn band_at(&self, x: u32, y: u64) -> Option<&StackBand> {
        self.bands.iter().find(|b| b.x0 <= x && x < b.x1 && b.y0 <= y && y < b.y1)
    }
}

/// Every allocation of a run, in allocation order, with what finds those live at a moment fast.
#[derive(Clone, Debug, Default)]
pub struct Lifetimes {
    /// The allocations, ordered by [`Lifetime::start`].
    pub items: Vec<Lifetime>,
    /// Cursor positions covered (the run's processed entries when last updated).
    processed: usize,
    /// Open allocations by address.
    open: HashMap<u64, u32>,
    /// `tree[leaves + i]` = `items[i].end`; inner nodes hold the maximum of their children.
    tree: Vec<u32>,
    leaves: usize,
    tree_stale: bool,
}

impl Lifetimes {
    /// The lifetimes of every allocation of `run`.
    pub fn of(run: &Run) -> Self {
        let mut lifetimes = Lifetimes::default();
        lifetimes.update(run);
        lifetimes
    }

    /// Cursor positions covered.
    pub fn processed(&self) -> usize {
        self.processed
    }

    /// Takes in the entries `run` processed since the last call (a live run grows); starts over
    /// if the run was replaced by a shorter one.
    pub fn update(&mut self, run: &Run) {
        if run.processed() < self.processed || (self.processed == 0 && self.items.is_empty()) {
            *self = Lifetimes::default();
            self.seed(run);
        }
        for i in self.processed..run.processed() {
            self.apply(&run.trace[i], i as u32 + 1);
        }
        if run.processed() != self.processed {
            self.tree_stale = true;
        }
        self.processed = run.processed();
    }

    /// The blocks live before the first entry (a trace that does not start empty).
    fn seed(&mut self, run: &Run) {
        if !run.initial_inferred {
            return;
        }
        let mut cache = StateCache::default();
        let state = run.seek(&mut cache, 0);
        for segment in state.segments.values() {
            for block in segment.blocks.iter().filter(|b| b.state != BlockState::Inactive) {
                let freed = if block.state == BlockState::ActivePendingFree { 0 } else { NEVER };
                self.open.insert(block.address, self.items.len() as u32);
                self.items.push(Lifetime {
                    start: 0,
                    freed,
                    end: NEVER,
                    size: block.requested,
                    address: block.address,
                    stream: segment.stream,
                    context: block.context,
                });
            }
        }
        self.tree_stale = true;
    }

    fn apply(&mut self, e: &TraceEntry, position: u32) {
        match e.action {
            TraceAction::Alloc => {
                // An address handed out again without a free in between (a malformed trace):
                // the older allocation ends here rather than living forever.
                if let Some(old) = self.open.insert(e.addr, self.items.len() as u32) {
                    self.items[old as usize].end = position;
                }
                self.items.push(Lifetime {
                    start: position,
                    freed: NEVER,
                    end: NEVER,
                    size: e.size,
                    address: e.addr,
                    stream: e.stream,
                    context: e.context,
                });
            }
            TraceAction::FreeRequested => {
                if let Some(&i) = self.open.get(&e.addr) {
                    self.items[i as usize].freed = position;
                }
            }
            TraceAction::FreeCompleted => {
                if let Some(i) = self.open.remove(&e.addr) {
                    let item = &mut self.items[i as usize];
                    item.end = position;
                    item.freed = item.freed.min(position);
                }
            }
            _ => {}
        }
    }

    fn rebuild_tree(&mut self) {
        self.leaves = self.items.len().next_power_of_two().max(1);
        self.tree = vec![0; 2 * self.leaves];
        for (i, item) in self.items.iter().enumerate() {
            self.tree[self.leaves + i] = item.end;
        }
        for n in (1..self.leaves).rev() {
            self.tree[n] = self.tree[2 * n].max(self.tree[2 * n + 1]);
        }
        self.tree_stale = false;
    }

    /// Brings the search tree up to date (after [`Lifetimes::update`] took in new entries).
    fn ensure_tree(&mut self) {
        if self.tree_stale || self.tree.is_empty() {
            self.rebuild_tree();
        }
    }

    /// Calls `visit` with the index of every allocation active at position `p`, in allocation
    /// order (bottom of the stack first).
    pub fn for_each_live(&mut self, p: u32, mut visit: impl FnMut(u32, &Lifetime)) {
        self.ensure_tree();
        // Allocations made after `p` are not live; of those before, skip every subtree whose
        // allocations all ended by `p`.
        let upper = self.items.partition_point(|l| l.start <= p);
        if upper == 0 {
            return;
        }
        let mut stack = vec![(1usize, 0usize, self.leaves)];
        while let Some((node, lo, hi)) = stack.pop() {
            if lo >= upper || self.tree[node] <= p {
                continue;
            }
            if hi - lo == 1 {
                visit(lo as u32, &self.items[lo]);
                continue;
            }
            let mid = (lo + hi) / 2;
            // Right first: the stack pops the left child next, keeping allocation order.
            stack.push((2 * node + 1, mid, hi));
            stack.push((2 * node, lo, mid));
        }
    }

    /// The allocations active at position `p`, bottom first, each with the bytes below it.
    pub fn stack_at(&mut self, p: u32) -> Vec<(u32, u64)> {
        let mut below = 0;
        let mut out = Vec::new();
        self.for_each_live(p, |i, l| {
            out.push((i, below));
            below += l.size;
        });
        out
    }

    /// The stacked picture of positions `range` on `columns` pixel columns, where a pixel is
    /// `bytes_per_pixel` high. `active` (the run's active bytes at every position) picks the
    /// moment each column shows: the one of its span with the most active bytes.
    ///
    /// The columns' moments increase, so the live list is carried from one column to the next:
    /// allocations made in between are appended (they come last in allocation order) and those
    /// that ended are dropped while the column is stacked. The cost is the columns times the
    /// allocations live, plus the allocations made in the range — not the entries × live of a
    /// fresh query per column.
    pub fn layout(&mut self, range: (usize, usize), columns: u32, bytes_per_pixel: f64, active: &[u64]) -> Layout {
        let (start, end) = (range.0.min(active.len()), range.1.min(active.len()));
        let mut layout = Layout { range: (start, end), columns, ..Layout::default() };
        if start >= end || columns == 0 {
            return layout;
        }
        let span = (end - start) as f64 / f64::from(columns);
        let thin = bytes_per_pixel.max(0.0);
        // The band each allocation had in the previous column, to extend rather than repeat it;
        // merged runs by where they start.
        let mut last_band = vec![u32::MAX; self.items.len()];
        let mut merged_open: HashMap<u64, usize> = HashMap::new();
        let mut merged_next: HashMap<u64, usize> = HashMap::new();
        let mut live: Vec<u32> = Vec::new();
        let mut next_new = 0usize;
        for x in 0..columns {
            let lo = start + (f64::from(x) * span) as usize;
            let hi = (start + (f64::from(x + 1) * span) as usize).clamp(lo + 1, end);
            let sample = (lo..hi).max_by_key(|&p| (active[p], std::cmp::Reverse(p))).unwrap_or(lo) as u32;
            layout.samples.push(sample);
            let upper = self.items.partition_point(|l| l.start <= sample);
            if x == 0 {
                self.for_each_live(sample, |i, _| live.push(i));
            } else {
                live.extend((next_new..upper).map(|i| i as u32).filter(|&i| self.items[i as usize].end > sample));
            }
            next_new = upper;
            let items = &self.items;
            live.retain(|&i| items[i as usize].end > sample);

            let mut below = 0u64;
            let mut merged: Option<(u64, u32)> = None;
            let mut push = |layout: &mut Layout, y0: u64, y1: u64, item: BandItem| {
                let previous = match item {
                    BandItem::Allocation(i) => last_band[i as usize],
                    BandItem::Merged { .. } => merged_open.get(&y0).map_or(u32::MAX, |&b| b as u32),
                };
                let b = match layout.bands.get_mut(previous as usize) {
                    Some(band) if band.x1 == x && band.y0 == y0 && band.y1 == y1 => {
                        band.x1 = x + 1;
                        if let (BandItem::Merged { count: have }, BandItem::Merged { count }) = (&mut band.item, item) {
                            *have = (*have).max(count);
                        }
                        previous as usize
                    }
                    _ => {
                        layout.bands.push(StackBand { x0: x, x1: x + 1, y0, y1, item });
                        layout.bands.len() - 1
                    }
                };
                match item {
                    BandItem::Allocation(i) => last_band[i as usize] = b as u32,
                    BandItem::Merged { .. } => {
                        merged_next.insert(y0, b);
                    }
                }
            };
            for &i in &live {
                let size = items[i as usize].size;
                if (size as f64) < thin {
                    merged.get_or_insert((below, 0)).1 += 1;
                } else {
                    if let Some((y0, count)) = merged.take() {
                        push(&mut layout, y0, below, BandItem::Merged { count });
                    }
                    push(&mut layout, below, below + size, BandItem::Allocation(i));
                }
                below += size;
            }
            if let Some((y0, count)) = merged {
                push(&mut layout, y0, below, BandItem::Merged { count });
            }
            layout.top = layout.top.max(below);
            std::mem::swap(&mut merged_open, &mut merged_next);
            merged_next.clear();
        }
        layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Rules, RunKind};
    use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend};

    fn run_of(f: impl FnOnce(&mut CachingAllocator<SimBackend>)) -> Run {
        let mut a = CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default()).unwrap();
        a.record_history(true, usize::MAX, &[], false);
        f(&mut a);
        let mut run = Run::new("t", RunKind::Cachalot, Rules::default());
        run.trace = a.trace();
        run.build(true, |_, _| {});
        run
    }

    #[test]
    fn the_stack_is_the_live_allocations_in_allocation_order() {
        let run = run_of(|a| {
            let x = a.malloc(1000, StreamId::DEFAULT).unwrap();
            let y = a.malloc(2000, StreamId::DEFAULT).unwrap();
            let _z = a.malloc(3000, StreamId::DEFAULT).unwrap();
            a.free(x).unwrap();
            a.free(y).unwrap();
        });
        let mut l = Lifetimes::of(&run);
        assert_eq!(l.items.len(), 3);
        let end = run.end() as u32;
        // After the third alloc: all three, stacked.
        let third = run.trace.iter().filter(|e| e.action == TraceAction::Alloc).nth(2).unwrap();
        let p = run.trace.iter().position(|e| e == third).unwrap() as u32 + 1;
        assert_eq!(l.stack_at(p), vec![(0, 0), (1, 1000), (2, 3000)]);
        // At the end only the third is left, at the bottom: the others' frees let it slide down.
        assert_eq!(l.stack_at(end), vec![(2, 0)]);
        assert_eq!(l.items[2].end, NEVER);
        assert!(l.items[0].is_live_at(p) && !l.items[0].is_live_at(end));
    }

    #[test]
    fn every_column_stacks_exactly_the_live_bytes_of_its_moment() {
        let run = run_of(|a| {
            let mut live = Vec::new();
            for i in 0..3000u64 {
                live.push(a.malloc(512 * (1 + i % 300), StreamId::DEFAULT).unwrap());
                if i % 3 == 1 {
                    let victim = live.swap_remove((i as usize * 7) % live.len());
                    a.free(victim).unwrap();
                }
            }
        });
        let mut l = Lifetimes::of(&run);
        let layout = l.layout((0, run.end() + 1), 200, 4096.0, run.active.values());
        assert_eq!(layout.samples.len(), 200);
        for (x, &sample) in layout.samples.iter().enumerate() {
            let expected: u64 = l.items.iter().filter(|i| i.is_live_at(sample)).map(|i| i.size).sum();
            let mut column: Vec<_> = layout.bands.iter().filter(|b| b.x0 <= x as u32 && (x as u32) < b.x1).collect();
            column.sort_by_key(|b| b.y0);
            assert_eq!(column.first().map_or(0, |b| b.y0), 0, "column {x} starts at 0");
            assert!(column.windows(2).all(|w| w[0].y1 == w[1].y0), "column {x} has no gaps or overlaps");
            assert_eq!(column.last().map_or(0, |b| b.y1), expected, "column {x} at {sample}");
        }
        // Small allocations were merged and whole bands extend over columns.
        assert!(layout.bands.iter().any(|b| matches!(b.item, BandItem::Merged { .. })));
        assert!(layout.bands.iter().any(|b| b.x1 - b.x0 > 1));
        // A column shows the peak of its span.
        let x = 57;
        let lo = (run.end() + 1) * x / 200;
        let hi = (run.end() + 1) * (x + 1) / 200;
        let peak = run.active.values()[lo..hi].iter().max().unwrap();
        assert_eq!(run.active.values()[layout.samples[x] as usize], *peak);
    }

    #[test]
    fn a_growing_run_updates_incrementally() {
        let full = run_of(|a| {
            let x = a.malloc(1 << 20, StreamId::DEFAULT).unwrap();
            let _y = a.malloc(1 << 21, StreamId::DEFAULT).unwrap();
            a.free(x).unwrap();
        });
        let mut live = Run::new("live", RunKind::Live, Rules::default());
        live.live = true;
        let mut l = Lifetimes::default();
        for e in &full.trace {
            live.extend([*e]);
            l.update(&live);
        }
        live.finish();
        l.update(&live);
        assert_eq!(l.items, Lifetimes::of(&full).items);
    }
}
