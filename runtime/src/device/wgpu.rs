//! The wgpu device: `CachingAllocator<WgpuBackend>` and the WGSL kernels of `cachalot-wgpu`.
//!
//! Every operation is one [`cachalot_wgpu::KernelBatch`], submitted at once. The batch records
//! the operands it binds on the queue stream, so a block freed after it returns to the cache
//! when the submission has completed. To make that point deterministic — and equal to the
//! simulator's `wgpu` profile — the device waits for the queue before every allocator call
//! that completes frees ([`DeviceInfo::malloc`], [`DeviceInfo::empty_cache`]): every event recorded
//! before such a call has then completed, whatever the GPU's speed.

use std::sync::Arc;

use cachalot_core::{Allocation, AllocatorConfig, StreamId};
use cachalot_shaders::Sgd;
use cachalot_shaders::ops::{
    ActivationBackward, ActivationForward, AdamStep, CrossEntropy, Matmul, Mean, Mse, SgdStep, SumRows,
};
#[cfg(not(target_arch = "wasm32"))]
use cachalot_wgpu::WgpuConfig;
use cachalot_wgpu::{KernelBatch, Kernels, WgpuBackend, WgpuContext};

#[cfg(target_arch = "wasm32")]
use super::PendingRead;
use super::{BackendKind, DeviceAllocator, DeviceInfo, DeviceKernels, HeldAllocator, StreamDiscipline};
use crate::error::RuntimeError;

/// Columns of the first pass of [`DeviceKernels::mean`]: partials that fit PyTorch's 2,112-byte
/// reduction staging block.
const MEAN_COLUMNS: u64 = 512;

/// A wgpu adapter's device (see the module docs).
#[derive(Debug)]
pub struct WgpuDevice {
    allocator: DeviceAllocator<WgpuBackend>,
    kernels: Kernels,
    /// Means reduced on the host because the tensor was over the binding limit (reported).
    host_means: u64,
}

impl WgpuDevice {
    /// The device of `context`, with the allocator `config`.
    pub fn new(context: Arc<WgpuContext>, config: AllocatorConfig) -> Result<Self, RuntimeError> {
        let allocator = cachalot_wgpu::caching_allocator(&context, config)?;
        let allocator = DeviceAllocator::new(allocator, BackendKind::Wgpu, StreamDiscipline::QueueStream);
        Ok(WgpuDevice { allocator, kernels: Kernels::new(context), host_means: 0 })
    }

