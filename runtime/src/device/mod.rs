//! The three devices an experiment runs on, behind one trait.
//!
//! A [`Device`] owns a `CachingAllocator<B>` (seen through [`AllocatorOps`], so the runtime
//! needs no generic parameter) and runs the kernels of the experiments on its allocations:
//!
//! - [`cuda::CudaDevice`]: `CachingAllocator<CudaBackend>` + `CudaKernels` (cuBLAS, cuBLASLt,
//!   NVRTC). Everything runs on the default stream, as a PyTorch program does, so a freed
//!   block returns to the cache at once and the first product allocates PyTorch's workspaces.
//! - [`wgpu::WgpuDevice`]: `CachingAllocator<WgpuBackend>` + WGSL kernels, one submission per
//!   operation. Kernel operands are recorded on the queue stream, so a freed block returns to
//!   the cache at the next allocator call after its submission completed; the device waits
//!   for the queue before every allocator call, which makes that point deterministic.
//! - [`sim::SimDevice`]: `CachingAllocator<HostSim>` (the simulator's addresses plus host
//!   memory) + the CPU reference kernels of `cachalot-shaders`. A [`sim::SimProfile`] makes it
//!   follow either discipline: `cuda-sm90` reproduces the CUDA device's allocator events
//!   (workspaces included), `wgpu` the wgpu device's.
//!
//! Which discipline a device follows is [`StreamDiscipline`]; the runtime applies it (the
//! `record_stream` calls) in one place, so the sim and wgpu devices record exactly the same uses.

pub mod cpu;
pub mod cuda;
pub mod sim;
pub mod wgpu;

use cachalot_core::{
    Allocation, AllocatorError, Backend, CachingAllocator, ContextId, DeviceFacts, Frame, Mark, MemoryStats, StreamId,
    TraceEntry,
};
use cachalot_shaders::{Adam, MatmulShape, Sgd};
use cachalot_trace::Snapshot;

use crate::error::RuntimeError;

/// The stream kernels are recorded on by queue-ordered devices (wgpu's one queue; the
/// simulator's `wgpu` profile uses the same number).
pub const QUEUE_STREAM: StreamId = cachalot_wgpu::QUEUE_STREAM;

/// Which backend family a device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// NVIDIA GPU through the CUDA driver.
    Cuda,
    /// Any GPU through wgpu (Vulkan, Metal, DX12), software adapters included.
    Wgpu,
    /// The simulator, with CPU reference kernels.
    Sim,
}

impl BackendKind {
    /// `cuda`, `wgpu` or `sim`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Sim => "sim",
        }
    }
}

/// When a freed block may be handed out again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StreamDiscipline {
    /// Everything runs on the default stream (a PyTorch program on CUDA): a block is reusable
    /// as soon as it is freed, because later work on the stream runs after earlier work.
    DefaultStream,
    /// Kernels run on a queue the allocator does not order against (wgpu): every operand of
    /// every operation is recorded on [`QUEUE_STREAM`] (`record_stream`), so a freed block
    /// returns to the cache (`free_completed`) only when the submission that used it is done,
    /// at the next allocator call.
    QueueStream,
}

impl StreamDiscipline {
    /// A short description for reports.
    pub fn describe(self) -> &'static str {
        match self {
            StreamDiscipline::DefaultStream => "default stream (frees complete at once, as in PyTorch)",
            StreamDiscipline::QueueStream => {
                "queue stream (operands record_stream'ed on stream 0x1; frees complete at the next allocator call)"
            }
        }
    }
}

/// An element-wise activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// Exact GELU, `x · Φ(x)`.
    Gelu,
}

/// Sizes of PyTorch's persistent cuBLAS / cuBLASLt workspaces, where a device has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Workspaces {
    /// The cuBLAS workspace, allocated by the first product on a stream.
    pub cublas: u64,
    /// The cuBLASLt workspace, allocated after it by the first product with a bias.
    pub cublaslt: u64,
}

impl Workspaces {
    /// PyTorch 2.11's sizes for compute capability `major` (32 MiB on 9, 10 and 12, else
    /// 8.125 MiB; 1 MiB for cuBLASLt), without environment overrides.
    pub fn pytorch(major: i32) -> Self {
        let sizes = cachalot_cuda::WorkspaceSizes::pytorch(major, None, None);
        Workspaces { cublas: sizes.cublas, cublaslt: sizes.cublaslt }
    }
}

