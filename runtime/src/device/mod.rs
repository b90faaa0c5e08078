//! The three devices an experiment runs on, behind one pair of traits.
//!
//! A [`Device`] is two traits: [`DeviceInfo`] (its facts and its `CachingAllocator<B>`, seen
//! as a `dyn cachalot_core::Allocator`, so the runtime needs no generic parameter) and
//! [`DeviceKernels`] (one method per op of `cachalot_shaders::ops`, taking the op's argument
//! struct). The three devices:
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
#[cfg(not(target_arch = "wasm32"))]
pub mod cuda;
pub mod sim;
pub mod wgpu;

use std::ops::{Deref, DerefMut};

use cachalot_core::{Allocation, Allocator, Backend, CachingAllocator, StreamId};
pub use cachalot_shaders::ops::Activation;
use cachalot_shaders::ops::{
    ActivationBackward, ActivationForward, AdamStep, CrossEntropy, Matmul, Mean, Mse, SgdStep, SumRows,
};

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
        #[cfg(not(target_arch = "wasm32"))]
        {
            let sizes = cachalot_cuda::WorkspaceSizes::pytorch(major, None, None);
            Workspaces { cublas: sizes.cublas, cublaslt: sizes.cublaslt }
        }
        // The browser build has no CUDA crate (cudarc loads native libraries); these are the
        // defaults of `cachalot_cuda::WorkspaceSizes::pytorch`, which the native test
        // `workspaces_match_the_cuda_crates` holds this copy to.
        #[cfg(target_arch = "wasm32")]
        {
            Self::pytorch_defaults(major)
        }
    }

    /// PyTorch 2.11's default sizes without the CUDA crate (for the browser): 4,096 × 8 KiB
    /// (32 MiB) on compute capability 9, 10 and 12, else 2 × 4 MiB + 8 × 16 KiB (8.125 MiB);
    /// 1 MiB for cuBLASLt.
    pub fn pytorch_defaults(major: i32) -> Self {
        let cublas = if matches!(major, 9 | 10 | 12) { 4096 * 8 * 1024 } else { 4096 * 1024 * 2 + 16 * 1024 * 8 };
        Workspaces { cublas, cublaslt: 1024 * 1024 }
    }
}

/// A device's caching allocator with the two facts every device states about it: its backend
/// family and its stream discipline.
///
/// The one home of what every device answers alike: each device holds one, returns it from
/// [`DeviceInfo::held`], and [`DeviceInfo`]'s `kind`, `discipline`, `allocator` and
/// `allocator_mut` read it. It dereferences to the `CachingAllocator<B>` for the device's own
/// backend-typed calls (`backend()`, the kernels that take the allocator).
#[derive(Debug)]
pub struct DeviceAllocator<B: Backend> {
    allocator: CachingAllocator<B>,
    kind: BackendKind,
    discipline: StreamDiscipline,
}

impl<B: Backend> DeviceAllocator<B> {
    /// `allocator`, on a device of backend family `kind` that follows `discipline`.
    pub fn new(allocator: CachingAllocator<B>, kind: BackendKind, discipline: StreamDiscipline) -> Self {
        DeviceAllocator { allocator, kind, discipline }
    }
}

impl<B: Backend> Deref for DeviceAllocator<B> {
    type Target = CachingAllocator<B>;

    fn deref(&self) -> &CachingAllocator<B> {
        &self.allocator
    }
}

impl<B: Backend> DerefMut for DeviceAllocator<B> {
    fn deref_mut(&mut self) -> &mut CachingAllocator<B> {
        &mut self.allocator
    }
}

/// A [`DeviceAllocator`] of any backend, as [`DeviceInfo`] reads it (object safe, so the
/// trait needs no generic parameter for the backend).
pub trait HeldAllocator {
    /// Which backend family the device is.
    fn kind(&self) -> BackendKind;
    /// When freed blocks may be reused.
    fn discipline(&self) -> StreamDiscipline;
    /// The allocator.
    fn allocator(&self) -> &dyn Allocator;
    /// The allocator, mutably.
    fn allocator_mut(&mut self) -> &mut dyn Allocator;
    /// Attaches an out-of-memory observer to the allocator
    /// ([`cachalot_core::CachingAllocator::attach_dyn_oom_observer`]).
    fn attach_oom_observer(&mut self, observer: cachalot_core::DynOomObserver);
}

impl<B: Backend + 'static> HeldAllocator for DeviceAllocator<B> {
    fn attach_oom_observer(&mut self, observer: cachalot_core::DynOomObserver) {
        self.allocator.attach_dyn_oom_observer(observer);
    }
    fn kind(&self) -> BackendKind {
        self.kind
    }
    fn discipline(&self) -> StreamDiscipline {
        self.discipline
    }
    fn allocator(&self) -> &dyn Allocator {
        &self.allocator
    }
    fn allocator_mut(&mut self) -> &mut dyn Allocator {
        &mut self.allocator
    }
}

/// What the runtime needs to know about a device, and its allocator.
///
/// The facts half of a [`Device`]: which backend it is, when freed blocks may be reused,
/// whether kernels compute, the workspaces its products allocate, facts and notes for reports,
/// and the caching allocator — seen as a [`cachalot_core::Allocator`] object, so the runtime
/// needs no generic parameter for the backend.
pub trait DeviceInfo {
    /// The device's allocator with its kind and discipline (see [`DeviceAllocator`]).
    fn held(&self) -> &dyn HeldAllocator;
    /// The same, mutably.
    fn held_mut(&mut self) -> &mut dyn HeldAllocator;

