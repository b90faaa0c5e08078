//! The CUDA device: `CachingAllocator<CudaBackend>` and `CudaKernels`, everything on the
//! default stream as a PyTorch program runs — so the allocator sees PyTorch's sequence, the
//! cuBLAS and cuBLASLt workspaces of the first products included.

use cachalot_core::{Allocation, AllocatorConfig, StreamId};
use cachalot_cuda::{CudaBackend, CudaKernels, DeviceSpan};
use cachalot_shaders::ops::{
    ActivationBackward, ActivationForward, AdamStep, CrossEntropy, Matmul, Mean, Mse, SgdStep, SumRows,
};

use super::{BackendKind, DeviceAllocator, DeviceInfo, DeviceKernels, HeldAllocator, StreamDiscipline, Workspaces};
use crate::error::RuntimeError;

/// The one stream of the device (PyTorch's current stream).
const STREAM: StreamId = StreamId::DEFAULT;

/// Scratch the two-pass sum needs, in bytes (its first pass writes this many f32 partials).
const SUM_SCRATCH: u64 = cachalot_cuda::SUM_PARTIALS as u64 * 4;

/// A CUDA GPU (see the module docs).
#[derive(Debug)]
pub struct CudaDevice {
    allocator: DeviceAllocator<CudaBackend>,
    kernels: CudaKernels,
    compute_capability: (i32, i32),
}

impl CudaDevice {
    /// Opens CUDA device `ordinal` with the allocator `config`; the workspace sizes follow
    /// PyTorch 2.11's rule for its architecture and `CUBLAS_WORKSPACE_CONFIG` /
    /// `CUBLASLT_WORKSPACE_SIZE`.
    pub fn open(ordinal: usize, config: AllocatorConfig) -> Result<Self, RuntimeError> {
        let allocator = cachalot_cuda::caching_allocator(ordinal, config)?;
        let kernels = CudaKernels::new(allocator.backend().cuda())?;
        let compute_capability = allocator.backend().cuda().compute_capability();
        let allocator = DeviceAllocator::new(allocator, BackendKind::Cuda, StreamDiscipline::DefaultStream);
        Ok(CudaDevice { allocator, kernels, compute_capability })
    }

    /// The kernels (for workspace inspection).
    pub fn kernels(&self) -> &CudaKernels {
        &self.kernels
    }
}

impl DeviceInfo for CudaDevice {
    fn held(&self) -> &dyn HeldAllocator {
        &self.allocator
    }
    fn held_mut(&mut self) -> &mut dyn HeldAllocator {
        &mut self.allocator
    }
    fn workspaces(&self) -> Option<Workspaces> {
        let sizes = self.kernels.workspace_sizes();
        Some(Workspaces { cublas: sizes.cublas, cublaslt: sizes.cublaslt })
    }
    fn run_facts(&self) -> Vec<(String, String)> {
        let (major, minor) = self.compute_capability;
        vec![("compute capability".into(), format!("{major}.{minor}"))]
    }
}

/// `DeviceKernels` methods that hand their op, unchanged, to the `CudaKernels` method of the
/// same name on [`STREAM`]. A macro because the methods differ only in name and op type: six
/// copies of the same three lines would say nothing more (the ops that also take the
/// allocator are written out).
macro_rules! on_stream {
    ($($name:ident($op:ty);)*) => {$(
        fn $name(&mut self, op: $op) -> Result<(), RuntimeError> {
            Ok(self.kernels.$name(STREAM, op)?)
        }
    )*};
}

impl DeviceKernels for CudaDevice {
    fn synchronize(&mut self) -> Result<(), RuntimeError> {
        Ok(self.allocator.backend().cuda().synchronize()?)
    }

    fn upload(&mut self, dst: &Allocation, words: &[u32]) -> Result<(), RuntimeError> {
        Ok(self.kernels.upload(STREAM, dst, words)?)
    }

    fn read(&mut self, src: &Allocation, words: usize) -> Result<Vec<u32>, RuntimeError> {
        Ok(self.kernels.read::<u32>(STREAM, src, words)?)
    }

    fn fill(&mut self, x: &Allocation, n: u64, value: f32) -> Result<(), RuntimeError> {
        Ok(self.kernels.fill(STREAM, x, n, value)?)
    }

    fn fill_u32(&mut self, x: &Allocation, n: u64, value: u32) -> Result<(), RuntimeError> {
        Ok(self.kernels.fill_u32(STREAM, x, n, value)?)
    }

    fn scale(&mut self, x: &Allocation, y: &Allocation, alpha: f32, n: u64) -> Result<(), RuntimeError> {
        Ok(self.kernels.scale(STREAM, x, y, alpha, n)?)
    }

    fn mean(&mut self, op: Mean<&Allocation>) -> Result<(), RuntimeError> {
        op.validate()?;
        // PyTorch's staging block (2,112 bytes) holds the first pass's 512 partials.
        let partials = DeviceSpan::block(op.staging).slice(0, SUM_SCRATCH)?;
        Ok(self.kernels.sum(STREAM, op.x, op.n, partials, op.out, op.scale())?)
    }

    fn matmul(&mut self, op: Matmul<&Allocation>) -> Result<(), RuntimeError> {
        Ok(self.kernels.matmul(&mut self.allocator, STREAM, op)?)
    }

    fn cross_entropy(&mut self, op: CrossEntropy<&Allocation>) -> Result<(), RuntimeError> {
        Ok(self.kernels.cross_entropy(&mut self.allocator, STREAM, op)?)
    }

    on_stream! {
        sum_rows(SumRows<&Allocation>);
        activation(ActivationForward<&Allocation>);
        activation_backward(ActivationBackward<&Allocation>);
        mse(Mse<&Allocation>);
        sgd_step(SgdStep<&Allocation>);
        adam_step(AdamStep<&Allocation>);
    }
}
