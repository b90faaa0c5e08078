//! Frees in two steps, merging with neighbours, and cross-stream use through events
//! (`docs/allocator-rules.md` §7, §8).

use super::{Allocation, CachingAllocator};
use crate::backend::{Backend, StreamId};
use crate::block::{Location, NIL};
use crate::error::AllocatorError;
use crate::trace::TraceAction;

impl<B: Backend> CachingAllocator<B> {
    /// Frees an allocation.
    ///
    /// `allocated_bytes` drops at once (`free_requested`); if the block was used on other
    /// streams ([`CachingAllocator::record_stream`]) an event is recorded on each and the block
    /// returns to the cache (`free_completed`) only once they have completed, at a later
    /// `malloc` or `empty_cache`. A stale, foreign or already freed handle is an error and
    /// changes nothing.
    ///
    /// Always inlined: with malloc (which the compiler inlines) beside it in a caller's loop, a
    /// free as a call of its own cost 2.3–3.1% more instructions per op on every op file
    /// (docs/journal/conformance-2026-11.md, "Cuts on the free path"). The part for blocks used
    /// on other streams stays out of line.
    #[inline(always)]
    pub fn free(&mut self, allocation: Allocation) -> Result<(), AllocatorError> {
        if allocation.is_empty() {
            return match allocation.allocator == self.id {
                true => Ok(()),
                false => Err(crate::error::HandleError::Foreign { address: 0 }.into()),
            };
        }
        let id = self.live_block(&allocation)?;
        if self.blocks.has_stream_uses(id) {
            return self.free_used_on_other_streams(id);
        }
        // Nearly every free: the block goes straight back to its pool.
        self.free_requested(id);
        self.free_block(id);
        Ok(())
    }

    /// The free of a block used on other streams: an event recorded on each, and the block
    /// back in its pool once they have all completed.
    #[cold]
    #[inline(never)]
    pub(super) fn free_used_on_other_streams(&mut self, id: u32) -> Result<(), AllocatorError> {
        if !self.routing.is_empty() {
            // During a capture the events wait until no pool is routed to; the block keeps its
            // stream uses until then, and waits as a block with events does.
            self.free_requested(id);
            let b = &self.blocks[id];
            self.stats.count_waiting(b.pool, b.size);
            self.deferred_frees.push(id);
            return Ok(());
        }
        // Record the events first: if the device fails, the block stays allocated and intact.
        let events = self.record_free_events(id)?;
        self.free_requested(id);
        if events.is_empty() {
            self.free_block(id);
            return Ok(());
        }
        // record_stream keeps the set below u16::MAX streams.
        self.blocks[id].event_count += events.len() as u16;
        let b = &self.blocks[id];
        self.stats.count_waiting(b.pool, b.size);
        for (stream, event) in events {
            self.events.entry(stream).or_default().push_back((event, id));
        }
        Ok(())
    }

    /// `free_requested`: the block is no longer allocated, though it stays active until its
    /// free completes (at once, or when its streams' events have).
    #[inline(always)]
    pub(super) fn free_requested(&mut self, id: u32) {
        let b = &mut self.blocks[id];
        b.allocated = false;
        let (ptr, size, pool, stream, requested) = (b.ptr, b.size, b.pool, b.stream, b.requested_size);
        let block_context = if self.contexts_used { self.blocks.context(id) } else { None };
        let oversize = self.is_oversize(size);
        self.stats.families().free_requested(pool, size, oversize);
        let context = self.current_context.or(block_context);
        self.record(TraceAction::FreeRequested, ptr, requested, stream, context);
    }

    /// Records an event on every stream that used block `id` (`insert_events`), taking its
    /// stream uses (none recorded for none). If the device fails, no event is kept and the
    /// block keeps its uses, unchanged. Only the cold path of `free` calls it.
    fn record_free_events(&mut self, id: u32) -> Result<Vec<(StreamId, B::Event)>, AllocatorError> {
        let uses = self.blocks.take_stream_uses(id);
        let mut events = Vec::with_capacity(uses.len());
        for &stream in &uses {
            match self.backend.record_event(stream) {
                Ok(event) => events.push((stream, event)),
                Err(error) => {
                    for (_, event) in events {
                        self.backend.release_event(event);
                    }
                    self.blocks.restore_stream_uses(id, uses);
                    return Err(error.into());
                }
            }
        }
        Ok(events)
    }

    /// `record_stream`: the block is also used on `stream`, so when it is freed it is not
    /// reused before the work queued on `stream` up to that moment has finished.
    pub fn record_stream(&mut self, allocation: &Allocation, stream: StreamId) -> Result<(), AllocatorError> {
        if allocation.is_empty() {
            return Ok(());
        }
        let id = self.live_block(allocation)?;
        if stream != self.blocks[id].stream
            && let Err(count) = self.blocks.add_stream_use(id, stream)
        {
            return Err(AllocatorError::Unsupported(format!(
                "record_stream: the block at {:#x} is already used on {count} streams",
                allocation.address()
            )));
        }
        Ok(())
    }

