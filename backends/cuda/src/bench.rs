//! Timing op-file replays the way `shared/bench/torch_alloc_bench.py` times PyTorch's caching
//! allocator, so the numbers of one run on one machine compare as a ratio.
//!
//! The reference harness replays a file 6 times on one allocator (all ops on the default
//! stream), drops the first replay as a warm-up, times only the replay loop, synchronizes the
//! device after each replay, and reports the median ns per op (an op is one allocate or one
//! free). [`replay_ns_per_op`] does the same on any backend.

use std::time::Instant;

use cachalot_core::ops::OpFile;
use cachalot_core::{Allocation, AllocatorConfig, Backend, CachingAllocator, SimBackend};

use crate::error::CudaError;

/// Replays the harness drops as a warm-up.
pub const WARMUP_REPLAYS: usize = 1;

/// Replays the harness times.
pub const TIMED_REPLAYS: usize = 5;

/// The timing of one op file on one allocator.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayTiming {
    /// ns per op of each timed replay, in order (warm-ups left out).
    pub ns_per_op: Vec<f64>,
    /// Their median (the mean of the middle two for an even count, as Python's).
    pub median: f64,
}

/// The median of `values` (0 for none).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// One line of output in the reference harness's shape: `file allocator median ns/op`.
pub fn format_line(file: &str, allocator: &str, median: f64) -> String {
    format!("{file:<28} {allocator:<16} {median:10.1} ns/op")
}

/// Replays `ops` `warmups + timed` times on `allocator`, all on the default stream, and
/// returns the timed replays' ns per op. `synchronize` runs after each replay, untimed (the
/// harness's `cudaDeviceSynchronize`); allocations a file leaves live are freed untimed too.
pub fn replay_ns_per_op<B: Backend, E>(
    allocator: &mut CachingAllocator<B>,
    ops: &OpFile,
    warmups: usize,
    timed: usize,
    mut synchronize: impl FnMut(&mut CachingAllocator<B>) -> Result<(), E>,
) -> Result<ReplayTiming, E>
where
    E: From<cachalot_core::AllocatorError>,
{
    let mut handles: Vec<Option<Allocation>> = vec![None; ops.handles];
    let count = ops.ops.len().max(1) as f64;
    let mut ns_per_op = Vec::with_capacity(timed);
    for replay in 0..warmups + timed {
        let start = Instant::now();
        ops.replay(allocator, &mut handles, true)?;
        let elapsed = start.elapsed();
        synchronize(allocator)?;
        for handle in handles.iter_mut() {
            if let Some(allocation) = handle.take() {
                allocator.free(allocation)?;
            }
        }
        if replay >= warmups {
            ns_per_op.push(elapsed.as_nanos() as f64 / count);
        }
    }
    Ok(ReplayTiming { median: median(&ns_per_op), ns_per_op })
}

/// Times `ops` on a fresh PyTorch-exact allocator over CUDA device `ordinal` (default
/// settings), like the reference harness; the cache is emptied at the end.
pub fn replay_on_cuda(ops: &OpFile, ordinal: usize, timed: usize) -> Result<ReplayTiming, CudaError> {
    let mut allocator = crate::caching_allocator(ordinal, AllocatorConfig::default())?;
    let device = std::sync::Arc::clone(allocator.backend().cuda());
    let timing = replay_ns_per_op(&mut allocator, ops, WARMUP_REPLAYS, timed, |_| device.synchronize())?;
    allocator.empty_cache()?;
    Ok(timing)
}

/// Times `ops` on a fresh allocator over the simulator with `capacity` bytes: the policy's
/// own cost, with no device calls.
pub fn replay_on_sim(ops: &OpFile, capacity: u64, timed: usize) -> Result<ReplayTiming, cachalot_core::AllocatorError> {
    let mut allocator = CachingAllocator::new(SimBackend::new(capacity), AllocatorConfig::default())?;
    replay_ns_per_op(&mut allocator, ops, WARMUP_REPLAYS, timed, |_| Ok::<(), cachalot_core::AllocatorError>(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_is_pythons() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn sim_replays_are_timed_per_op() {
        let ops = OpFile::parse("a 0 1048576\nf 0\na 1 512\na 2 4096\nf 1\n").unwrap();
        let timing = replay_on_sim(&ops, 1 << 30, 3).unwrap();
        assert_eq!(timing.ns_per_op.len(), 3);
        assert!(timing.ns_per_op.iter().all(|&ns| ns > 0.0));
        assert!(format_line("steady-1MiB.ops", "cachalot-sim", 12.34).ends_with("      12.3 ns/op"));
    }
}
