//! cachalot's own placement policy (`policy:cachalot`), opt-in: it fragments less than PyTorch's.
//!
//! PyTorch's policy trades memory for fewer `cudaMalloc` calls in four places, and this policy
//! undoes each of them while keeping everything else — pools, stream-keyed best fit, splitting
//! and merging, cross-stream events, the OOM retry chain, stats and trace events — as the PyTorch policy
//! has them (`docs/allocator-rules.md` §24):
//!
//! 1. **Rounding**: requests round to 512 bytes only. `roundup_power2_divisions` is ignored, as
//!    its extra rounding is memory held but never used.
//! 2. **Pages where the device maps them**: on a backend that can reserve address space and map
//!    pages (CUDA's VMM, the simulator), new memory always comes as pages of 2 MiB (the driver's
//!    granularity), in both pools, whatever `expandable_segments` says — PyTorch maps 20 MiB
//!    pages in the large pool, only when asked. A hole between live blocks then holds at most
//!    the pages it cannot give back. On a backend without mapping (wgpu), a large-pool miss asks
//!    for the rounded request rounded up to 2 MiB (`kRoundLarge`), never the 20 MiB
//!    `large_segment_size` that 1–10 MiB requests get from PyTorch, and every remainder of at
//!    least 512 bytes is split off for the next request.
//! 3. **No segment pinned by a smaller block**: a best-fit hit on a whole cached segment larger
//!    than the segment a miss would take is treated as a miss, so the segment goes back to the
//!    device instead of being split under the request.
//! 4. **Cached memory before a new peak**: when a miss would take reserved memory above its peak
//!    so far, every cached segment that is entirely free (of any stream and either pool) is
//!    returned first, and every fully free page unmapped. The peak then only rises while the
//!    cache holds nothing that could be given back, which is what brings it close to peak
//!    allocated: PyTorch's policy keeps such memory (even that of another stream, which cannot
//!    serve the request) and takes new memory beside it. Below the peak the cache is kept, as
//!    PyTorch keeps it.
//!
//! The price is device calls: a job that frees and re-allocates a different size goes back to
//! the device more often (`num_device_alloc` / `num_device_free` show it, and `cachalot tune
//! --objective device-calls` weighs it). The cache-hit path is the same as PyTorch's.
//!
//! Memory of a pending cross-stream free is not touched: its block is not free until its events
//! complete, so neither the block nor its segment can be returned early, and a free block only
//! ever serves requests of its own stream.

use super::CachingAllocator;
use super::malloc::Request;
use crate::backend::{Backend, StreamId};
use crate::error::AllocatorError;
use crate::size::{MIN_BLOCK_SIZE, PoolKind, ROUND_LARGE, SMALL_BUFFER};

impl<B: Backend> CachingAllocator<B> {
    /// The page size of large-pool expandable segments under this policy: the device's mapping
    /// granularity (2 MiB on CUDA), not PyTorch's 20 MiB, so an unmapped hole wastes less.
    pub(super) const COMPACT_LARGE_PAGE: u64 = ROUND_LARGE;

    /// The block and segment sizes for a request of `size` (> 0) bytes under this policy.
    #[inline]
    pub(super) fn compact_request(&self, size: u64, stream: StreamId) -> Request {
        let rounded = size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE;
        let pool = PoolKind::for_size(rounded);
        let alloc_size = match pool {
            PoolKind::Small => SMALL_BUFFER,
            PoolKind::Large => rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE,
        };
        // Pages, where the device can map them: a hole then costs at most the pages it does not
        // fill, and fully free pages go back on a miss even inside a segment still in use.
        let expandable = self.backend.device().supports_expandable_segments;
        Request { stream, pool, size: rounded, alloc_size, expandable, slot: self.routed_slot(stream) }
    }

    /// Whether a free block of `block_size` bytes serving `request` is split: whenever the
    /// remainder can hold a block, except for oversize requests (`max_split_size_mb`), which
    /// keep PyTorch's meaning of never splitting.
    #[inline]
    pub(super) fn compact_should_split(&self, block_size: u64, request: &Request) -> bool {
        block_size - request.size >= MIN_BLOCK_SIZE && request.size < self.config.max_split_size_raw()
    }

    /// The best-fit block `block` (taken out of its pool) if it should serve `request`; `None`
    /// (the block back in its pool) when it is a whole cached segment larger than the segment a
    /// miss would take: splitting it would pin the whole segment under a smaller block, while a
    /// miss returns it to the device and takes only what the request needs.
    #[inline]
    pub(super) fn compact_keep_hit(&mut self, block: u32, request: &Request) -> Option<u32> {
        let b = &self.blocks[block];
        if b.expandable || b.is_split() || b.size <= request.alloc_size {
            return Some(block);
        }
        self.insert_free(block);
        None
    }