    /// `process_events`: completes the frees whose events have all finished, stream by
    /// stream in FIFO order (a pending event blocks the ones behind it on its stream).
    /// Every `malloc` starts with this.
    pub fn process_events(&mut self) -> Result<(), AllocatorError> {
        self.insert_deferred_events()?;
        if self.events.is_empty() {
            return Ok(());
        }
        let streams: Vec<StreamId> = self.events.keys().copied().collect();
        for stream in streams {
            while let Some(queue) = self.events.get_mut(&stream) {
                let Some((event, _)) = queue.front() else { break };
                if !self.backend.query_event(event)? {
                    break;
                }
                if let Some((event, block)) = queue.pop_front() {
                    self.backend.release_event(event);
                    self.event_completed(block);
                }
            }
            if self.events.get(&stream).is_some_and(|q| q.is_empty()) {
                self.events.remove(&stream);
            }
        }
        Ok(())
    }

    /// `synchronize_and_free_events`: waits for every outstanding event and completes the
    /// frees behind them. Counted in `num_sync_all_streams`.
    pub(super) fn synchronize_and_free_events(&mut self) -> Result<(), AllocatorError> {
        self.insert_deferred_events()?;
        self.stats.num_sync_all_streams += 1;
        while let Some(mut entry) = self.events.first_entry() {
            let Some((event, block)) = entry.get_mut().pop_front() else {
                entry.remove();
                continue;
            };
            let stream = *entry.key();
            if let Err(error) = self.backend.synchronize_event(&event) {
                // Put it back: the free stays pending and the allocator consistent.
                self.events.entry(stream).or_default().push_front((event, block));
                return Err(error.into());
            }
            self.backend.release_event(event);
            self.event_completed(block);
        }
        Ok(())
    }

    /// `insert_events_deferred_until_no_capture`: once no pool is routed to, the events of the
    /// frees deferred during a capture are recorded, in the order of the frees. A block whose
    /// recording fails stays deferred, with its uses, and the error is returned.
    pub(super) fn insert_deferred_events(&mut self) -> Result<(), AllocatorError> {
        if self.deferred_frees.is_empty() || !self.routing.is_empty() {
            return Ok(());
        }
        let deferred = std::mem::take(&mut self.deferred_frees);
        for (at, &id) in deferred.iter().enumerate() {
            let events = match self.record_free_events(id) {
                Ok(events) => events,
                Err(error) => {
                    self.deferred_frees = deferred[at..].to_vec();
                    return Err(error);
                }
            };
            if events.is_empty() {
                let b = &self.blocks[id];
                self.stats.count_wait_over(b.pool, b.size);
                self.free_block(id);
                continue;
            }
            self.blocks[id].event_count += events.len() as u16;
            for (stream, event) in events {
                self.events.entry(stream).or_default().push_back((event, id));
            }
        }
        Ok(())
    }

    fn event_completed(&mut self, block: u32) {
        let b = &mut self.blocks[block];
        b.event_count -= 1;
        if b.event_count == 0 {
            let (pool, size) = (b.pool, b.size);
            self.stats.count_wait_over(pool, size);
            self.free_block(block);
        }
    }

    /// `free_block`: the block goes back to its pool, merged with free neighbours.
    pub(super) fn free_block(&mut self, id: u32) {
        debug_assert!(self.blocks.is_allocatable(id) && self.blocks[id].location == Location::Active);
        let b = &self.blocks[id];
        let (ptr, requested, stream, pool, expandable) = (b.ptr, b.requested_size, b.stream, b.pool, b.expandable);
        if self.contexts_used {
            let context = self.current_context.or(self.blocks.context(id));
            self.record(TraceAction::FreeCompleted, ptr, requested, stream, context);
            self.blocks.cold_mut(id).context = NIL;
        } else {
            self.record(TraceAction::FreeCompleted, ptr, requested, stream, None);
        }

        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for candidate in [self.blocks[id].prev, self.blocks[id].next] {
            // Checked here, not only inside: an unsplit block has no neighbours, and the call
            // costs more than the check.
            if candidate == NIL {
                continue;
            }
            let subsumed = self.try_merge_blocks(id, candidate);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        self.insert_free(id);
        if self.blocks[id].is_split() {
            net_blocks += 1;
            net_bytes += self.blocks[id].size as i64;
        }
        // Fully free pages of expandable segments can always be released, so PyTorch leaves
        // them out of the inactive-split accounting.
        let split_net = (!expandable).then_some((net_blocks, net_bytes));
        self.stats.count_free_completed(pool, requested, split_net);
    }

    /// `try_merge_blocks`: `dst` (out of every set) absorbs the free neighbour `src`; returns the
    /// bytes absorbed, 0 if `src` cannot be merged. The surviving object is always `dst`.
    pub(super) fn try_merge_blocks(&mut self, dst: u32, src: u32) -> u64 {
        if src == NIL {
            return 0;
        }
        let s = &self.blocks[src];
        if !self.blocks.is_allocatable(src) || s.mapped != self.blocks[dst].mapped || s.location == Location::Active {
            return 0;
        }
        let (src_ptr, src_size, src_prev, src_next, src_mapped) = (s.ptr, s.size, s.prev, s.next, s.mapped);
        if src_mapped {
            self.remove_free(src);
        } else {
            self.remove_unmapped(src);
        }
        if self.blocks[dst].prev == src {
            self.blocks[dst].ptr = src_ptr;
            self.blocks[dst].prev = src_prev;
            if src_prev != NIL {
                self.blocks[src_prev].next = dst;
            } else {
                let segment = self.blocks[dst].segment;
                self.segments[segment].head = dst;
            }
        } else {
            self.blocks[dst].next = src_next;
            if src_next != NIL {
                self.blocks[src_next].prev = dst;
            }
        }
        self.blocks[dst].size += src_size;
        self.blocks.remove(src);
        src_size
    }
}
