//! Timing op-file replays the way `shared/bench/torch_alloc_bench.py` times PyTorch's caching
//! allocator, so the numbers of one run on one machine compare as a ratio.
//!
//! The reference harness replays a file 6 times on one allocator (all ops on the default
//! stream), drops the first replay as a warm-up, times only the replay loop, synchronizes the
//! device after each replay, and reports the median ns per op (an op is one allocate or one
//! free). [`time_replays`] does the same on any backend; [`time_on_sim`] on the simulator.

use std::time::Instant;

use super::OpFile;
use cachalot_core::{Allocation, AllocatorConfig, AllocatorError, Backend, CachingAllocator, SimBackend};

/// Replays the harness drops as a warm-up.
pub const WARMUP_REPLAYS: usize = 1;

/// Replays the harness times.
pub const TIMED_REPLAYS: usize = 5;

/// The timing of one op file on one allocator.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayTiming {
    /// ns per op of each timed replay, in order (warm-ups left out).
    pub ns_per_op: Vec<f64>,
    /// The device allocations and frees (segments, or pages mapped and unmapped) each timed
    /// replay made, in the same order: a replay with none ran on the cache alone, which is
    /// what a policy's hot path costs; one with some paid for driver calls too.
    pub device_calls: Vec<u64>,
    /// Their median (the mean of the middle two for an even count, as Python's).
    pub median: f64,
}

/// The median of `values` (0 for none), as Python's `statistics.median`.
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
/// returns the timed replays' ns per op and device calls (counted over the timed region only).
/// `synchronize` runs after each replay, untimed (the harness's `cudaDeviceSynchronize`);
/// allocations a file leaves live are freed untimed too.
pub fn time_replays<B: Backend, E>(
    allocator: &mut CachingAllocator<B>,
    ops: &OpFile,
    warmups: usize,
    timed: usize,
    mut synchronize: impl FnMut(&mut CachingAllocator<B>) -> Result<(), E>,
) -> Result<ReplayTiming, E>
where
    E: From<AllocatorError>,
{
    let mut handles: Vec<Option<Allocation>> = vec![None; ops.handles];
    let count = ops.ops.len().max(1) as f64;
    let mut ns_per_op = Vec::with_capacity(timed);
    let mut device_calls = Vec::with_capacity(timed);
    let calls_so_far = |allocator: &CachingAllocator<B>| {
        let stats = allocator.stats();
        stats.num_device_alloc + stats.num_device_free
    };
    for replay in 0..warmups + timed {
        let before = calls_so_far(allocator);
        let start = Instant::now();
        ops.replay(allocator, &mut handles, true)?;
        let elapsed = start.elapsed();
        let calls = calls_so_far(allocator) - before;
        synchronize(allocator)?;
        OpFile::free_live(allocator, &mut handles)?;
        if replay >= warmups {
            ns_per_op.push(elapsed.as_nanos() as f64 / count);
            device_calls.push(calls);
        }
    }
    Ok(ReplayTiming { median: median(&ns_per_op), ns_per_op, device_calls })
}

/// Times `ops` on a fresh allocator with `config` over the simulator with `capacity` bytes:
/// the policy's own cost, with no device calls.
pub fn time_on_sim(
    ops: &OpFile,
    capacity: u64,
    config: AllocatorConfig,
    timed: usize,
) -> Result<ReplayTiming, AllocatorError> {
    let mut allocator = CachingAllocator::new(SimBackend::new(capacity), config)?;
    time_replays(&mut allocator, ops, WARMUP_REPLAYS, timed, |_| Ok::<(), AllocatorError>(()))
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
        let timing = time_on_sim(&ops, 1 << 30, AllocatorConfig::default(), 3).unwrap();
        assert_eq!(timing.ns_per_op.len(), 3);
        assert!(timing.ns_per_op.iter().all(|&ns| ns > 0.0));
        // The warm-up allocated the segments; the timed replays ran on the cache.
        assert_eq!(timing.device_calls, [0, 0, 0]);
        assert!(format_line("steady-1MiB.ops", "cachalot-sim", 12.34).ends_with("      12.3 ns/op"));
    }

    /// Live allocations left by a replay are freed between replays, so each replay starts from
    /// the same cache state and the allocator ends with nothing allocated.
    #[test]
    fn leftovers_are_freed_between_replays() {
        let ops = OpFile::parse("a 0 1048576\na 1 512\nf 1\n").unwrap();
        let mut allocator = CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default()).unwrap();
        time_replays(&mut allocator, &ops, 1, 2, |_| Ok::<(), AllocatorError>(())).unwrap();
        assert_eq!(allocator.stats().memory_allocated(), 0);
    }
}