/// The caching allocator as the runtime uses it: the calls of `CachingAllocator<B>` it needs,
/// object safe, implemented for every backend.
pub trait AllocatorOps {
    /// `malloc` on `stream`.
    fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Allocation, AllocatorError>;
    /// `free`.
    fn free(&mut self, allocation: Allocation) -> Result<(), AllocatorError>;
    /// `record_stream`.
    fn record_stream(&mut self, allocation: &Allocation, stream: StreamId) -> Result<(), AllocatorError>;
    /// `empty_cache`.
    fn empty_cache(&mut self) -> Result<(), AllocatorError>;
    /// Completes the frees whose events have completed.
    fn process_events(&mut self) -> Result<(), AllocatorError>;
    /// `memory_allocated()`.
    fn memory_allocated(&self) -> u64;
    /// `memory_reserved()`.
    fn memory_reserved(&self) -> u64;
    /// `memory_stats()`.
    fn stats(&self) -> &MemoryStats;
    /// `memory_summary()`.
    fn memory_summary(&self, abbreviated: bool) -> String;
    /// Records a labelled mark.
    fn mark(&mut self, label: String);
    /// The marks so far.
    fn marks(&self) -> &[Mark];
    /// The trace so far.
    fn trace(&self) -> Vec<TraceEntry>;
    /// A snapshot of everything (state, trace, stats, marks).
    fn capture(&self, source: &str) -> Snapshot;
    /// Interns a stack.
    fn intern_context(&mut self, frames: &[Frame]) -> ContextId;
    /// The stack following calls are made from.
    fn set_context(&mut self, context: Option<ContextId>);
    /// Facts about the device.
    fn device(&self) -> &DeviceFacts;
    /// Turns history recording on, keeping at most `max_entries`.
    fn record_history(&mut self, max_entries: usize);
    /// The allocator's invariant check.
    fn check_consistency(&self) -> Result<(), String>;
}

impl<B: Backend> AllocatorOps for CachingAllocator<B> {
    fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Allocation, AllocatorError> {
        CachingAllocator::malloc(self, size, stream)
    }
    fn free(&mut self, allocation: Allocation) -> Result<(), AllocatorError> {
        CachingAllocator::free(self, allocation)
    }
    fn record_stream(&mut self, allocation: &Allocation, stream: StreamId) -> Result<(), AllocatorError> {
        CachingAllocator::record_stream(self, allocation, stream)
    }
    fn empty_cache(&mut self) -> Result<(), AllocatorError> {
        CachingAllocator::empty_cache(self)
    }
    fn process_events(&mut self) -> Result<(), AllocatorError> {
        CachingAllocator::process_events(self)
    }
    fn memory_allocated(&self) -> u64 {
        CachingAllocator::memory_allocated(self)
    }
    fn memory_reserved(&self) -> u64 {
        CachingAllocator::memory_reserved(self)
    }
    fn stats(&self) -> &MemoryStats {
        CachingAllocator::stats(self)
    }
    fn memory_summary(&self, abbreviated: bool) -> String {
        CachingAllocator::memory_summary(self, abbreviated)
    }
    fn mark(&mut self, label: String) {
        CachingAllocator::mark(self, label)
    }
    fn marks(&self) -> &[Mark] {
        CachingAllocator::marks(self)
    }
    fn trace(&self) -> Vec<TraceEntry> {
        CachingAllocator::trace(self)
    }
    fn capture(&self, source: &str) -> Snapshot {
        Snapshot::capture(self, source)
    }
    fn intern_context(&mut self, frames: &[Frame]) -> ContextId {
        CachingAllocator::intern_context(self, frames)
    }
    fn set_context(&mut self, context: Option<ContextId>) {
        CachingAllocator::set_context(self, context)
    }
    fn device(&self) -> &DeviceFacts {
        CachingAllocator::device(self)
    }
    fn record_history(&mut self, max_entries: usize) {
        CachingAllocator::record_history(self, true, max_entries, &[], true)
    }
    fn check_consistency(&self) -> Result<(), String> {
        CachingAllocator::check_consistency(self)
    }
}

