//! The expandable blocks as `policy:cachalot`'s planned give-backs would leave them (rule 4,
//! `policy/cachalot.rs`), read off the state without making them. The replay's plan of a malloc
//! (`plan.rs`) searches them for the run the miss then grows over, as
//! `find_expandable_block` searches the blocks the give-backs really left: with no cuts, the
//! view is the blocks as they are, and its search is the malloc's own (`expandable_room`).
//!
//! A give-back from the free block `B` unmaps the whole pages `[begin, end)` at its top
//! (`give_back_from`): what is below them stays a free mapped block (`B`'s pages kept, split
//! off when `begin > B.ptr`), the partial page above them (when `end < B.ptr + B.size`) a free
//! mapped block of its own, and the unmapped range merges with the unmapped blocks on either
//! side (`unmap_block`'s `try_merge_blocks`), which is then one block that
//! `find_expandable_block`'s walk visits at its lowest address; a reservation left with nothing
//! mapped is released (`release_expandable_segment`). [`CutView`] shows each block as those
//! [`Part`]s, so that the search and the pieces a miss maps are read as on the blocks left.

use crate::allocator::CachingAllocator;
use crate::allocator::malloc::Request;
use crate::backend::Backend;
use crate::block::NIL;

/// One block's part in a [`CutView`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::allocator) enum Part {
    /// A block no give-back cuts, as it is (mapped: an unmapped one is part of a [`Part::Hole`]).
    Whole(u32),
    /// The pages kept below the ones given back from the block it names.
    Below(u32),
    /// A run of unmapped address space: the unmapped blocks and the pages given back from free
    /// blocks that lie next to each other (merged into one block by the give-backs), named by
    /// its lowest block.
    Hole(u32),
    /// The partial page kept above the pages given back from the block it names.
    Above(u32),
}

impl Part {
    /// The block the part names.
    pub(in crate::allocator) fn block(self) -> u32 {
        let (Part::Whole(id) | Part::Below(id) | Part::Hole(id) | Part::Above(id)) = self;
        id
    }
}

/// The blocks as the give-backs `cuts` (block, first address given back, end) leave them. Cuts
/// are of free expandable blocks holding the range, at most one per block, as rule 4 plans them.
pub(in crate::allocator) struct CutView<'a, B: Backend> {
    allocator: &'a CachingAllocator<B>,
    /// The cuts, by block.
    cuts: Vec<(u32, u64, u64)>,
    /// The segments the cuts leave with nothing mapped: released, so searched no more.
    released: Vec<u32>,
}

impl<'a, B: Backend> CutView<'a, B> {
    pub(in crate::allocator) fn new(allocator: &'a CachingAllocator<B>, cuts: &[(u32, u64, u64)]) -> Self {
        let mut cuts = cuts.to_vec();
        cuts.sort_unstable_by_key(|cut| cut.0);
        let mut view = CutView { allocator, cuts, released: Vec::new() };
        let mut segments: Vec<u32> = view.cuts.iter().map(|&(id, _, _)| allocator.blocks[id].segment).collect();
        segments.sort_unstable();
        segments.dedup();
        view.released = segments.into_iter().filter(|&segment| view.leaves_nothing_mapped(segment)).collect();
        view
    }

    /// The first and end address given back from block `id`, if any.
    fn cut(&self, id: u32) -> Option<(u64, u64)> {
        let at = self.cuts.binary_search_by_key(&id, |cut| cut.0).ok()?;
        Some((self.cuts[at].1, self.cuts[at].2))
    }

    /// Whether the cuts unmap every page mapped in `segment`: all its blocks are unmapped, or
    /// given back whole. `give_back_from` then releases it. Read from the segment's first
    /// block up to the first one left mapped, which comes at the latest after the blocks the
    /// cuts give back whole and the unmapped ones between them: never all of a segment in use.
    fn leaves_nothing_mapped(&self, segment: u32) -> bool {
        let blocks = &self.allocator.blocks;
        let mut id = self.allocator.segments[segment].head;
        while id != NIL {
            let b = &blocks[id];
            let whole = self.cut(id).is_some_and(|(begin, end)| begin == b.ptr && end == b.ptr + b.size);
            if b.mapped && !whole {
                return false;
            }
            id = b.next;
        }
        true
    }

