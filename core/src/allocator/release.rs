//! Giving memory back: `empty_cache`, the oversize release of the retry chain and the garbage
//! collector (`docs/allocator-rules.md` §11–§13).

use super::CachingAllocator;
use super::malloc::Request;
use super::private::PoolSlot;
use crate::backend::Backend;
use crate::block::NIL;
use crate::error::AllocatorError;
use crate::size::PoolKind;
use crate::trace::TraceAction;

impl<B: Backend> CachingAllocator<B> {
    /// `torch.cuda.empty_cache()`: waits for all outstanding cross-stream events, then frees
    /// every cached segment that is entirely free and unmaps every fully free page of
    /// expandable segments. Segments holding even one live block keep all their memory.
    /// Private pools keep theirs while in use; released ones give it back too. While
    /// allocations are routed to a pool (a capture), the default pools are left alone.
    pub fn empty_cache(&mut self) -> Result<(), AllocatorError> {
        self.release_cached_blocks()
    }

    /// `release_cached_blocks`: the last step of the retry chain and `empty_cache`.
    pub(super) fn release_cached_blocks(&mut self) -> Result<(), AllocatorError> {
        if self.routing.is_empty() {
            self.synchronize_and_free_events()?;
            self.release_blocks(NIL, PoolKind::Large)?;
            self.release_blocks(NIL, PoolKind::Small)?;
        }
        self.release_freeable_pools()
    }

    /// `release_blocks`: frees unsplit free segments in set order, then unmaps the free pages of
    /// expandable blocks (releasing a reservation once nothing in it is mapped).
    pub(super) fn release_blocks(&mut self, slot: PoolSlot, kind: PoolKind) -> Result<(), AllocatorError> {
        let mut to_unmap = Vec::new();
        for id in self.pool(slot, kind).free.to_vec() {
            let b = &self.blocks[id];
            if b.expandable {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(id)?;
            }
        }
        for id in to_unmap {
            self.unmap_block(id)?;
            if !self.blocks[id].is_split() {
                self.release_expandable_segment(id)?;
            }
        }
        Ok(())
    }

    /// `release_block`: `cudaFree` of a whole free segment.
    pub(super) fn release_block(&mut self, id: u32) -> Result<(), AllocatorError> {
        let b = &self.blocks[id];
        debug_assert!(!b.expandable && !b.is_split());
        let (ptr, size, stream, pool, segment) = (b.ptr, b.size, b.stream, b.pool, b.segment);
        // Ask the device first: if it fails, nothing here has changed.
        self.backend.free_segment(ptr, size)?;
        let oversize = self.is_oversize(size);
        self.stats.families().device_free(pool, size, true, oversize);
        let context = self.current_context.or(self.segments[segment].context);
        self.record(TraceAction::SegmentFree, ptr, size, stream, context);
        self.total_allocated_memory -= size;
        self.remove_free(id);
        self.blocks.remove(id);
        if let Some(removed) = self.segments.remove(segment)
            && removed.private != NIL
        {
            self.private[removed.private].segments -= 1;
        }
        Ok(())
    }

    /// `release_available_cached_blocks`: with `max_split_size` set, frees one cached oversize
    /// block big enough for the request, or else the largest oversize blocks of the stream
    /// until enough bytes are released. Returns whether enough was released.
    pub(super) fn release_available_cached_blocks(&mut self, request: &Request) -> Result<bool, AllocatorError> {
        let max_split = self.config.max_split_size_raw();
        if max_split == u64::MAX {
            return Ok(false);
        }
        let stream = request.stream;
        let key_size = request.size.max(max_split);
        let tree = &self.pool(request.slot, request.pool).free;
        let found = tree.lower_bound(stream, key_size);
        match found {
            // Expandable blocks are never released here: PyTorch 2.11 would try to cudaFree
            // them (pytorch#123548); newer releases skip them, and so do we. Nor are split
            // blocks, which exist among oversize ones only after expandable segments were
            // switched on at run time (their `>= 512` split rule then applies to every block);
            // PyTorch would cudaFree part of a live segment there.
            Some(id) if self.blocks[id].stream == stream && self.is_whole_segment(id) => {
                self.release_block(id)?;
                Ok(true)
            }
            _ => {
                // No single block is large enough: free oversize blocks from the largest down.
                let mut cursor = match found {
                    Some(id) => tree.predecessor(&self.blocks, id),
                    None => tree.last_below(stream, key_size),
                };
                let mut released = 0u64;
                while let Some(id) = cursor {
                    let b = &self.blocks[id];
                    if released >= key_size || b.size < max_split || b.stream != stream {
                        break;
                    }
                    cursor = self.pool(request.slot, request.pool).free.predecessor(&self.blocks, id);
                    if self.is_whole_segment(id) {
                        released += b.size;
                        self.release_block(id)?;
                    }
                }
                Ok(released >= key_size)
            }
        }
    }

    /// A free block that is an entire ordinary segment, which `cudaFree` may return.
    fn is_whole_segment(&self, id: u32) -> bool {
        let b = &self.blocks[id];
        !b.expandable && !b.is_split()
    }

    /// `garbage_collect_cached_blocks`: when more than `garbage_collection_threshold` of the
    /// allowance is held, frees unsplit cached large blocks whose age (in best-fit searches of
    /// the pool since they were cached) is at least the average, repeating with a new average
    /// until enough is reclaimed or nothing more can be freed. No synchronization.
    pub(super) fn garbage_collect_cached_blocks(&mut self) -> Result<(), AllocatorError> {
        let Some(allowed) = self.allowed_memory_maximum else { return Ok(()) };
        let threshold = (self.config.garbage_collection_threshold() * allowed as f64) as u64;
        if self.total_allocated_memory <= threshold {
            return Ok(());
        }
        let target = self.total_allocated_memory - threshold;
        let clock = self.large.free_blocks_call_count;
        let age = |blocks: &crate::block::Blocks, id: u32| clock - blocks.cold(id).gc_count_base;
        let collectable = |b: &crate::block::Block| !b.is_split() && !b.expandable;

        let mut total_age: i64 = 0;
        let mut count: i64 = 0;
        for id in self.large.free.to_vec() {
            if collectable(&self.blocks[id]) {
                total_age += age(&self.blocks, id);
                count += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && count > 0 {
            let average = total_age as f64 / count as f64;
            freed_any = false;
            // Don't stop at the target within a pass: GC should not run again soon.
            for id in self.large.free.to_vec() {
                let b = &self.blocks[id];
                if collectable(b) && age(&self.blocks, id) as f64 >= average {
                    freed_any = true;
                    reclaimed += b.size;
                    total_age -= age(&self.blocks, id);
                    count -= 1;
                    self.release_block(id)?;
                }
            }
        }
        Ok(())
    }
}
