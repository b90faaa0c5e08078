//! Private pools: `torch.cuda.MemPool` with `use_mem_pool`, and the pools of CUDA graph
//! captures (`docs/allocator-rules.md` §25).
//!
//! A private pool is a pair of block pools (small and large) of its own, named by a
//! [`PoolId`]. While allocations are routed to it (`begin_allocate_to_pool`), requests its
//! filter accepts are served from its blocks and new segments join it; a block freed later
//! returns to the pool of its segment, wherever the free happens, so the default pools never
//! reuse a private pool's memory. A pool lives while its use count is above zero (the
//! `MemPool` object, each open `use_mem_pool` scope, each graph using it); once it is
//! released, `empty_cache` may free its cached segments, and the pool is dropped when it holds
//! none.
//!
//! As in PyTorch, every block of every pool counts in the same device statistics (a private
//! pool's small blocks in `small_pool`, its large ones in `large_pool`).

use super::{BlockPool, CachingAllocator};
use crate::backend::{Backend, StreamId};
use crate::block::NIL;
use crate::error::{AllocatorError, PoolError};
use crate::pool::{PoolFilter, PoolId};
use crate::size::PoolKind;

/// One private pool (PyTorch's `PrivatePool`).
#[derive(Clone, Debug)]
pub(crate) struct PrivatePool {
    pub id: PoolId,
    /// Users: the pool object, open routing scopes, graphs. At 0 the pool is freeable.
    pub use_count: u32,
    /// Segments (ordinary or expandable reservations) that belong to the pool.
    pub segments: u32,
    pub small: BlockPool,
    pub large: BlockPool,
}