    /// Which backend family this is.
    fn kind(&self) -> BackendKind {
        self.held().kind()
    }
    /// The allocator.
    fn allocator(&self) -> &dyn Allocator {
        self.held().allocator()
    }
    /// The allocator, mutably.
    fn allocator_mut(&mut self) -> &mut dyn Allocator {
        self.held_mut().allocator_mut()
    }
    /// When freed blocks may be reused (see [`StreamDiscipline`]).
    fn discipline(&self) -> StreamDiscipline {
        self.held().discipline()
    }
    /// Whether kernels compute (the simulator can skip them for allocation-only what-ifs).
    fn computes(&self) -> bool {
        true
    }
    /// The workspaces the device's matrix products allocate on first use, if any.
    fn workspaces(&self) -> Option<Workspaces> {
        None
    }
    /// Facts about the run for reports, beyond [`DeviceFacts`](cachalot_core::DeviceFacts)
    /// (profile, adapter type, ...).
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
    /// `empty_cache` (after waiting for submitted work, like [`DeviceInfo::malloc`]).
    fn empty_cache(&mut self) -> Result<(), RuntimeError> {
        Ok(self.allocator_mut().empty_cache()?)
    }
}

/// The kernels of a device: one method per op of `cachalot_shaders::ops`, on allocations of
/// the device's allocator.
///
/// Sizes are element counts (f32, or u32 for class targets); an op is its struct from
/// `cachalot_shaders::ops` with `&Allocation` operands, whose `validate` every implementation
/// calls. Kernel calls do no `record_stream` bookkeeping: the runtime does it
/// according to [`DeviceInfo::discipline`]. Calls are stream ordered; only
/// [`DeviceKernels::read`] and [`DeviceKernels::synchronize`] wait for the device.
pub trait DeviceKernels {
    /// Waits for all submitted work.
    fn synchronize(&mut self) -> Result<(), RuntimeError>;
    /// Writes `words` (f32 bits or u32) to the start of `dst`.
    fn upload(&mut self, dst: &Allocation, words: &[u32]) -> Result<(), RuntimeError>;
    /// Reads `words` 32-bit words from the start of `src`, after the work queued before.
    fn read(&mut self, src: &Allocation, words: usize) -> Result<Vec<u32>, RuntimeError>;
    /// [`DeviceKernels::read`] without waiting: the copy is queued now, the words arrive with
    /// the future. The browser's WebGPU device cannot block, so it reads only this way; the
    /// default reads at once and returns a ready future.
    fn read_later(&mut self, src: &Allocation, words: usize) -> Result<PendingRead, RuntimeError> {
        let words = self.read(src, words);
        Ok(Box::pin(std::future::ready(words)))
    }
    /// `x[i] = value` for `n` f32.
    fn fill(&mut self, x: &Allocation, n: u64, value: f32) -> Result<(), RuntimeError>;
    /// `x[i] = value` for `n` u32.
    fn fill_u32(&mut self, x: &Allocation, n: u64, value: u32) -> Result<(), RuntimeError>;
    /// `y = alpha · x` for `n` elements (`x` and `y` distinct).
    fn scale(&mut self, x: &Allocation, y: &Allocation, alpha: f32, n: u64) -> Result<(), RuntimeError>;
    /// `out[0] = mean(x)` ([`Mean`]; its `staging` is PyTorch's reduction scratch, 2,112 bytes).
    fn mean(&mut self, op: Mean<&Allocation>) -> Result<(), RuntimeError>;
    /// `C = op(A) · op(B) (+ beta C) (+ bias)` ([`Matmul`]). May allocate the device's workspaces.
    fn matmul(&mut self, op: Matmul<&Allocation>) -> Result<(), RuntimeError>;
    /// Column sums `out[c] (+)= Σ_r x[r, c]` ([`SumRows`]).
    fn sum_rows(&mut self, op: SumRows<&Allocation>) -> Result<(), RuntimeError>;
    /// `y = act(x)` ([`ActivationForward`]).
    fn activation(&mut self, op: ActivationForward<&Allocation>) -> Result<(), RuntimeError>;
    /// `dx = act'(x) · dy` ([`ActivationBackward`]).
    fn activation_backward(&mut self, op: ActivationBackward<&Allocation>) -> Result<(), RuntimeError>;
    /// Mean squared error and, when `grad` is given, its gradient ([`Mse`]).
    fn mse(&mut self, op: Mse<&Allocation>) -> Result<(), RuntimeError>;
    /// Softmax cross-entropy (mean over rows) and its gradient ([`CrossEntropy`]). Takes a
    /// scratch row from the allocator, as the CUDA and wgpu kernels do.
    fn cross_entropy(&mut self, op: CrossEntropy<&Allocation>) -> Result<(), RuntimeError>;
    /// One SGD step ([`SgdStep`]).
    fn sgd_step(&mut self, op: SgdStep<&Allocation>) -> Result<(), RuntimeError>;
    /// One Adam step ([`AdamStep`]).
    fn adam_step(&mut self, op: AdamStep<&Allocation>) -> Result<(), RuntimeError>;
}

/// Words on their way back from a device ([`DeviceKernels::read_later`]).
pub type PendingRead = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u32>, RuntimeError>>>>;

/// A device the runtime runs on: its facts and allocator ([`DeviceInfo`]) and its kernels
/// ([`DeviceKernels`]). Implemented for every type that has both.
pub trait Device: DeviceInfo + DeviceKernels {}

impl<T: DeviceInfo + DeviceKernels + ?Sized> Device for T {}

#[cfg(test)]
mod tests {
    use super::Workspaces;

    #[test]
    fn workspaces_match_the_cuda_crates() {
        for major in [7, 8, 9, 10, 12] {
            assert_eq!(Workspaces::pytorch_defaults(major), Workspaces::pytorch(major), "sm{major}");
        }
    }
}
