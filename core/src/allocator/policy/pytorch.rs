//! PyTorch 2.11's placement rules, the default policy (`policy:pytorch`), exact to the byte
//! (`docs/allocator-rules.md` §2–§6, §14): power-of-two rounding divisions, 2 and 20 MiB
//! segments, every hit kept, `should_split`'s two thresholds, 20 MiB pages in the large pool,
//! nothing given back before a miss and nothing taken from the other pool.

use super::{GiveBacks, PolicyRules};
use crate::allocator::CachingAllocator;
use crate::allocator::malloc::Request;
use crate::backend::{Backend, StreamId};
use crate::size::{PoolKind, allocation_size, round_size};

/// PyTorch's rules ([`PolicyRules`]).
pub(in crate::allocator) struct PyTorch;

impl PolicyRules for PyTorch {
    #[inline]
    fn request<B: Backend>(allocator: &CachingAllocator<B>, size: u64, stream: StreamId) -> Request {
        let config = &allocator.config;
        let rounded = round_size(size, config.roundup_power2_divisions());
        Request {
            stream,
            pool: PoolKind::for_size(rounded),
            size: rounded,
            alloc_size: allocation_size(rounded, config.large_segment_size()),
            expandable: config.expandable_segments(),
            slot: allocator.routed_slot(stream),
        }
    }

    #[inline]
    fn keeps_hit<B: Backend>(_: &CachingAllocator<B>, _: u32, _: &Request) -> bool {
        true
    }

    /// `should_split`: small pool or expandable mode keep a remainder of at least 512 bytes;
    /// the large pool only one of more than 1 MiB, and never for oversize blocks.
    #[inline]
    fn splits<B: Backend>(allocator: &CachingAllocator<B>, block_size: u64, request: &Request) -> bool {
        let max_split = allocator.config.max_split_size_raw();
        crate::size::should_split(request.pool, request.expandable, max_split, block_size, request.size)
    }

    /// `large_segment_size` (20 MiB unless configured).
    fn large_page_size<B: Backend>(allocator: &CachingAllocator<B>) -> u64 {
        allocator.config.large_segment_size()
    }

    #[inline]
    fn other_pool_block<B: Backend>(_: &CachingAllocator<B>, _: &Request) -> Option<(u32, Request)> {
        None
    }

    #[inline]
    fn give_backs_before_miss<B: Backend>(_: &CachingAllocator<B>, _: &Request, scratch: &mut GiveBacks) {
        scratch.plan.clear();
        scratch.at_peak = false;
    }

    #[inline]
    fn maps_fewest_pages<B: Backend>(_: &CachingAllocator<B>, _: &Request) -> bool {
        false
    }
}