/// A device the runtime runs on: its caching allocator and its kernels.
///
/// Operands are allocations of this device's allocator; sizes are element counts (f32, or u32
/// for class targets). Kernel calls do no `record_stream` bookkeeping: the runtime does it
/// according to [`Device::discipline`]. Calls are stream ordered; only [`Device::read`] and
/// [`Device::synchronize`] wait for the device.
pub trait Device {
    /// Which backend family this is.
    fn kind(&self) -> BackendKind;
    /// The allocator.
    fn allocator(&self) -> &dyn AllocatorOps;
    /// The allocator, mutably.
    fn allocator_mut(&mut self) -> &mut dyn AllocatorOps;
    /// When freed blocks may be reused (see [`StreamDiscipline`]).
    fn discipline(&self) -> StreamDiscipline;
    /// Whether kernels compute (the simulator can skip them for allocation-only what-ifs).
    fn computes(&self) -> bool {
        true
    }
    /// The workspaces the device's matrix products allocate on first use, if any.
    fn workspaces(&self) -> Option<Workspaces> {
        None
    }
    /// Facts about the run for reports, beyond [`DeviceFacts`] (profile, adapter type, ...).
    fn run_facts(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Notes on how the device ran operations (a limit that made it take another path, ...).
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// Allocates `bytes` on the default stream. Queue-ordered devices first wait for their
    /// submitted work, so that the frees this call completes do not depend on timing.
    fn malloc(&mut self, bytes: u64) -> Result<Allocation, RuntimeError> {
        Ok(self.allocator_mut().malloc(bytes, StreamId::DEFAULT)?)
    }
    /// Frees an allocation.
    fn free(&mut self, allocation: Allocation) -> Result<(), RuntimeError> {
        Ok(self.allocator_mut().free(allocation)?)
    }
    /// `empty_cache` (after waiting for submitted work, like [`Device::malloc`]).
    fn empty_cache(&mut self) -> Result<(), RuntimeError> {
        Ok(self.allocator_mut().empty_cache()?)
    }
    /// Waits for all submitted work.
    fn synchronize(&mut self) -> Result<(), RuntimeError>;

    /// Writes `words` (f32 bits or u32) to the start of `dst`.
    fn upload(&mut self, dst: &Allocation, words: &[u32]) -> Result<(), RuntimeError>;
    /// Reads `words` 32-bit words from the start of `src`, after the work queued before.
    fn read(&mut self, src: &Allocation, words: usize) -> Result<Vec<u32>, RuntimeError>;
    /// `x[i] = value` for `n` f32.
    fn fill(&mut self, x: &Allocation, n: u64, value: f32) -> Result<(), RuntimeError>;
    /// `x[i] = value` for `n` u32.
    fn fill_u32(&mut self, x: &Allocation, n: u64, value: u32) -> Result<(), RuntimeError>;
    /// `y = alpha · x` for `n` elements (`x` and `y` distinct).
    fn scale(&mut self, x: &Allocation, y: &Allocation, alpha: f32, n: u64) -> Result<(), RuntimeError>;
    /// `out[0] = mean(x[0..n])`; `staging` is PyTorch's reduction scratch (2,112 bytes).
    fn mean(&mut self, x: &Allocation, n: u64, staging: &Allocation, out: &Allocation) -> Result<(), RuntimeError>;
    /// `C = op(A) · op(B) (+ beta C) (+ bias)`. May allocate the device's workspaces.
    fn matmul(
        &mut self,
        a: &Allocation,
        b: &Allocation,
        c: &Allocation,
        shape: MatmulShape,
        beta: f32,
        bias: Option<&Allocation>,
    ) -> Result<(), RuntimeError>;
    /// Column sums `out[c] (+)= Σ_r x[r, c]`.
    fn sum_rows(
        &mut self,
        x: &Allocation,
        out: &Allocation,
        rows: u32,
        cols: u32,
        accumulate: bool,
    ) -> Result<(), RuntimeError>;
    /// `y = act(x)`.
    fn activation(&mut self, act: Activation, x: &Allocation, y: &Allocation, n: u64) -> Result<(), RuntimeError>;
    /// `dx = act'(x) · dy`.
    fn activation_backward(
        &mut self,
        act: Activation,
        x: &Allocation,
        dy: &Allocation,
        dx: &Allocation,
        n: u64,
    ) -> Result<(), RuntimeError>;
    /// Mean squared error and its gradient `2 (pred - target) / n`.
    fn mse(
        &mut self,
        pred: &Allocation,
        target: &Allocation,
        loss: &Allocation,
        grad: &Allocation,
        n: u64,
    ) -> Result<(), RuntimeError>;
    /// Softmax cross-entropy (mean over rows) and its gradient. Takes a scratch row from the
    /// allocator, as the CUDA and wgpu kernels do.
    #[allow(clippy::too_many_arguments)] // the loss's operands and its two sizes
    fn cross_entropy(
        &mut self,
        logits: &Allocation,
        targets: &Allocation,
        loss: &Allocation,
        grad: &Allocation,
        rows: u32,
        cols: u32,
    ) -> Result<(), RuntimeError>;
    /// One SGD step.
    #[allow(clippy::too_many_arguments)] // the optimiser's state tensors and settings
    fn sgd_step(
        &mut self,
        param: &Allocation,
        grad: &Allocation,
        momentum: Option<&Allocation>,
        n: u64,
        sgd: Sgd,
        first_step: bool,
    ) -> Result<(), RuntimeError>;
    /// One Adam step (`step` from 1).
    #[allow(clippy::too_many_arguments)] // the optimiser's state tensors and settings
    fn adam_step(
        &mut self,
        param: &Allocation,
        grad: &Allocation,
        exp_avg: &Allocation,
        exp_avg_sq: &Allocation,
        n: u64,
        adam: Adam,
        step: u32,
    ) -> Result<(), RuntimeError>;
}
