//! The CUDA device: `CachingAllocator<CudaBackend>` and `CudaKernels`, everything on the
//! default stream as a PyTorch program runs — so the allocator sees PyTorch's sequence, the
//! cuBLAS and cuBLASLt workspaces of the first products included.

use cachalot_core::{Allocation, Allocator, AllocatorConfig, CachingAllocator, StreamId};
use cachalot_cuda::{CudaBackend, CudaKernels, DeviceSpan, MatmulOptions};
use cachalot_shaders::MatmulShape;
use cachalot_shaders::ops::{AdamStep, CrossEntropy, Mean, Mse, SgdStep, SumRows};

use super::{Activation, BackendKind, DeviceInfo, DeviceKernels, StreamDiscipline, Workspaces};
use crate::error::RuntimeError;

/// The one stream of the device (PyTorch's current stream).
const STREAM: StreamId = StreamId::DEFAULT;

/// Scratch the two-pass sum needs, in bytes (its first pass writes this many f32 partials).
const SUM_SCRATCH: u64 = cachalot_cuda::SUM_PARTIALS as u64 * 4;

/// A CUDA GPU (see the module docs).
#[derive(Debug)]
pub struct CudaDevice {
    allocator: CachingAllocator<CudaBackend>,
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
        Ok(CudaDevice { allocator, kernels, compute_capability })
    }

    /// The kernels (for workspace inspection).
    pub fn kernels(&self) -> &CudaKernels {
        &self.kernels
    }
}

impl DeviceInfo for CudaDevice {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn allocator(&self) -> &dyn Allocator {
        &self.allocator
    }
    fn allocator_mut(&mut self) -> &mut dyn Allocator {
        &mut self.allocator
    }
    fn discipline(&self) -> StreamDiscipline {
        StreamDiscipline::DefaultStream
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

    fn mean(&mut self, x: &Allocation, staging: &Allocation, out: &Allocation, args: Mean) -> Result<(), RuntimeError> {
        args.validate()?;
        // PyTorch's staging block (2,112 bytes) holds the first pass's 512 partials.
        let partials = DeviceSpan::block(staging).slice(0, SUM_SCRATCH)?;
        Ok(self.kernels.sum(STREAM, x, args.n, partials, out, args.scale())?)
    }

    fn matmul(
        &mut self,
        a: &Allocation,
        b: &Allocation,
        c: &Allocation,
        shape: MatmulShape,
        beta: f32,
        bias: Option<&Allocation>,
    ) -> Result<(), RuntimeError> {
        let options = MatmulOptions { beta, bias: bias.map(DeviceSpan::from) };
        Ok(self.kernels.matmul(&mut self.allocator, STREAM, a, b, c, shape, options)?)
    }

    fn sum_rows(&mut self, x: &Allocation, out: &Allocation, args: SumRows) -> Result<(), RuntimeError> {
        Ok(self.kernels.sum_rows(STREAM, x, out, args)?)
    }

    fn activation(&mut self, act: Activation, x: &Allocation, y: &Allocation, n: u64) -> Result<(), RuntimeError> {
        Ok(self.kernels.activation(STREAM, act, x, y, n)?)
    }

    fn activation_backward(
        &mut self,
        act: Activation,
        x: &Allocation,
        dy: &Allocation,
        dx: &Allocation,
        n: u64,
    ) -> Result<(), RuntimeError> {
        Ok(self.kernels.activation_backward(STREAM, act, x, dy, dx, n)?)
    }

    fn mse(
        &mut self,
        pred: &Allocation,
        target: &Allocation,
        loss: &Allocation,
        grad: &Allocation,
        args: Mse,
    ) -> Result<(), RuntimeError> {
        Ok(self.kernels.mse(STREAM, pred, target, loss, Some(DeviceSpan::from(grad)), args)?)
    }

    fn cross_entropy(
        &mut self,
        logits: &Allocation,
        targets: &Allocation,
        loss: &Allocation,
        grad: &Allocation,
        args: CrossEntropy,
    ) -> Result<(), RuntimeError> {
        Ok(self.kernels.cross_entropy(&mut self.allocator, STREAM, logits, targets, loss, grad, args)?)
    }

    fn sgd_step(
        &mut self,
        param: &Allocation,
        grad: &Allocation,
        momentum: Option<&Allocation>,
        args: SgdStep,
    ) -> Result<(), RuntimeError> {
        Ok(self.kernels.sgd_step(STREAM, param, grad, momentum.map(DeviceSpan::from), args)?)
    }

    fn adam_step(
        &mut self,
        param: &Allocation,
        grad: &Allocation,
        exp_avg: &Allocation,
        exp_avg_sq: &Allocation,
        args: AdamStep,
    ) -> Result<(), RuntimeError> {
        Ok(self.kernels.adam_step(STREAM, param, grad, exp_avg, exp_avg_sq, args)?)
    }
}
