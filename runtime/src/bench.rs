//! `cachalot bench`: op files (`shared/bench/README.md`) timed on CUDA, wgpu or the simulator
//! with the method of PyTorch's reference harness ([`cachalot_trace::ops::timing`]), so that one
//! command on one machine can put cachalot beside `torch_alloc_bench.py`, and one GPU beside
//! another.
//!
//! Each file gets a fresh allocator; the device is synchronized after every replay, untimed,
//! as the harness's `cudaDeviceSynchronize` (wgpu: the queue is waited on).

use std::sync::Arc;

use cachalot_core::AllocatorConfig;
use cachalot_trace::ops::OpFile;
use cachalot_trace::ops::timing::{self, ReplayTiming, WARMUP_REPLAYS};
use cachalot_wgpu::WgpuContext;

use crate::device::BackendKind;
use crate::device::wgpu::WgpuDevice;
use crate::error::RuntimeError;
use crate::select::{DeviceOptions, Selection, choose, describe_wgpu};

/// The simulator's capacity when none is given: an H200's, the largest GPU of the traces.
pub const SIM_CAPACITY: u64 = 150_109_880_320;

/// A device opened for timing op files.
pub enum BenchTarget {
    /// CUDA device `ordinal`.
    Cuda {
        /// The device's ordinal.
        ordinal: usize,
    },
    /// A wgpu adapter.
    Wgpu {
        /// Its device and queue.
        context: Arc<WgpuContext>,
    },
    /// The simulator: the policy's own cost, with no device calls.
    Sim {
        /// Its capacity in bytes.
        capacity: u64,
    },
}

impl BenchTarget {
    /// Opens the backend `options` ask for (`auto`: CUDA, then wgpu, then the simulator), and
    /// says what was taken and why the ones before it were not. Needs no kernels.
    pub fn open(options: &DeviceOptions) -> Result<(Self, Selection), RuntimeError> {
        choose(
            options.backend,
            || {
                let ordinal = options.device.unwrap_or(0);
                let description = cachalot_cuda::probe(ordinal).map_err(|e| e.to_string())?;
                Ok((BenchTarget::Cuda { ordinal }, description))
            },
            || {
                let capacity = options.capacity.unwrap_or(cachalot_wgpu::DEFAULT_CAPACITY);
                let context = WgpuDevice::request(options.device, capacity).map_err(|e| e.to_string())?;
                let description = describe_wgpu(&context, capacity);
                Ok((BenchTarget::Wgpu { context }, description))
            },
            || {
                let capacity = options.capacity.unwrap_or(SIM_CAPACITY);
                let description = format!(
                    "simulator, capacity {} bytes (the policy's cost alone)",
                    cachalot_core::error::group_digits(capacity)
                );
                Ok((BenchTarget::Sim { capacity }, description))
            },
        )
    }

    /// The backend's kind.
    pub fn kind(&self) -> BackendKind {
        match self {
            BenchTarget::Cuda { .. } => BackendKind::Cuda,
            BenchTarget::Wgpu { .. } => BackendKind::Wgpu,
            BenchTarget::Sim { .. } => BackendKind::Sim,
        }
    }

    /// The allocator's name in the harness's output: `cachalot-cuda`, `cachalot-wgpu`,
    /// `cachalot-sim`.
    pub fn allocator_name(&self) -> String {
        format!("cachalot-{}", self.kind().name())
    }

    /// Times `ops` on a fresh allocator with `config`: one warm-up replay, then `timed` ones.
    pub fn time(&self, ops: &OpFile, config: &AllocatorConfig, timed: usize) -> Result<ReplayTiming, RuntimeError> {
        Ok(match self {
            BenchTarget::Cuda { ordinal } => {
                let mut allocator = cachalot_cuda::caching_allocator(*ordinal, config.clone())?;
                let device = Arc::clone(allocator.backend().cuda());
                let timing = timing::time_replays(&mut allocator, ops, WARMUP_REPLAYS, timed, |_| {
                    device.synchronize().map_err(RuntimeError::from)
                })?;
                allocator.empty_cache()?;
                timing
            }
            BenchTarget::Wgpu { context } => {
                let mut allocator = cachalot_wgpu::caching_allocator(context, config.clone())?;
                let timing = timing::time_replays(&mut allocator, ops, WARMUP_REPLAYS, timed, |_| {
                    context.wait_idle().map_err(RuntimeError::from)
                })?;
                allocator.empty_cache()?;
                timing
            }
            BenchTarget::Sim { capacity } => timing::time_on_sim(ops, *capacity, config.clone(), timed)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BackendRequest;

    #[test]
    fn sim_target_times_an_op_file() {
        let options = DeviceOptions { backend: BackendRequest::Sim, capacity: Some(1 << 30), ..Default::default() };
        let (target, selection) = BenchTarget::open(&options).unwrap();
        assert_eq!(selection.backend, BackendKind::Sim);
        assert_eq!(target.allocator_name(), "cachalot-sim");
        let ops = OpFile::parse("a 0 1048576\na 1 512\nf 0\nf 1\n").unwrap();
        let timing = target.time(&ops, &AllocatorConfig::default(), 3).unwrap();
        assert_eq!(timing.ns_per_op.len(), 3);
    }
}
