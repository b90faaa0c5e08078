//! Timing op-file replays on the CUDA backend with the reference harness's method
//! ([`cachalot_core::ops::timing`]), so they compare with `torch_alloc_bench.py`'s figures of the
//! same run as a ratio.

use cachalot_core::AllocatorConfig;
use cachalot_core::ops::OpFile;
use cachalot_core::ops::timing::{ReplayTiming, WARMUP_REPLAYS, time_replays};

use crate::error::CudaError;

/// Times `ops` on a fresh PyTorch-exact allocator with `config` over CUDA device `ordinal`,
/// like the reference harness (a device synchronize after each replay, untimed); the cache is
/// emptied at the end.
pub fn time_on_cuda(
    ops: &OpFile,
    ordinal: usize,
    config: AllocatorConfig,
    timed: usize,
) -> Result<ReplayTiming, CudaError> {
    let mut allocator = crate::caching_allocator(ordinal, config)?;
    let device = std::sync::Arc::clone(allocator.backend().cuda());
    let timing = time_replays(&mut allocator, ops, WARMUP_REPLAYS, timed, |_| device.synchronize())?;
    allocator.empty_cache()?;
    Ok(timing)
}
