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
    /// until enough bytes are released ([`Self::oversize_to_release`]). Returns whether enough
    /// was released.
    pub(super) fn release_available_cached_blocks(&mut self, request: &Request) -> Result<bool, AllocatorError> {
        let mut victims = Vec::new();
        let enough = self.oversize_to_release(request, |_| false, &mut victims);
        for id in victims {
            self.release_block(id)?;
        }
        Ok(enough)
    }

    /// `release_available_cached_blocks`' choice, without releasing anything: the free blocks
    /// it releases for `request`, in order, into `victims`, and whether they are enough. The
    /// blocks `gone` says earlier steps of the chain took are passed over, as if released
    /// (the malloc passes none: it released them). One function for the malloc and the
    /// replay's plan of it (`chain/plan.rs`).
    pub(super) fn oversize_to_release(
        &self,
        request: &Request,
        gone: impl Fn(u32) -> bool,
        victims: &mut Vec<u32>,
    ) -> bool {
        let max_split = self.config.max_split_size_raw();
        if max_split == u64::MAX {
            return false;
        }
        let stream = request.stream;
        let key_size = request.size.max(max_split);
        let tree = &self.pool(request.slot, request.pool).free;
        let mut found = tree.lower_bound(stream, key_size);
        while let Some(id) = found.filter(|&id| gone(id)) {
            found = tree.successor(&self.blocks, id);
        }
        // Expandable blocks are never released here: PyTorch 2.11 would try to cudaFree them
        // (pytorch#123548); newer releases skip them, and so do we. Nor are split blocks, which
        // exist among oversize ones only after expandable segments were switched on at run
        // time (their `>= 512` split rule then applies to every block); PyTorch would cudaFree
        // part of a live segment there.
        if let Some(id) = found
            && self.blocks[id].stream == stream
            && self.is_whole_segment(id)
        {
            victims.push(id);
            return true;
        }
        // No single block is large enough: free oversize blocks from the largest down.
        let mut cursor = match found {
            Some(id) => tree.predecessor(&self.blocks, id),
            None => tree.last_below(stream, key_size),
        };
        let mut released = 0u64;
        while let Some(id) = cursor {
            cursor = tree.predecessor(&self.blocks, id);
            if gone(id) {
                continue;
            }
            let b = &self.blocks[id];
            if released >= key_size || b.size < max_split || b.stream != stream {
                break;
            }
            if self.is_whole_segment(id) {
                released += b.size;
                victims.push(id);
            }
        }
        released >= key_size
    }

    /// A free block that is an entire ordinary segment, which `cudaFree` may return.
    fn is_whole_segment(&self, id: u32) -> bool {
        let b = &self.blocks[id];
        !b.expandable && !b.is_split()
    }

    /// `garbage_collect_cached_blocks`: when more than `garbage_collection_threshold` of the
    /// allowance is held, frees unsplit cached large blocks whose age (in best-fit searches of
    /// the pool since they were cached) is at least the average, repeating with a new average
    /// until enough is reclaimed or nothing more can be freed
    /// ([`Self::garbage_to_collect`]). No synchronization.
    pub(super) fn garbage_collect_cached_blocks(&mut self) -> Result<(), AllocatorError> {
        let victims =
            self.garbage_to_collect(self.large.free_blocks_call_count, self.total_allocated_memory, |_| false);
        for id in victims {
            self.release_block(id)?;
        }
        Ok(())
    }

    /// `garbage_collect_cached_blocks`' choice, without releasing anything: the blocks it
    /// releases, in order, when the large pool's clock reads `clock` and the device holds
    /// `held` bytes, passing over the blocks `gone` says earlier steps of the chain took. One
    /// function for the malloc and the replay's plan of it (`chain/plan.rs`).
    pub(super) fn garbage_to_collect(&self, clock: i64, held: u64, gone: impl Fn(u32) -> bool) -> Vec<u32> {
        let Some(allowed) = self.allowed_memory_maximum else { return Vec::new() };
        let threshold = (self.config.garbage_collection_threshold() * allowed as f64) as u64;
        if held <= threshold {
            return Vec::new();
        }
        let target = held - threshold;
        let age = |id: u32| clock - self.blocks.cold(id).gc_count_base;
        let collectable = |id: u32| !gone(id) && !self.blocks[id].is_split() && !self.blocks[id].expandable;
        let mut candidates: Vec<(u32, bool)> =
            self.large.free.to_vec().into_iter().filter(|&id| collectable(id)).map(|id| (id, false)).collect();
        let mut total_age: i64 = candidates.iter().map(|&(id, _)| age(id)).sum();
        let mut count = candidates.len() as i64;
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        let mut victims = Vec::new();
        while reclaimed < target && freed_any && count > 0 {
            let average = total_age as f64 / count as f64;
            freed_any = false;
            // Don't stop at the target within a pass: GC should not run again soon.
            for (id, taken) in &mut candidates {
                if !*taken && age(*id) as f64 >= average {
                    *taken = true;
                    freed_any = true;
                    reclaimed += self.blocks[*id].size;
                    total_age -= age(*id);
                    count -= 1;
                    victims.push(*id);
                }
            }
        }
        victims
    }
}
