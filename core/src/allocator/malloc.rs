//! `malloc`: best fit in the cache, splitting, new segments and the out-of-memory retry chain
//! (`docs/allocator-rules.md` §5, §6, §9, §10).

use super::chain::{Apply, walk};
use super::observer::OomEvent;
use super::policy::{PolicyRules, with_policy};
use super::private::PoolSlot;
use super::{Allocation, CachingAllocator};
use crate::backend::{Backend, BackendError, StreamId};
use crate::block::{Block, Location, NIL, Segment};
use crate::error::{AllocatorError, OomText, OutOfMemoryError};
use crate::size::{MAX_REQUEST, PoolKind};
use crate::trace::TraceAction;

/// What one `malloc` is looking for (PyTorch's `AllocParams`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Request {
    pub stream: StreamId,
    pub pool: PoolKind,
    /// The rounded block size.
    pub size: u64,
    /// The segment size a cache miss asks the device for.
    pub alloc_size: u64,
    pub expandable: bool,
    /// The private pool serving the request ([`NIL`] for the default pools): `get_pool`'s
    /// choice among the pools allocations are routed to.
    pub slot: PoolSlot,
}

impl<B: Backend> CachingAllocator<B> {
    /// Allocates `size` bytes for use on `stream`.
    ///
    /// A zero-byte request returns an empty handle without touching the cache, as PyTorch does.
    /// Out of memory is an [`AllocatorError::OutOfMemory`] carrying PyTorch's message, after the
    /// full retry chain (garbage collection, new segment, release of oversize blocks, release
    /// of the whole cache).
    pub fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Allocation, AllocatorError> {
        if size == 0 {
            return Ok(Allocation {
                allocator: self.id,
                block: NIL,
                generation: 0,
                stream,
                address: 0,
                size: 0,
                requested: 0,
            });
        }
        if size >= MAX_REQUEST {
            return Err(self.too_large(size));
        }
        // PyTorch queries no events while allocations are routed to a pool (event queries are
        // illegal during a graph capture): cross-stream frees complete after.
        if self.routing.is_empty() {
            self.process_events()?;
        }
        // One body for every policy, each of its three decisions matched on the policy where it
        // is made: a body per policy (generic, matched once here) cost 3-5% more instructions
        // per op on the op files (`scripts/dev/icount.sh`), its calls no longer inlined.
        let policy = self.config.policy();
        let request = with_policy!(policy, P => P::request(self, size, stream));
        let mut found = self.get_free_block(&request);
        if let Some(block) = found
            && !with_policy!(policy, P => P::keeps_hit(self, block, &request))
        {
            // Taken out and put back, as `policy:cachalot` always did (which restarts its
            // garbage-collection age).
            self.insert_free(block);
            found = None;
        }
        let Some(block) = found else {
            return self.malloc_miss(&request, size);
        };
        let split = self.should_split(block, &request);
        Ok(self.alloc_found_block(block, &request, size, split))
    }

    /// A cache miss: new memory for `request` (of `size` bytes as asked), through the retry
    /// chain (`chain/`, the steps applied under the configured policy), allocated; or the
    /// out-of-memory error. Never inlined: kept out of `malloc`, the miss path's code (under
    /// `policy:cachalot` its give-backs too) does not weigh on how the compiler lays out the
    /// hit path, which moved by several instructions per op with changes there.
    #[inline(never)]
    fn malloc_miss(&mut self, request: &Request, size: u64) -> Result<Allocation, AllocatorError> {
        with_policy!(self.config.policy(), P => self.malloc_miss_with::<P>(request, size))
    }

    /// [`Self::malloc_miss`] under the policy `P`.
    fn malloc_miss_with<P: PolicyRules>(&mut self, request: &Request, size: u64) -> Result<Allocation, AllocatorError> {
        // Only a miss asks the device, and only its out-of-memory error reads the device's limit.
        self.last_device_limit = None;
        let (collects_garbage, routed) = (self.gc_enabled(), !self.routing.is_empty());
        let mut steps = Apply::<B, P>::new(self, *request);
        let walked = walk(&mut steps, collects_garbage, routed);
        let served = steps.served();
        // What rule 7 of `policy:cachalot` learnt at this miss counts from the next one: the
        // replay's plan of this malloc read the state before it.
        self.settling.commit();
        walked?;
        let Some((block, served)) = served else {
            return Err(self.out_of_memory(request, size));
        };
        let split = P::splits(self, self.blocks[block].size, &served);
        Ok(self.alloc_found_block(block, &served, size, split))
    }