    /// Requests the best adapter (or the `index`-th one wgpu enumerates) with `capacity` bytes.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn request(index: Option<usize>, capacity: u64) -> Result<Arc<WgpuContext>, RuntimeError> {
        let wgpu_config = WgpuConfig { capacity, device_index: index.unwrap_or(0) as u32, ..WgpuConfig::default() };
        match index {
            None => Ok(WgpuContext::request_blocking(wgpu_config)?),
            Some(i) => {
                let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
                    backends: wgpu::Backends::all().with_env(),
                    ..wgpu::InstanceDescriptor::new_without_display_handle()
                });
                let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all().with_env()));
                let count = adapters.len();
                let adapter = adapters.into_iter().nth(i).ok_or_else(|| RuntimeError::Unavailable {
                    backend: "wgpu",
                    reason: format!("no adapter {i} (wgpu enumerates {count})"),
                })?;
                Ok(pollster::block_on(WgpuContext::new(&adapter, wgpu_config))?)
            }
        }
    }

    /// The device of `context` with the allocator `config`, holding at most `capacity` bytes
    /// in segments (the budget a web page sets per run; [`WgpuDevice::new`] takes the
    /// context's configured capacity).
    pub fn with_capacity(
        context: Arc<WgpuContext>,
        config: AllocatorConfig,
        capacity: u64,
    ) -> Result<Self, RuntimeError> {
        let backend = WgpuBackend::with_capacity(Arc::clone(&context), capacity);
        let allocator = cachalot_core::CachingAllocator::new(backend, config)?;
        let allocator = DeviceAllocator::new(allocator, BackendKind::Wgpu, StreamDiscipline::QueueStream);
        Ok(WgpuDevice { allocator, kernels: Kernels::new(context), host_means: 0 })
    }

    /// The shared context.
    pub fn context(&self) -> &Arc<WgpuContext> {
        self.kernels.context()
    }

    /// Waits for everything submitted to the context so far. Not only this device's work:
    /// another allocator on the same context (tests share one) advances the submission
    /// number that this device's frees record, so waiting for its own work would not be
    /// enough. A wait for completed work returns at once.
    fn settle(&mut self) -> Result<(), RuntimeError> {
        Ok(self.kernels.context().wait_idle()?)
    }

    /// Records one operation in a batch and submits it.
    fn submit(
        &mut self,
        record: impl FnOnce(&mut KernelBatch<'_>) -> Result<(), cachalot_wgpu::KernelError>,
    ) -> Result<(), RuntimeError> {
        let mut batch = self.kernels.batch(&mut self.allocator);
        record(&mut batch)?;
        batch.submit()?;
        Ok(())
    }

    fn binding_limit(&self) -> u64 {
        self.kernels.context().limits().max_storage_buffer_binding_size
    }

    /// The mean without reading back (the browser cannot wait for a readback inside an
    /// operation): column sums of `x` as `[n / cols, cols]` into `staging`, their sum into
    /// `out`, then `out / n` through `staging[0]` (the scale needs distinct operands) and back.
    /// All in f32 on the GPU, where the native device adds the last partials in f64 on the
    /// host: the same value up to the last bits. Allocates nothing, as the native path.
    #[cfg(target_arch = "wasm32")]
    fn mean_on_gpu(
        &mut self,
        x: &Allocation,
        staging: &Allocation,
        out: &Allocation,
        n: u64,
        cols: u64,
    ) -> Result<(), RuntimeError> {
        // Over the binding limit, the column sums run in chunks (`KernelBatch::sum_rows`).
        if n / cols > u32::MAX as u64 {
            return Err(RuntimeError::Parameters(format!("mean of {n} elements: too many rows for the WGSL kernels")));
        }
        let columns = SumRows { x, out: staging, rows: (n / cols) as u32, cols: cols as u32, accumulate: false };
        let total = SumRows { x: staging, out, rows: cols as u32, cols: 1, accumulate: false };
        let scale = SgdStep {
            param: staging,
            grad: out,
            momentum: None,
            n: 1,
            sgd: Sgd::new(-(1.0 / n as f64) as f32),
            first_step: true,
        };
        self.submit(|b| {
            b.sum_rows(columns)?;
            b.sum_rows(total)?;
            b.fill(staging, 1, 0.0)?;
            b.sgd_step(scale)?;
            b.copy(staging, out, 1)
        })
    }
}

impl DeviceInfo for WgpuDevice {
    fn held(&self) -> &dyn HeldAllocator {
        &self.allocator
    }
    fn held_mut(&mut self) -> &mut dyn HeldAllocator {
        &mut self.allocator
    }
    fn run_facts(&self) -> Vec<(String, String)> {
        let info = self.kernels.context().adapter_info();
        vec![
            ("adapter".into(), format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type)),
            ("software adapter".into(), (info.device_type == wgpu::DeviceType::Cpu).to_string()),
        ]
    }

    fn notes(&self) -> Vec<String> {
        if self.host_means == 0 {
            return Vec::new();
        }
        vec![format!(
            "{} mean(s) were computed on the CPU: their tensors are larger than the most this GPU lets one \
             kernel read at once ({} bytes, wgpu's max_storage_buffer_binding_size), and the mean kernel \
             reads its input whole; the result is the same, only slower",
            self.host_means,
            cachalot_core::error::group_digits(self.binding_limit())
        )]
    }

    fn malloc(&mut self, bytes: u64) -> Result<Allocation, RuntimeError> {
        self.settle()?;
        Ok(self.allocator.malloc(bytes, StreamId::DEFAULT)?)
    }

    fn empty_cache(&mut self) -> Result<(), RuntimeError> {
        self.settle()?;
        Ok(self.allocator.empty_cache()?)
    }
}

impl DeviceKernels for WgpuDevice {
    fn synchronize(&mut self) -> Result<(), RuntimeError> {
        self.settle()
    }