    /// Whether the unmapped space of block `id` (an unmapped block, or a cut one's pages given
    /// back) is the lowest of its [`Part::Hole`]: nothing unmapped lies right below it.
    fn starts_hole(&self, id: u32) -> bool {
        let blocks = &self.allocator.blocks;
        let b = &blocks[id];
        if let Some((begin, _)) = self.cut(id)
            && begin > b.ptr
        {
            return true; // its pages kept lie below
        }
        let prev = b.prev;
        // Below it: an unmapped block, or a free block whose top pages are given back (whose end
        // is then a page boundary, so all of its top up to this block).
        prev == NIL || (blocks[prev].mapped && self.cut(prev).is_none_or(|(_, end)| end < b.ptr))
    }

    /// The blocks whose unmapped space makes up the hole starting at block `first`, in order:
    /// unmapped blocks, and cut blocks whose pages given back reach their neighbours. Mapped
    /// whole, the hole leaves those blocks as they were (cut ones in one piece again), the
    /// unmapped ones mapped and joined to them.
    pub(super) fn hole_blocks(&self, first: u32) -> impl Iterator<Item = u32> + '_ {
        let blocks = &self.allocator.blocks;
        let mut next = Some(first);
        std::iter::from_fn(move || {
            let id = next?;
            let b = &blocks[id];
            let cut = self.cut(id);
            // The hole goes on into the next block if this one's unmapped space reaches its end
            // and the next one's starts at its start.
            let reaches_end = cut.is_none_or(|(_, end)| end == b.ptr + b.size);
            next = (reaches_end && b.next != NIL)
                .then_some(b.next)
                .filter(|&n| !blocks[n].mapped || self.cut(n).is_some_and(|(begin, _)| begin == blocks[n].ptr));
            Some(id)
        })
    }

    /// The part that block `id` begins with (a block no hole below it reaches).
    fn first_part(&self, id: u32) -> Part {
        let b = &self.allocator.blocks[id];
        match self.cut(id) {
            Some((begin, _)) if begin > b.ptr => Part::Below(id),
            Some(_) => Part::Hole(id),
            None if b.mapped => Part::Whole(id),
            None => Part::Hole(id),
        }
    }

    /// The part after `part` in its segment.
    pub(in crate::allocator) fn next(&self, part: Part) -> Option<Part> {
        let blocks = &self.allocator.blocks;
        let last = match part {
            Part::Below(id) => return Some(Part::Hole(id)),
            Part::Whole(id) | Part::Above(id) => id,
            Part::Hole(first) => {
                let last = self.hole_blocks(first).last().unwrap_or(first);
                if self.cut(last).is_some_and(|(_, end)| end < blocks[last].ptr + blocks[last].size) {
                    return Some(Part::Above(last));
                }
                last
            }
        };
        let next = blocks[last].next;
        (next != NIL).then(|| self.first_part(next))
    }

    /// The address, bytes and whether mapped of `part`.
    pub(in crate::allocator) fn span(&self, part: Part) -> (u64, u64, bool) {
        let blocks = &self.allocator.blocks;
        match part {
            Part::Whole(id) => (blocks[id].ptr, blocks[id].size, blocks[id].mapped),
            Part::Below(id) => {
                let (begin, _) = self.cut(id).unwrap_or_default();
                (blocks[id].ptr, begin - blocks[id].ptr, true)
            }
            Part::Above(id) => {
                let (_, end) = self.cut(id).unwrap_or_default();
                (end, blocks[id].ptr + blocks[id].size - end, true)
            }
            Part::Hole(first) => {
                let ptr = self.cut(first).map_or(blocks[first].ptr, |(begin, _)| begin);
                let last = self.hole_blocks(first).last().unwrap_or(first);
                let end = self.cut(last).map_or(blocks[last].ptr + blocks[last].size, |(_, end)| end);
                (ptr, end - ptr, false)
            }
        }
    }

    /// Whether `part` may serve a request: free or unmapped (a cut block is free).
    pub(in crate::allocator) fn is_allocatable(&self, part: Part) -> bool {
        match part {
            Part::Whole(id) => self.allocator.blocks.is_allocatable(id),
            Part::Below(_) | Part::Hole(_) | Part::Above(_) => true,
        }
    }

    /// `find_expandable_block`'s search (`expandable_room`) over the blocks the cuts leave: the
    /// first part of the lowest run of free and unmapped parts of the request's stream and pool
    /// that offers the request's bytes. The walk visits each hole at its lowest address: the
    /// stream's unmapped blocks that start one, and the cuts that do (their pages kept below, or
    /// nothing unmapped below), in address order, skipping the reservations the cuts leave with
    /// nothing mapped. A run's bytes are those of the blocks it spans before the cuts (the
    /// parts of a cut block are all free, so they span the same), counted from the block its
    /// first part begins.
    ///
    /// Under `policy:cachalot`, for a miss that recurs in a repeat of the job (rule 7), the
    /// lowest of the runs that map the fewest pages: each run is counted over the parts the
    /// cuts leave (a hole's pages given back are mapped again). PyTorch's lowest run may map
    /// many pages beside a free block that one page would have grown; in a repeat at rule 7's
    /// ceiling each page mapped is one given back from the largest free blocks, the places of
    /// the job's other recurring requests (trace-gpt_train's 131 and 139 MB logits took each
    /// other's pages on every repeat).
    ///
    /// With no cuts, the blocks as they are: the malloc's own search (`expandable_room`).
    pub(in crate::allocator) fn room(&self, request: &Request) -> Option<Part> {
        let allocator = self.allocator;
        let fewest_pages = allocator.maps_fewest_pages(request);
        let mut fewest: Option<(u64, Part)> = None;
        let blocks = &allocator.blocks;
        let (stream, size) = (request.stream, request.size);
        let segment_of = |id: u32| blocks[id].segment;
        let searched = |id: u32| !self.released.contains(&segment_of(id));
        // The holes cuts begin, by address.
        let mut cut_holes: Vec<(u64, u32)> = self
            .cuts
            .iter()
            .filter(|&&(id, _, _)| {
                let b = &blocks[id];
                b.stream == stream
                    && b.pool == request.pool
                    && allocator.segments[b.segment].private == request.slot
                    && self.starts_hole(id)
                    && searched(id)
            })
            .map(|&(id, begin, _)| (begin, id))
            .collect();
        cut_holes.sort_unstable();
        let mut cut_holes = cut_holes.into_iter().peekable();
        let tree = &allocator.pool(request.slot, request.pool).unmapped;
        let mut unmapped =
            tree.walk_stream(blocks, stream).filter(|&id| self.starts_hole(id) && searched(id)).peekable();
        loop {
            let from_cut = match (unmapped.peek(), cut_holes.peek()) {
                (None, None) => break,
                (Some(&id), Some(&(begin, _))) => begin < blocks[id].ptr,
                (None, Some(_)) => true,
                (Some(_), None) => false,
            };
            // The run's first part, and the block it begins.
            let (start, from) = match from_cut {
                true => {
                    let (_, id) = cut_holes.next()?;
                    (self.first_part(id), id)
                }
                false => {
                    let id = unmapped.next()?;
                    let prev = blocks[id].prev;
                    // Below a hole's lowest block lies no cut block.
                    match prev != NIL && blocks.is_allocatable(prev) {
                        true => (Part::Whole(prev), prev),
                        false => (Part::Hole(id), id),
                    }
                }
            };
            let mut bytes = 0;
            let mut b = from;
            while bytes < size && b != NIL && blocks.is_allocatable(b) {
                bytes += blocks[b].size;
                b = blocks[b].next;
            }
            if bytes < size {
                continue;
            }
            if !fewest_pages {
                return Some(start);
            }
            let to_map = self.pages_to_map_from(start, size);
            if fewest.is_none_or(|(least, _)| to_map < least) {
                fewest = Some((to_map, start));
            }
        }
        fewest.map(|(_, start)| start)
    }

    /// The bytes of pages a request of `size` bytes maps in the run of free and unmapped parts
    /// beginning with `start` (which holds it), as `try_allocate_expandable_block` maps them:
    /// each unmapped part up to what is still missing, rounded up to its pages.
    fn pages_to_map_from(&self, start: Part, size: u64) -> u64 {
        let blocks = &self.allocator.blocks;
        let (mut bytes, mut to_map, mut part) = (0, 0, Some(start));
        while bytes < size
            && let Some(current) = part.filter(|&p| self.is_allocatable(p))
        {
            let (_, len, mapped) = self.span(current);
            if !mapped {
                let (_, page) = self.allocator.segment_pages(blocks[current.block()].segment);
                to_map += (size - bytes).min(len).div_ceil(page) * page;
            }
            bytes += len;
            part = self.next(current);
        }
        to_map
    }
}