    /// `get_free_block`: the best-fit candidate of the request's stream, if the oversize rules
    /// allow it. Only the single best candidate is examined.
    ///
    /// Always inlined into `malloc`, its one caller: left to itself the compiler called it,
    /// 15 instructions more per malloc (2-4% per op on the op files).
    #[inline(always)]
    fn get_free_block(&mut self, request: &Request) -> Option<u32> {
        if self.gc_enabled() {
            let pool = super::pool_mut(&mut self.small, &mut self.large, &mut self.private, request.slot, request.pool);
            pool.free_blocks_call_count += 1;
            self.gc_clock_started = true;
        }
        let it = self.best_fit(request)?;
        self.remove_free(it);
        Some(it)
    }

    /// `get_free_block`'s choice, without taking it: the smallest free block of the request's
    /// stream and pool that fits, where expandable blocks count as the size they can grow to,
    /// within the limits of `max_split_size_mb`. Also the replay's plan of a malloc
    /// (`chain/plan.rs`), so the two cannot choose differently.
    ///
    /// Always inlined, as `get_free_block`: called from the plan and the policy too, the
    /// compiler otherwise called it from the hit path as well (2-3% more instructions per op).
    #[inline(always)]
    pub(super) fn best_fit(&self, request: &Request) -> Option<u32> {
        let stream = request.stream;
        let pool = &self.pool(request.slot, request.pool).free;
        // For expandable requests the next block comes along where the index knows it without
        // a search (the walk below asks for it); the others never walk, and skip the work.
        let (mut it, mut known_next) = match request.expandable {
            true => pool.lower_bound_and_next(stream, request.size)?,
            false => (pool.lower_bound(stream, request.size)?, None),
        };
        if self.blocks[it].stream != stream {
            return None;
        }
        if self.blocks[it].expandable {
            if request.expandable {
                // For best fit an expandable block counts as the size it can grow to: itself and
                // the unmapped block after it.
                let expandable_size = |id: u32| {
                    let b = &self.blocks[id];
                    b.size + if b.next != NIL && !self.blocks[b.next].mapped { self.blocks[b.next].size } else { 0 }
                };
                // A block with nothing unmapped after it can grow no further, and every later
                // block of the stream is at least as large: no successor can beat it, so the
                // walk (a tree step per malloc) is skipped, the common case in a warm cache.
                // Each block's expandable size is read once and carried to the next step: the
                // walk runs on most misses and many hits under policy:cachalot.
                let mut grown = expandable_size(it);
                while grown > self.blocks[it].size
                    && let Some(next) = known_next.take().unwrap_or_else(|| pool.successor(&self.blocks, it))
                {
                    let next_grown = expandable_size(next);
                    if !(self.blocks[it].expandable && self.blocks[next].stream == stream && next_grown < grown) {
                        break;
                    }
                    (it, grown) = (next, next_grown);
                }
            } else {
                // Expandable segments were switched off at run time: skip their blocks.
                loop {
                    it = pool.successor(&self.blocks, it)?;
                    if !(self.blocks[it].expandable && self.blocks[it].stream == stream) {
                        break;
                    }
                }
                if self.blocks[it].stream != stream {
                    return None;
                }
            }
        }
        // An oversize block is kept from a normal request, and an oversize request takes one
        // only within the rounding slack.
        if self.config.oversize_rules_refuse(request.size, self.blocks[it].size) {
            return None;
        }
        Some(it)
    }

    /// Whether the free block `block` serving `request` is split, as the policy decides it
    /// ([`PolicyRules::splits`]).
    fn should_split(&self, block: u32, request: &Request) -> bool {
        let block_size = self.blocks[block].size;
        with_policy!(self.config.policy(), P => P::splits(self, block_size, request))
    }

    /// `alloc_found_block`: splits if asked (the original block object becomes the free tail,
    /// keeping its stale requested size), marks the block allocated, records and counts it.
    pub(super) fn alloc_found_block(
        &mut self,
        found: u32,
        request: &Request,
        requested: u64,
        split: bool,
    ) -> Allocation {
        let already_split = self.blocks[found].is_split();
        let expandable = self.blocks[found].expandable;
        let pool = request.pool;
        let found_size = self.blocks[found].size;
        let mut block = found;
        if split {
            let remaining = found;
            let (ptr, prev) = (self.blocks[remaining].ptr, self.blocks[remaining].prev);
            let mut carved = self.sibling(remaining, ptr, request.size);
            carved.stream = request.stream;
            block = self.blocks.insert(carved);
            self.splice(block, prev, remaining);
            let tail = &mut self.blocks[remaining];
            tail.ptr += request.size;
            tail.size -= request.size;
            self.insert_free(remaining);
        }
        self.stats.families().split_on_alloc(pool, expandable, already_split, split, found_size, request.size);

        let context = self.current_context;
        if self.contexts_used {
            self.blocks.cold_mut(block).context = context.map_or(NIL, |c| c.0);
        }
        let b = &mut self.blocks[block];
        b.allocated = true;
        b.requested_size = requested;
        b.location = Location::Active;
        b.generation = b.generation.wrapping_add(1);
        let (ptr, size, stream, generation) = (b.ptr, b.size, b.stream, b.generation);
        self.record(TraceAction::Alloc, ptr, requested, stream, context);

        let oversize = self.is_oversize(size);
        self.stats.count_alloc(pool, size, requested, oversize);
        Allocation { allocator: self.id, block, generation, stream, address: ptr, size, requested }
    }