    /// Before a cache miss takes new memory for `request`: if that would raise reserved memory
    /// above its peak so far, returns every entirely free cached segment to the device and
    /// unmaps every fully free page, in both pools. Below the peak the cache is kept: taking
    /// memory there cannot raise the peak, and keeping it spares the device calls (and the scan
    /// of the free blocks) of a job that comes back to sizes it has freed.
    pub(super) fn return_free_memory_before(&mut self, request: &Request) -> Result<(), AllocatorError> {
        if self.memory_reserved().saturating_add(request.alloc_size) <= self.stats.max_memory_reserved() {
            return Ok(());
        }
        self.release_blocks(request.slot, PoolKind::Large)?;
        self.release_blocks(request.slot, PoolKind::Small)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{AllocatorConfig, Policy};
    use crate::size::MIB;
    use crate::{CachingAllocator, SimBackend, StreamId};

    fn allocator(settings: &str) -> CachingAllocator<SimBackend> {
        CachingAllocator::new(SimBackend::new(80 << 30), AllocatorConfig::parse(settings).unwrap()).unwrap()
    }

    #[test]
    fn rounds_to_512_bytes_and_sizes_segments_to_the_request() {
        let mut pytorch = allocator("roundup_power2_divisions:4");
        let mut ours = allocator("roundup_power2_divisions:4,policy:cachalot");
        assert_eq!(ours.config().policy(), Policy::Cachalot);
        let size = 5 * MIB + 3;
        let a = pytorch.malloc(size, StreamId::DEFAULT).unwrap();
        let b = ours.malloc(size, StreamId::DEFAULT).unwrap();
        assert_eq!(a.size(), 6 * MIB, "PyTorch rounds to a quarter of the power of two");
        assert_eq!(b.size(), 5 * MIB + 512);
        assert_eq!(pytorch.memory_reserved(), 20 * MIB, "PyTorch's 1-10 MiB requests get 20 MiB");
        assert_eq!(ours.memory_reserved(), 6 * MIB);
    }

    #[test]
    fn a_miss_returns_free_segments_of_every_stream_first() {
        let side = StreamId(7);
        for (settings, reserved) in [("", 24 * MIB), ("policy:cachalot", 12 * MIB)] {
            let mut allocator = allocator(settings);
            let a = allocator.malloc(12 * MIB, side).unwrap();
            allocator.free(a).unwrap();
            allocator.malloc(12 * MIB, StreamId::DEFAULT).unwrap();
            assert_eq!(allocator.memory_reserved(), reserved, "{settings:?}");
            allocator.check_consistency().unwrap();
        }
    }

    #[test]
    fn below_the_peak_a_miss_keeps_the_cache() {
        let mut allocator = allocator("policy:cachalot");
        let a = allocator.malloc(40 * MIB, StreamId::DEFAULT).unwrap();
        let _b = allocator.malloc(8 * MIB, StreamId(7)).unwrap();
        allocator.free(a).unwrap();
        allocator.empty_cache().unwrap();
        assert_eq!((allocator.memory_reserved(), allocator.stats().max_memory_reserved()), (8 * MIB, 48 * MIB));
        let c = allocator.malloc(16 * MIB, StreamId::DEFAULT).unwrap();
        allocator.free(c).unwrap();
        // 24 MiB reserved, 16 of them cached on the default stream: another stream's 8 MiB
        // stays below the peak of 48, so the cache is kept.
        allocator.malloc(8 * MIB, StreamId(9)).unwrap();
        assert_eq!(allocator.memory_reserved(), 32 * MIB);
        // Another 20 MiB would pass the peak: the 16 cached MiB go back first.
        allocator.malloc(20 * MIB, StreamId(9)).unwrap();
        assert_eq!(allocator.memory_reserved(), 36 * MIB);
        assert_eq!(allocator.stats().max_memory_reserved(), 48 * MIB);
        allocator.check_consistency().unwrap();
    }

    #[test]
    fn a_hit_keeps_the_cache() {
        let mut allocator = allocator("policy:cachalot");
        let a = allocator.malloc(12 * MIB, StreamId::DEFAULT).unwrap();
        let small = allocator.malloc(4096, StreamId::DEFAULT).unwrap();
        allocator.free(a).unwrap();
        allocator.free(small).unwrap();
        allocator.malloc(12 * MIB, StreamId::DEFAULT).unwrap();
        assert_eq!(allocator.stats().num_device_alloc, 2);
        assert_eq!(allocator.stats().num_device_free, 0);
        assert_eq!(allocator.memory_reserved(), 14 * MIB);
    }
}
