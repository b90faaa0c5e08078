//! Expandable segments: one VA reservation per (stream, pool) grown by mapping pages and shrunk
//! by unmapping fully free ones (`docs/allocator-rules.md` §14).

use super::CachingAllocator;
use super::chain::{CutView, Part};
use super::malloc::Request;
use crate::backend::{Backend, BackendError};
use crate::block::{Block, NIL, Segment};
use crate::error::AllocatorError;
use crate::size::{PoolKind, SMALL_BUFFER};
use crate::trace::TraceAction;

impl<B: Backend> CachingAllocator<B> {
    /// `try_allocate_expandable_block`: a free mapped block of at least `request.size` bytes,
    /// mapping pages as needed. Note PyTorch asks for the rounded size here, not the segment
    /// size. `Ok(None)` when pages could not be mapped (those mapped before stay, free).
    ///
    /// Where the request goes and which pieces of pages it maps there are
    /// [`Self::pages_to_map`]'s, over the blocks as they are: the replay's plan of a malloc
    /// (`chain/plan.rs`) reads the same function over the blocks the policy's give-backs would
    /// leave, so the two cannot map differently.
    pub(super) fn try_allocate_expandable_block(&mut self, request: &Request) -> Result<Option<u32>, AllocatorError> {
        let (start, pieces) = self.pages_to_map(request, &CutView::new(self, &[]));
        let mut candidate = match start {
            Some(part) => part.block(),
            None => self.reserve_expandable_segment(request)?,
        };
        // Each piece maps the start of its hole; mapped, the hole merges with the free blocks
        // beside it, and the last one mapped is the block that holds the request.
        for piece in pieces {
            // Past a whole new reservation: more than any device has.
            if piece.bytes == u64::MAX {
                return Ok(None);
            }
            let hole = if piece.hole == NIL { candidate } else { piece.hole };
            if !self.map_block(hole, piece.bytes)? {
                return Ok(None);
            }
            candidate = hole;
        }
        self.remove_free(candidate);
        Ok(Some(candidate))
    }