    /// `alloc_block`: a new segment (or expandable pages) for the request. `Ok(None)` means out
    /// of memory — the fraction allowance or the device refused; other device errors are `Err`.
    pub(super) fn alloc_block(&mut self, request: &Request, is_retry: bool) -> Result<Option<u32>, AllocatorError> {
        let size = request.alloc_size;
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if !self.fraction_allows(self.total_allocated_memory, size) {
            return Ok(None);
        }
        if request.expandable {
            return self.try_allocate_expandable_block(request);
        }
        let ptr = match self.backend.allocate_segment(size, request.stream) {
            Ok(ptr) => ptr,
            Err(BackendError::OutOfMemory { limit }) => {
                self.last_device_limit = limit;
                return Ok(None);
            }
            Err(other) => return Err(other.into()),
        };
        self.total_allocated_memory += size;
        let segment = self.segments.insert(Segment {
            base: ptr,
            size,
            pool: request.pool,
            stream: request.stream,
            head: NIL,
            page_size: None,
            context: self.current_context,
            private: request.slot,
        });
        if request.slot != NIL {
            self.private[request.slot].segments += 1;
        }
        let block = self.blocks.insert(Block::new(ptr, size, request.stream, request.pool, segment));
        self.segments[segment].head = block;
        let oversize = self.is_oversize(size);
        self.stats.families().device_alloc(request.pool, size, true, oversize);
        self.record(TraceAction::SegmentAlloc, ptr, size, request.stream, self.current_context);
        Ok(Some(block))
    }

    /// Whether the memory fraction lets the device hold `size` bytes more than `held`: checked
    /// before the device is asked, by the malloc and by the replay's plan of it alike.
    #[inline]
    pub(super) fn fraction_allows(&self, held: u64, size: u64) -> bool {
        self.allowed_memory_maximum.is_none_or(|allowed| held.saturating_add(size) <= allowed)
    }

    /// Builds the out-of-memory error, records the `oom` trace entry and counts it.
    fn out_of_memory(&mut self, request: &Request, requested: u64) -> AllocatorError {
        let total = self.backend.device().total_memory;
        let (device_free, device_total) = self.backend.memory_info().unwrap_or((0, total));
        let process_text = self.backend.process_memory_text();
        self.record(TraceAction::Oom, device_free, request.size, request.stream, self.current_context);
        self.stats.num_ooms += 1;
        let allocated = self.memory_allocated();
        let reserved = self.memory_reserved();
        let limit = self.last_device_limit.take();
        let in_private_pools = self.free_bytes_in_private_pools();
        let message = OomText {
            allocation_size: request.alloc_size,
            device: self.backend.device().index,
            device_total,
            device_free,
            process_text: &process_text,
            allowed: self.allowed_memory_maximum,
            allocated,
            reserved,
            in_private_pools,
            limit: limit.as_deref(),
        }
        .render();
        self.notify_oom_observers(&OomEvent {
            device: self.backend.device().index,
            requested: request.alloc_size,
            device_free,
            device_total,
            allowed: self.allowed_memory_maximum,
        });
        AllocatorError::OutOfMemory(Box::new(OutOfMemoryError {
            message,
            requested,
            rounded: request.size,
            allocation_size: request.alloc_size,
            device_free,
            device_total,
            allowed: self.allowed_memory_maximum,
            allocated,
            reserved,
            limit,
        }))
    }

    /// Requests of 2^60 bytes or more fail before anything else, with PyTorch's text.
    fn too_large(&self, size: u64) -> AllocatorError {
        AllocatorError::OutOfMemory(Box::new(OutOfMemoryError {
            message: "CUDA out of memory. Tried to allocate more than 1EB memory.".into(),
            requested: size,
            rounded: size,
            allocation_size: size,
            device_free: 0,
            device_total: self.backend.device().total_memory,
            allowed: self.allowed_memory_maximum,
            allocated: self.memory_allocated(),
            reserved: self.memory_reserved(),
            limit: None,
        }))
    }
}