impl PrivatePool {
    pub(crate) fn pool(&self, kind: PoolKind) -> &BlockPool {
        match kind {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    pub(crate) fn pool_mut(&mut self, kind: PoolKind) -> &mut BlockPool {
        match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }
}

/// Where a private pool's segments are: the pool's slot in the allocator, or [`NIL`] for the
/// default pools.
pub(crate) type PoolSlot = u32;

impl<B: Backend> CachingAllocator<B> {
    /// `MemPool()`: creates the private pool `id` with one user, or adds a user to it
    /// (`createOrIncrefPool`).
    pub fn create_pool(&mut self, id: PoolId) -> Result<(), AllocatorError> {
        self.create_or_incref_pool(id)?;
        Ok(())
    }

    /// `use_mem_pool(pool)` entering, or a CUDA graph capture beginning: from now on the
    /// requests `filter` accepts are served from pool `id` (created if it does not exist), which
    /// gains a user. Where several pools route, the one routed to last is asked first.
    pub fn begin_allocate_to_pool(&mut self, id: PoolId, filter: PoolFilter) -> Result<(), AllocatorError> {
        if id.is_default() {
            return Err(PoolError::Default.into());
        }
        if self.routing.iter().any(|(routed, _, _)| *routed == id) {
            return Err(PoolError::AlreadyRouting(id).into());
        }
        let slot = self.create_or_incref_pool(id)?;
        self.routing.push((id, slot, filter));
        Ok(())
    }

    /// `use_mem_pool` leaving (with [`CachingAllocator::release_pool`]), or a capture ending:
    /// requests are no longer routed to pool `id`.
    pub fn end_allocate_to_pool(&mut self, id: PoolId) -> Result<(), AllocatorError> {
        let at = self.routing.iter().position(|(routed, _, _)| *routed == id).ok_or(PoolError::NotRouting(id))?;
        self.routing.remove(at);
        Ok(())
    }

    /// `releasePool`: one user of pool `id` is gone (a `MemPool` deleted, a `use_mem_pool`
    /// scope left, a graph reset). When none is left, `empty_cache` may free its cached
    /// segments; blocks still allocated from it keep their segments until freed.
    pub fn release_pool(&mut self, id: PoolId) -> Result<(), AllocatorError> {
        let slot = self.pool_slot(id)?;
        let pool = &mut self.private[slot];
        if pool.use_count == 0 {
            return Err(PoolError::AlreadyReleased(id).into());
        }
        pool.use_count -= 1;
        Ok(())
    }

    /// `torch.cuda.empty_cache()` for one private pool (`emptyCache(mempool_id)`, which the
    /// `MemPool`'s destructor calls): if every user released the pool, waits for the
    /// outstanding events, frees its cached unsplit segments (small pool first) and drops the
    /// pool once it holds none. A pool still in use keeps everything.
    pub fn empty_pool_cache(&mut self, id: PoolId) -> Result<(), AllocatorError> {
        if id.is_default() {
            return self.empty_cache();
        }
        // PyTorch looks the pool up among the freeable ones only: an unknown or live pool is
        // not an error there, and nothing happens, not even the synchronization.
        if let Some(&slot) = self.private_ids.get(&id)
            && self.private[slot].use_count == 0
        {
            self.synchronize_and_free_events()?;
            self.release_private_pool(slot)?;
        }
        Ok(())
    }

    /// The private pools and their use counts, by id.
    pub fn private_pools(&self) -> Vec<(PoolId, u32)> {
        self.private_ids.iter().map(|(&id, &slot)| (id, self.private[slot].use_count)).collect()
    }

    /// The pools allocations are routed to now, oldest first.
    pub fn routed_pools(&self) -> Vec<(PoolId, PoolFilter)> {
        self.routing.iter().map(|&(id, _, filter)| (id, filter)).collect()
    }

    fn create_or_incref_pool(&mut self, id: PoolId) -> Result<PoolSlot, AllocatorError> {
        if id.is_default() {
            return Err(PoolError::Default.into());
        }
        if let Some(&slot) = self.private_ids.get(&id) {
            let pool = &mut self.private[slot];
            if pool.use_count == 0 {
                // PyTorch asserts a reused id is live: a released pool cannot be revived.
                return Err(PoolError::AlreadyReleased(id).into());
            }
            pool.use_count += 1;
            return Ok(slot);
        }
        let slot = self.private.insert(PrivatePool {
            id,
            use_count: 1,
            segments: 0,
            small: BlockPool::new(),
            large: BlockPool::new(),
        });
        self.private_ids.insert(id, slot);
        Ok(slot)
    }

    pub(super) fn pool_slot(&self, id: PoolId) -> Result<PoolSlot, PoolError> {
        if id.is_default() {
            return Err(PoolError::Default);
        }
        self.private_ids.get(&id).copied().ok_or(PoolError::Unknown(id))
    }

    /// `get_pool`'s choice: the most recently routed pool whose filter accepts `stream`, or the
    /// default pools ([`NIL`]).
    #[inline]
    pub(super) fn routed_slot(&self, stream: StreamId) -> PoolSlot {
        if self.routing.is_empty() {
            return NIL;
        }
        let caller = self.caller_route;
        self.routing
            .iter()
            .rev()
            .find(|&&(id, _, filter)| filter.accepts(stream) || (filter == PoolFilter::Caller && caller == Some(id)))
            .map_or(NIL, |&(_, slot, _)| slot)
    }

    /// Names the pool whose [`PoolFilter::Caller`] accepts the requests made from now on
    /// (`None`: none does), as the caller's own filters answered for them. Set before each
    /// request while such a pool is routed to; pools with other filters are unaffected.
    pub fn set_caller_route(&mut self, pool: Option<PoolId>) {
        self.caller_route = pool;
    }

    /// Addresses of the allocated blocks of private pool `id`, in address order (`None`: no
    /// such pool). What `checkPoolLiveAllocations` compares with the tensors a CUDA-graph tree
    /// expects alive.
    pub fn pool_live_allocations(&self, id: PoolId) -> Option<Vec<u64>> {
        let slot = self.pool_slot(id).ok()?;
        let mut live: Vec<u64> = self
            .segments
            .iter()
            .filter(|(_, segment)| segment.private == slot)
            .flat_map(|(_, segment)| {
                std::iter::successors(Some(segment.head).filter(|&b| b != NIL), |&b| {
                    Some(self.blocks[b].next).filter(|&next| next != NIL)
                })
            })
            .filter(|&b| self.blocks[b].allocated)
            .map(|b| self.blocks[b].ptr)
            .collect();
        live.sort_unstable();
        Some(live)
    }

    /// The pool a request on `stream` made now is served from (`get_pool`'s choice):
    /// [`PoolId::DEFAULT`] unless allocations are routed to a private pool that takes it.
    pub fn routed_pool(&self, stream: StreamId) -> PoolId {
        self.pool_id_of_slot(self.routed_slot(stream))
    }

    /// The id of the pool in `slot`.
    pub(super) fn pool_id_of_slot(&self, slot: PoolSlot) -> PoolId {
        if slot == NIL { PoolId::DEFAULT } else { self.private[slot].id }
    }

    /// Frees the cached segments of every released pool (`release_cached_blocks`' loop over
    /// `graph_pools_freeable`, in id order), dropping those left empty.
    pub(super) fn release_freeable_pools(&mut self) -> Result<(), AllocatorError> {
        let freeable: Vec<PoolSlot> =
            self.private_ids.values().copied().filter(|&slot| self.private[slot].use_count == 0).collect();
        for slot in freeable {
            self.release_private_pool(slot)?;
        }
        Ok(())
    }

    fn release_private_pool(&mut self, slot: PoolSlot) -> Result<(), AllocatorError> {
        self.release_blocks(slot, PoolKind::Small)?;
        self.release_blocks(slot, PoolKind::Large)?;
        // Reservations with nothing mapped (made by a request whose mapping failed) hold no
        // memory: PyTorch drops the pool with them still reserved; their address space goes back.
        let empty_reservations: Vec<u32> = self
            .segments
            .iter()
            .filter(|(_, s)| s.private == slot && s.page_size.is_some())
            .map(|(_, s)| s.head)
            .filter(|&head| !self.blocks[head].mapped && !self.blocks[head].is_split())
            .collect();
        for head in empty_reservations {
            self.release_expandable_segment(head)?;
        }
        // A pool allocations are still routed to stays (PyTorch would fail at its next request).
        if self.private[slot].segments == 0 && self.routing.iter().all(|&(_, routed, _)| routed != slot) {
            let id = self.private[slot].id;
            self.private_ids.remove(&id);
            self.private.remove(slot);
        }
        Ok(())
    }

    /// Bytes of free blocks in private pools (what PyTorch's OOM message calls "allocated in
    /// private pools").
    pub(super) fn free_bytes_in_private_pools(&self) -> u64 {
        self.private
            .iter()
            .flat_map(|(_, p)| [&p.small, &p.large])
            .flat_map(|pool| pool.free.to_vec())
            .map(|id| self.blocks[id].size)
            .sum()
    }
}