    /// `find_expandable_block`'s choice for `request` over the blocks `view` shows (as they are,
    /// or as the policy's give-backs would leave them), and the pieces
    /// `try_allocate_expandable_block` maps there, in order: the run's first part, with one
    /// piece per hole of the run (each but the last mapped whole) until the free block grown
    /// from there holds the request; or no part (a new reservation) with its first pages
    /// ([`NIL`]), all of it where it is smaller than the request (which no second piece then
    /// completes: one of all the device's bytes stands for it).
    pub(super) fn pages_to_map(&self, request: &Request, view: &CutView<'_, B>) -> (Option<Part>, Vec<Piece>) {
        let size = request.size;
        let Some(start) = view.room(request) else {
            let (page, reserved) = (self.expandable_page_size(request.pool), self.reservation_size(request.pool));
            let pieces = match size <= reserved {
                true => vec![Piece { hole: NIL, bytes: size.div_ceil(page) * page }],
                false => vec![Piece { hole: NIL, bytes: reserved }, Piece { hole: NIL, bytes: u64::MAX }],
            };
            return (None, pieces);
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
        (Some(start), pieces)
    }

    /// `find_expandable_block`'s new segment, where no segment of the request's stream and
    /// pool has room for it ([`Self::pages_to_map`]): a VA reservation with nothing mapped, one
    /// unmapped block.
    fn reserve_expandable_segment(&mut self, request: &Request) -> Result<u32, AllocatorError> {
        let (stream, pool, slot) = (request.stream, request.pool, request.slot);
        let page_size = self.expandable_page_size(pool);
        let reserved = self.reservation_size(pool);
        let base = self.backend.reserve_address_space(reserved, page_size, stream)?;
        let segment = self.segments.insert(Segment {
            base,
            size: reserved,
            pool,
            stream,
            head: NIL,
            page_size: Some(page_size),
            context: None,
            private: slot,
        });
        if slot != NIL {
            self.private[slot].segments += 1;
        }
        let mut block = Block::new(base, reserved, stream, pool, segment);
        block.mapped = false;
        block.expandable = true;
        let id = self.blocks.insert(block);
        self.segments[segment].head = id;
        self.insert_unmapped(id);
        Ok(id)
    }

    /// `find_expandable_block`'s search among the existing segments, without making a new one:
    /// the first block of the lowest run of free and unmapped blocks of the request's stream
    /// and pool that offers the request's bytes; under `policy:cachalot`, once the job met its
    /// peak (rule 7), the lowest of those that map the fewest pages.
    /// The one search ([`CutView::room`]), here over the blocks as they are: the replay's plan
    /// of a malloc makes it over the blocks the policy's give-backs would leave, and
    /// `policy:cachalot`'s rule 4 asks it too.
    pub(super) fn expandable_room(&self, request: &Request) -> Option<u32> {
        CutView::new(self, &[]).room(request).map(Part::block)
    }

    /// The run of free and unmapped blocks from `start`, walked as far as a request of `size`
    /// bytes reaches (or to the run's end, where it offers less): what it offers, the bytes of
    /// the pages the request would map there, and where the walk ended.
    pub(super) fn run_from(&self, start: u32, size: u64) -> Run {
        let mut run = Run { bytes: 0, to_map: 0, end: self.blocks[start].ptr };
        let mut b = start;
        while run.bytes < size && b != NIL && self.blocks.is_allocatable(b) {
            let block = &self.blocks[b];
            if !block.mapped {
                let (_, page) = self.segment_pages(block.segment);
                run.to_map += (size - run.bytes).min(block.size).div_ceil(page) * page;
            }
            run.bytes += block.size;
            run.end = block.ptr + block.size;
            b = block.next;
        }
        run
    }

    /// `map_block`: backs the first `size` bytes (rounded up to pages) of the unmapped block
    /// `id`, which then merges with free mapped neighbours and joins the free set.
    /// `Ok(false)` when the device is out of memory.
    fn map_block(&mut self, id: u32, size: u64) -> Result<bool, AllocatorError> {
        let (ptr, block_size, segment) = (self.blocks[id].ptr, self.blocks[id].size, self.blocks[id].segment);
        debug_assert!(!self.blocks[id].mapped && size <= block_size);
        let (base, page) = self.segment_pages(segment);
        let begin = (ptr - base) / page;
        let end = (ptr + size - base).div_ceil(page);
        let mapped = (end - begin) * page;
        if mapped == 0 {
            return Ok(false);
        }
        match self.backend.map_pages(base, begin * page, mapped) {
            Ok(()) => {}
            Err(BackendError::OutOfMemory { limit }) => {
                self.last_device_limit = limit;
                return Ok(false);
            }
            Err(other) => return Err(other.into()),
        }
        self.remove_unmapped(id);
        self.blocks[id].mapped = true;
        if mapped < block_size {
            let mut rest = self.sibling(id, ptr + mapped, block_size - mapped);
            rest.mapped = false;
            let rest = self.blocks.insert(rest);
            let next = self.blocks[id].next;
            self.splice(rest, id, next);
            self.insert_unmapped(rest);
            self.blocks[id].size = mapped;
        }
        let (prev, next) = (self.blocks[id].prev, self.blocks[id].next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.insert_free(id);

        let (stream, pool) = (self.blocks[id].stream, self.blocks[id].pool);
        self.total_allocated_memory += mapped;
        self.stats.families().device_alloc(pool, mapped, false, false);
        self.record(TraceAction::SegmentMap, ptr, mapped, stream, self.current_context);
        if self.blocks[id].prev == NIL && self.segments[segment].context.is_none() {
            self.segments[segment].context = self.current_context;
        }
        Ok(true)
    }

    /// `unmap_block`: unmaps the whole pages strictly inside the free block `id`; the partial
    /// pages at either end stay mapped as free blocks of their own.
    pub(super) fn unmap_block(&mut self, id: u32) -> Result<(), AllocatorError> {
        let (ptr, size, segment, stream) =
            (self.blocks[id].ptr, self.blocks[id].size, self.blocks[id].segment, self.blocks[id].stream);
        let (base, page) = self.segment_pages(segment);
        let begin = (ptr - base).div_ceil(page);
        let end = (ptr + size - base) / page;
        if begin >= end {
            return Ok(());
        }
        let unmapped_ptr = base + begin * page;
        let unmapped_size = (end - begin) * page;
        self.backend.unmap_pages(base, begin * page, unmapped_size, stream)?;
        self.remove_free(id);

        let before = unmapped_ptr - ptr;
        if before > 0 {
            let before_block = self.blocks.insert(self.sibling(id, ptr, before));
            let prev = self.blocks[id].prev;
            self.splice(before_block, prev, id);
            self.insert_free(before_block);
        }
        let after = size - (before + unmapped_size);
        if after > 0 {
            let after_block = self.blocks.insert(self.sibling(id, unmapped_ptr + unmapped_size, after));
            let next = self.blocks[id].next;
            self.splice(after_block, id, next);
            self.insert_free(after_block);
        }
        let b = &mut self.blocks[id];
        b.ptr = unmapped_ptr;
        b.size = unmapped_size;
        b.mapped = false;
        let (prev, next) = (b.prev, b.next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.insert_unmapped(id);

        let pool = self.blocks[id].pool;
        self.total_allocated_memory -= unmapped_size;
        self.stats.families().device_free(pool, unmapped_size, false, false);
        let context = self.current_context.or(self.segments[segment].context);
        self.record(TraceAction::SegmentUnmap, unmapped_ptr, unmapped_size, stream, context);
        Ok(())
    }

    /// `release_expandable_segment`: frees the VA of a segment with nothing mapped in it.
    pub(super) fn release_expandable_segment(&mut self, id: u32) -> Result<(), AllocatorError> {
        let segment = self.blocks[id].segment;
        let (base, size) = (self.segments[segment].base, self.segments[segment].size);
        debug_assert!(!self.blocks[id].mapped && self.blocks[id].size == size);
        self.backend.release_address_space(base, size)?;
        self.remove_unmapped(id);
        self.blocks.remove(id);
        if let Some(removed) = self.segments.remove(segment)
            && removed.private != NIL
        {
            self.private[removed.private].segments -= 1;
        }
        Ok(())
    }

    /// The VA a new expandable segment of `pool` reserves: enough for 1 1/8 of the device, in
    /// its pages, so pages can move when earlier ones were unmapped.
    pub(super) fn reservation_size(&self, pool: PoolKind) -> u64 {
        let page_size = self.expandable_page_size(pool);
        let total = self.backend.device().total_memory;
        (total + total / 8).div_ceil(page_size) * page_size
    }

    /// The base address and page size of expandable segment `segment`.
    pub(super) fn segment_pages(&self, segment: u32) -> (u64, u64) {
        let s = &self.segments[segment];
        (s.base, s.page_size.unwrap_or(SMALL_BUFFER))
    }
}

/// One piece of the pages a malloc maps ([`CachingAllocator::pages_to_map`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Piece {
    /// The hole mapped from its start, named by its lowest block ([`Part::Hole`]; [`NIL`]: a
    /// new reservation's).
    pub hole: u32,
    /// Bytes mapped.
    pub bytes: u64,
}

/// A run of free and unmapped blocks of one expandable segment, as far as a request walked it
/// (`CachingAllocator::run_from`).
#[derive(Clone, Copy)]
pub(super) struct Run {
    /// The bytes of the blocks walked: at least the request's where the run can serve it.
    pub bytes: u64,
    /// The bytes of the pages the request would map in the run.
    pub to_map: u64,
    /// The address just past the last block walked.
    pub end: u64,
}