    fn upload(&mut self, dst: &Allocation, words: &[u32]) -> Result<(), RuntimeError> {
        self.submit(|b| b.upload_u32(dst, words))
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn read(&mut self, src: &Allocation, words: usize) -> Result<Vec<u32>, RuntimeError> {
        let mut batch = self.kernels.batch(&mut self.allocator);
        let readback = batch.read_u32(src, words)?;
        batch.submit()?;
        Ok(readback.wait_u32()?)
    }

    /// In the browser a read cannot wait: every read goes through [`DeviceKernels::read_later`].
    #[cfg(target_arch = "wasm32")]
    fn read(&mut self, _src: &Allocation, _words: usize) -> Result<Vec<u32>, RuntimeError> {
        Err(RuntimeError::Parameters(
            "a blocking read on WebGPU: the browser cannot wait for the GPU, so experiments read with \
             Runtime::read_f32 (awaited) there"
                .into(),
        ))
    }

    #[cfg(target_arch = "wasm32")]
    fn read_later(&mut self, src: &Allocation, words: usize) -> Result<PendingRead, RuntimeError> {
        let mut batch = self.kernels.batch(&mut self.allocator);
        let readback = batch.read_u32(src, words)?;
        batch.submit()?;
        Ok(Box::pin(async move { Ok(readback.u32().await?) }))
    }

    fn fill(&mut self, x: &Allocation, n: u64, value: f32) -> Result<(), RuntimeError> {
        self.submit(|b| b.fill(x, n, value))
    }

    fn fill_u32(&mut self, x: &Allocation, n: u64, value: u32) -> Result<(), RuntimeError> {
        // An upload, not the f32 fill kernel, which need not keep every bit pattern (NaNs).
        self.submit(|b| b.upload_u32(x, &vec![value; n as usize]))
    }

    fn scale(&mut self, x: &Allocation, y: &Allocation, alpha: f32, n: u64) -> Result<(), RuntimeError> {
        // No scale kernel in the WGSL set: y = 0, then an SGD step with lr = -alpha gives
        // y = 0 - (-alpha) · x = alpha · x exactly (one rounding, as a product).
        let step = SgdStep { param: y, grad: x, momentum: None, n, sgd: Sgd::new(-alpha), first_step: true };
        self.submit(|b| {
            b.fill(y, n, 0.0)?;
            b.sgd_step(step)
        })
    }

    fn mean(&mut self, op: Mean<&Allocation>) -> Result<(), RuntimeError> {
        op.validate()?;
        let Mean { x, staging, out, n } = op;
        // Column sums of x as [n / cols, cols] into the staging block, then the last sum and
        // the division on the host. A tensor over the binding limit cannot be bound whole
        // (the WGSL set has no chunked reduction): it is read back and summed on the host.
        let cols = (1..=MEAN_COLUMNS.min(n)).rev().find(|c| n.is_multiple_of(*c)).unwrap_or(1);
        #[cfg(target_arch = "wasm32")]
        {
            self.mean_on_gpu(x, staging, out, n, cols)
        }
        #[cfg(not(target_arch = "wasm32"))]
        let sum = if n * 4 <= self.binding_limit() && n / cols <= u32::MAX as u64 {
            let sums = SumRows { x, out: staging, rows: (n / cols) as u32, cols: cols as u32, accumulate: false };
            self.submit(|b| b.sum_rows(sums))?;
            let partials = self.read(staging, cols as usize)?;
            partials.iter().map(|&w| f32::from_bits(w) as f64).sum::<f64>()
        } else {
            self.host_means += 1;
            let values = self.read(x, n as usize)?;
            values.iter().map(|&w| f32::from_bits(w) as f64).sum::<f64>()
        };
        #[cfg(not(target_arch = "wasm32"))]
        {
            let mean = (sum / n as f64) as f32;
            self.upload(out, &[mean.to_bits()])
        }
    }

    fn matmul(&mut self, op: Matmul<&Allocation>) -> Result<(), RuntimeError> {
        self.submit(|b| b.matmul(op))
    }

    fn sum_rows(&mut self, op: SumRows<&Allocation>) -> Result<(), RuntimeError> {
        self.submit(|b| b.sum_rows(op))
    }

    fn activation(&mut self, op: ActivationForward<&Allocation>) -> Result<(), RuntimeError> {
        self.submit(|b| b.activation(op))
    }

    fn activation_backward(&mut self, op: ActivationBackward<&Allocation>) -> Result<(), RuntimeError> {
        self.submit(|b| b.activation_backward(op))
    }

    fn mse(&mut self, op: Mse<&Allocation>) -> Result<(), RuntimeError> {
        self.submit(|b| b.mse(op))
    }

    fn cross_entropy(&mut self, op: CrossEntropy<&Allocation>) -> Result<(), RuntimeError> {
        // The batch allocates its scratch row: wait first, as before any allocator call.
        self.settle()?;
        self.submit(|b| b.cross_entropy(op))
    }

    fn sgd_step(&mut self, op: SgdStep<&Allocation>) -> Result<(), RuntimeError> {
        self.submit(|b| b.sgd_step(op))
    }

    fn adam_step(&mut self, op: AdamStep<&Allocation>) -> Result<(), RuntimeError> {
        self.submit(|b| b.adam_step(op))
    }
}
