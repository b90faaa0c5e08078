//! `CudaKernels`: the kernels of the experiments on allocator memory, on any stream.
//!
//! Element-wise, loss and optimiser kernels are the CUDA C of `cachalot-shaders`
//! (`shaders/cuda/kernels.cu`) plus this crate's `cuda/backend_kernels.cu` (scale, sum, pattern
//! fill/check), compiled once per process and architecture by NVRTC. Matrix products go to
//! cuBLAS (`cublasSgemm`) and, for products with a bias, to cuBLASLt with the bias epilogue,
//! with PyTorch 2.11's workspaces taken from the caching allocator.
//!
//! An op is its struct from `cachalot_shaders::ops` (`Matmul`, `SumRows`, `Mse`,
//! `CrossEntropy`, `SgdStep`, `AdamStep`, `ActivationForward`, `ActivationBackward`), with
//! operands of any type that converts into a [`DeviceSpan`]; its `validate` is the one check
//! of its arguments on every backend, and this module checks the operands (each
//! [`DeviceSpan`] holds what the kernel touches).
//!
//! Everything is stream-ordered and asynchronous except [`CudaKernels::read`] (which waits for
//! its stream). Kernels do no cross-stream bookkeeping: like a PyTorch program, a caller that
//! uses a block on another stream than its own calls
//! [`CachingAllocator::record_stream`](cachalot_core::CachingAllocator::record_stream) (or
//! orders the streams with [`CudaDevice::wait_stream`]).

mod blas;
mod compile;
mod span;
mod workspace;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cachalot_core::{Allocation, CachingAllocator, StreamId};
use cachalot_shaders::MatmulShape;
use cachalot_shaders::ops::{
    Activation, ActivationBackward, ActivationForward, AdamStep, CrossEntropy, Matmul, Mse, SgdStep, SumRows,
};
use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg};

use crate::backend::CudaBackend;
use crate::device::{CudaDevice, cublas_libraries_present, nvrtc_library_present};
use crate::error::CudaError;
use blas::{Operands, StreamBlas};
pub use span::DeviceSpan;
use span::Region;
pub use workspace::{
    CUBLAS_WORKSPACE_DEFAULT, CUBLAS_WORKSPACE_LARGE, CUBLASLT_WORKSPACE_DEFAULT, WorkspaceSizes,
    parse_cublas_workspace_config,
};

/// This crate's CUDA C source (scale, two-pass sum, pattern kernels).
pub const BACKEND_KERNELS: &str = include_str!("../../cuda/backend_kernels.cu");

/// Blocks of the first pass of [`CudaKernels::sum`]: its scratch holds this many f32.
pub const SUM_PARTIALS: u32 = 512;

/// Threads per block of every launch.
const BLOCK: u32 = 256;

/// Which persistent workspace an allocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkspaceKind {
    /// The cuBLAS workspace of a stream (first matrix product on it).
    Cublas,
    /// The separate cuBLASLt workspace of a stream (first product with a bias on it).
    CublasLt,
}

/// A persistent workspace allocation, visible in `memory_allocated()` as in PyTorch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workspace {
    /// The stream it belongs to.
    pub stream: StreamId,
    /// cuBLAS or cuBLASLt.
    pub kind: WorkspaceKind,
    /// The block, from the caching allocator.
    pub allocation: Allocation,
}

/// The pattern word `i` of a block filled by [`CudaKernels::fill_pattern`] with `seed` (the
/// kernels compute the same on the device).
pub fn pattern_word(seed: u64, i: u64) -> u32 {
    let mut z = seed.wrapping_add(i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as u32
}

/// The compiled functions.
#[derive(Debug)]
struct Functions {
    fill: CudaFunction,
    add_bias: CudaFunction,
    sum_rows: CudaFunction,
    relu_forward: CudaFunction,
    relu_backward: CudaFunction,
    gelu_forward: CudaFunction,
    gelu_backward: CudaFunction,
    mse_loss: CudaFunction,
    mse_grad: CudaFunction,
    xent_rows: CudaFunction,
    xent_mean: CudaFunction,
    sgd_step: CudaFunction,
    adam_step: CudaFunction,
    scale: CudaFunction,
    fill_u32: CudaFunction,
    fill_pattern: CudaFunction,
    check_pattern: CudaFunction,
    spin_fill_pattern: CudaFunction,
    sum_partial: CudaFunction,
    sum_final: CudaFunction,
}

/// The kernels of the experiments, launched on allocator memory (see the module docs).
///
/// Operands are [`DeviceSpan`]s (`&Allocation` converts), sizes are element counts of f32
/// (u32 for class targets and pattern words). Every method checks that each operand holds
/// what it touches. Methods that may allocate (matrix products: PyTorch's workspaces;
/// cross-entropy: a scratch row) take the caching allocator.
///
/// ```no_run
/// use cachalot_core::{AllocatorConfig, StreamId};
/// use cachalot_cuda::{CudaKernels, caching_allocator};
/// use cachalot_shaders::MatmulShape;
/// use cachalot_shaders::ops::Matmul;
///
/// let mut allocator = caching_allocator(0, AllocatorConfig::default())?;
/// let mut kernels = CudaKernels::new(allocator.backend().cuda())?;
/// let s = StreamId::DEFAULT;
/// let (a, b, c) = (allocator.malloc(64 * 32 * 4, s)?, allocator.malloc(32 * 16 * 4, s)?, allocator.malloc(64 * 16 * 4, s)?);
/// kernels.fill(s, &a, 64 * 32, 1.0)?;
/// kernels.fill(s, &b, 32 * 16, 0.5)?;
/// // The first product on a stream allocates PyTorch's cuBLAS workspace from the allocator.
/// kernels.matmul(&mut allocator, s, Matmul::new(&a, &b, &c, MatmulShape::nn(64, 16, 32)))?;
/// let out: Vec<f32> = kernels.read(s, &c, 64 * 16)?;
/// assert_eq!(out[0], 16.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CudaKernels {
    device: Arc<CudaDevice>,
    functions: Functions,
    grid_limit: u32,
    workspace_sizes: WorkspaceSizes,
    blas: BTreeMap<StreamId, StreamBlas>,
}

impl std::fmt::Debug for CudaKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKernels")
            .field("device", &self.device.ordinal())
            .field("workspace_sizes", &self.workspace_sizes)
            .field("blas_streams", &self.blas.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl CudaKernels {
    /// Compiles (or takes from the process cache) the kernels for `device`. The workspace sizes
    /// follow PyTorch 2.11's rule for the device's architecture and the environment
    /// (`CUBLAS_WORKSPACE_CONFIG`, `CUBLASLT_WORKSPACE_SIZE`).
    ///
    /// Needs `libnvrtc`; cuBLAS is loaded at the first matrix product.
    pub fn new(device: &Arc<CudaDevice>) -> Result<Self, CudaError> {
        if !nvrtc_library_present() {
            return Err(CudaError::LibraryMissing {
                library: "libnvrtc",
                hint: "it comes with the CUDA toolkit or the nvidia-cuda-nvrtc wheel; add its lib directory to \
                       LD_LIBRARY_PATH",
            });
        }
        device.bind()?;
        let (major, _) = device.compute_capability();
        let shaders = compile::load(device, "cachalot-shaders/cuda/kernels.cu", cachalot_shaders::cuda::KERNELS)?;
        let backend = compile::load(device, "cachalot-cuda/cuda/backend_kernels.cu", BACKEND_KERNELS)?;
        let get = |module: &Arc<cudarc::driver::CudaModule>, name: &str| {
            module.load_function(name).map_err(CudaError::driver("cuModuleGetFunction"))
        };
        let functions = Functions {
            fill: get(&shaders, "fill")?,
            add_bias: get(&shaders, "add_bias")?,
            sum_rows: get(&shaders, "sum_rows")?,
            relu_forward: get(&shaders, "relu_forward")?,
            relu_backward: get(&shaders, "relu_backward")?,
            gelu_forward: get(&shaders, "gelu_forward")?,
            gelu_backward: get(&shaders, "gelu_backward")?,
            mse_loss: get(&shaders, "mse_loss")?,
            mse_grad: get(&shaders, "mse_grad")?,
            xent_rows: get(&shaders, "xent_rows")?,
            xent_mean: get(&shaders, "xent_mean")?,
            sgd_step: get(&shaders, "sgd_step")?,
            adam_step: get(&shaders, "adam_step")?,
            scale: get(&backend, "cachalot_scale")?,
            fill_u32: get(&backend, "cachalot_fill_u32")?,
            fill_pattern: get(&backend, "cachalot_fill_pattern")?,
            check_pattern: get(&backend, "cachalot_check_pattern")?,
            spin_fill_pattern: get(&backend, "cachalot_spin_fill_pattern")?,
            sum_partial: get(&backend, "cachalot_sum_partial")?,
            sum_final: get(&backend, "cachalot_sum_final")?,
        };
        Ok(CudaKernels {
            device: Arc::clone(device),
            functions,
            grid_limit: device.multiprocessors().saturating_mul(32),
            workspace_sizes: WorkspaceSizes::from_env(major),
            blas: BTreeMap::new(),
        })
    }

    /// Replaces the workspace sizes (before the first product on a stream; existing workspaces
    /// keep their size).
    pub fn with_workspace_sizes(mut self, sizes: WorkspaceSizes) -> Self {
        self.workspace_sizes = sizes;
        self
    }

    /// The workspace sizes in force.
    pub fn workspace_sizes(&self) -> WorkspaceSizes {
        self.workspace_sizes
    }

    /// The device.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The persistent workspaces allocated so far, by stream (cuBLAS before cuBLASLt).
    pub fn workspaces(&self) -> Vec<Workspace> {
        let mut out = Vec::new();
        for (&stream, state) in &self.blas {
            out.push(Workspace { stream, kind: WorkspaceKind::Cublas, allocation: state.workspace });
            if let Some(lt) = &state.lt {
                out.push(Workspace { stream, kind: WorkspaceKind::CublasLt, allocation: lt.workspace });
            }
        }
        out
    }

    /// Frees every workspace back to the cache (PyTorch's `torch._C._cuda_clearCublasWorkspaces()`:
    /// reserved memory is unchanged) and drops the handles; the next product on a stream
    /// allocates anew.
    pub fn clear_workspaces(&mut self, allocator: &mut CachingAllocator<CudaBackend>) -> Result<(), CudaError> {
        let states = std::mem::take(&mut self.blas);
        let mut first_error = None;
        for (_, state) in states {
            let (workspace, lt) = state.into_workspaces();
            for allocation in std::iter::once(workspace).chain(lt) {
                if let Err(e) = allocator.free(allocation) {
                    first_error.get_or_insert(CudaError::from(e));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    // ---- plumbing ----

    fn stream(&self, id: StreamId) -> Result<Arc<CudaStream>, CudaError> {
        self.device.stream(id)
    }

    /// A grid-stride launch over `n` elements: 256 threads a block, at most 32 blocks per SM.
    fn grid(&self, n: u64) -> LaunchConfig {
        let blocks = n.div_ceil(u64::from(BLOCK)).clamp(1, u64::from(self.grid_limit.max(1)));
        LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
    }

    fn blocks(count: u32) -> LaunchConfig {
        LaunchConfig { grid_dim: (count.max(1), 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
    }

    fn check_allocator(&self, allocator: &CachingAllocator<CudaBackend>) -> Result<(), CudaError> {
        if allocator.backend().cuda().context().cu_ctx() != self.device.context().cu_ctx() {
            return Err(CudaError::InvalidArguments(
                "the allocator belongs to another CUDA context than these kernels".into(),
            ));
        }
        Ok(())
    }

    /// The stream's cuBLAS state, creating its handle and workspace on first use (PyTorch's
    /// `getCurrentCUDABlasHandle` → `setWorkspaceForHandle`).
    fn blas_for(
        &mut self,
        allocator: &mut CachingAllocator<CudaBackend>,
        stream: StreamId,
    ) -> Result<&mut StreamBlas, CudaError> {
        self.check_allocator(allocator)?;
        // cuBLAS and cuBLASLt run in the context current on the calling thread.
        self.device.bind()?;
        if !self.blas.contains_key(&stream) {
            if !cublas_libraries_present() {
                return Err(CudaError::LibraryMissing {
                    library: "libcublas",
                    hint: "it comes with the CUDA toolkit (/usr/local/cuda/lib64) or the nvidia-cublas wheel; add \
                           its lib directory to LD_LIBRARY_PATH",
                });
            }
            let cuda_stream = self.stream(stream)?;
            let state = StreamBlas::new(allocator, stream, cuda_stream, self.workspace_sizes.cublas)?;
            self.blas.insert(stream, state);
        }
        self.blas.get_mut(&stream).ok_or_else(|| CudaError::InvalidArguments("no cuBLAS state".into()))
    }

    // ---- transfers ----

    /// Copies `data` to the start of `dst`, ordered on `stream`. The host slice may be reused
    /// when this returns (pageable copies are staged by the driver).
    pub fn upload<T: DeviceRepr>(
        &self,
        stream: StreamId,
        dst: impl Into<DeviceSpan>,
        data: &[T],
    ) -> Result<(), CudaError> {
        if data.is_empty() {
            return Ok(());
        }
        let bytes = std::mem::size_of_val(data) as u64;
        let address = dst.into().check("dst", bytes)?;
        let s = self.stream(stream)?;
        let mut region = Region::<T>::new(address, data.len(), &s);
        s.memcpy_htod(data, &mut region).map_err(CudaError::driver("cuMemcpyHtoDAsync"))
    }

    /// Reads `len` elements from the start of `src` after the work queued on `stream` (waits
    /// for the stream).
    pub fn read<T: DeviceRepr + Default + Clone>(
        &self,
        stream: StreamId,
        src: impl Into<DeviceSpan>,
        len: usize,
    ) -> Result<Vec<T>, CudaError> {
        let mut out = vec![T::default(); len];
        if len == 0 {
            return Ok(out);
        }
        let bytes = (len * std::mem::size_of::<T>()) as u64;
        let address = src.into().check("src", bytes)?;
        let s = self.stream(stream)?;
        let region = Region::<T>::new(address, len, &s);
        s.memcpy_dtoh(&region, &mut out).map_err(CudaError::driver("cuMemcpyDtoHAsync"))?;
        s.synchronize().map_err(CudaError::driver("cuStreamSynchronize"))?;
        Ok(out)
    }

    /// `dst[i] = src[i]` for `n` f32 elements (`cuMemcpyDtoDAsync`; the ranges must not overlap).
    pub fn copy(
        &self,
        stream: StreamId,
        src: impl Into<DeviceSpan>,
        dst: impl Into<DeviceSpan>,
        n: u64,
    ) -> Result<(), CudaError> {
        self.copy_bytes(stream, src, dst, n * 4)
    }

    /// Copies `bytes` bytes from `src` to `dst` on `stream`.
    pub fn copy_bytes(
        &self,
        stream: StreamId,
        src: impl Into<DeviceSpan>,
        dst: impl Into<DeviceSpan>,
        bytes: u64,
    ) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        let (src, dst) = (src.into().check("src", bytes)?, dst.into().check("dst", bytes)?);
        let s = self.stream(stream)?;
        let from = Region::<u8>::new(src, bytes as usize, &s);
        let mut to = Region::<u8>::new(dst, bytes as usize, &s);
        s.memcpy_dtod(&from, &mut to).map_err(CudaError::driver("cuMemcpyDtoDAsync"))
    }

    // ---- element-wise ----

    /// `x[i] = value` for `n` f32 elements.
    pub fn fill(&self, stream: StreamId, x: impl Into<DeviceSpan>, n: u64, value: f32) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let x = x.into().check("x", n * 4)?;
        let s = self.stream(stream)?;
        // SAFETY: `fill(float*, float, u64)`; x holds n floats (checked).
        unsafe { launch(&s, &self.functions.fill, self.grid(n), &[&x, &value, &n]) }
    }

    /// `x[i] = value` for `n` 32-bit words.
    pub fn fill_u32(&self, stream: StreamId, x: impl Into<DeviceSpan>, n: u64, value: u32) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let x = x.into().check("x", n * 4)?;
        let s = self.stream(stream)?;
        // SAFETY: `cachalot_fill_u32(u32*, u32, u64)`; x holds n words (checked).
        unsafe { launch(&s, &self.functions.fill_u32, self.grid(n), &[&x, &value, &n]) }
    }

    /// `y[i] = alpha · x[i]` for `n` elements (`x` and `y` may be the same).
    pub fn scale(
        &self,
        stream: StreamId,
        x: impl Into<DeviceSpan>,
        y: impl Into<DeviceSpan>,
        alpha: f32,
        n: u64,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let (x, y) = (x.into().check("x", n * 4)?, y.into().check("y", n * 4)?);
        let s = self.stream(stream)?;
        // SAFETY: `cachalot_scale(const float*, float*, float, u64)`; operands checked.
        unsafe { launch(&s, &self.functions.scale, self.grid(n), &[&x, &y, &alpha, &n]) }
    }

    /// `y = act(x)` for `n` elements (ReLU: `max(x, 0)`; exact GELU: `x · Φ(x)`).
    pub fn activation<T: Into<DeviceSpan>>(&self, stream: StreamId, op: ActivationForward<T>) -> Result<(), CudaError> {
        let ActivationForward { act, x, y, n } = op;
        if n == 0 {
            return Ok(());
        }
        let (x, y) = (x.into().check("x", n * 4)?, y.into().check("y", n * 4)?);
        let function = match act {
            Activation::Relu => &self.functions.relu_forward,
            Activation::Gelu => &self.functions.gelu_forward,
        };
        let s = self.stream(stream)?;
        // SAFETY: `(const float* x, float* y, u64 n)`; operands checked.
        unsafe { launch(&s, function, self.grid(n), &[&x, &y, &n]) }
    }

    /// `dx = act'(x) · dy` for `n` elements (ReLU: PyTorch's `threshold_backward`; GELU:
    /// `dy · (Φ(x) + x · φ(x))`).
    pub fn activation_backward<T: Into<DeviceSpan>>(
        &self,
        stream: StreamId,
        op: ActivationBackward<T>,
    ) -> Result<(), CudaError> {
        let ActivationBackward { act, x, dy, dx, n } = op;
        if n == 0 {
            return Ok(());
        }
        let (x, dy, dx) = (x.into().check("x", n * 4)?, dy.into().check("dy", n * 4)?, dx.into().check("dx", n * 4)?);
        let function = match act {
            Activation::Relu => &self.functions.relu_backward,
            Activation::Gelu => &self.functions.gelu_backward,
        };
        let s = self.stream(stream)?;
        // SAFETY: `(const float* input, const float* grad_out, float* grad_in, u64 n)`; checked.
        unsafe { launch(&s, function, self.grid(n), &[&x, &dy, &dx, &n]) }
    }

    /// `x[r, c] += bias[c]` for `x` of `[rows, cols]`.
    pub fn add_bias(
        &self,
        stream: StreamId,
        x: impl Into<DeviceSpan>,
        bias: impl Into<DeviceSpan>,
        rows: u32,
        cols: u32,
    ) -> Result<(), CudaError> {
        let n = u64::from(rows) * u64::from(cols);
        if n == 0 {
            return Ok(());
        }
        let (x, bias) = (x.into().check("x", n * 4)?, bias.into().check("bias", u64::from(cols) * 4)?);
        let s = self.stream(stream)?;
        // SAFETY: `add_bias(float*, const float*, u64, u32)`; operands checked.
        unsafe { launch(&s, &self.functions.add_bias, self.grid(n), &[&x, &bias, &n, &cols]) }
    }

    /// Column sums `out[c] (+)= Σ_r x[r, c]` of `x[rows, cols]` (the bias gradient).
    pub fn sum_rows<T: Into<DeviceSpan>>(&self, stream: StreamId, op: SumRows<T>) -> Result<(), CudaError> {
        let elements = op.elements();
        let SumRows { x, out, rows, cols, accumulate } = op;
        if cols == 0 {
            return Ok(());
        }
        let x = x.into().check("x", elements * 4)?;
        let out = out.into().check("out", u64::from(cols) * 4)?;
        let accumulate = i32::from(accumulate);
        let s = self.stream(stream)?;
        // SAFETY: `sum_rows(const float*, float*, u32, u32, int)`; operands checked.
        unsafe {
            launch(&s, &self.functions.sum_rows, self.grid(u64::from(cols)), &[&x, &out, &rows, &cols, &accumulate])
        }
    }

    /// `out[0] = scale · Σ x[0..n]` in two passes: `partials` is scratch of at least
    /// [`SUM_PARTIALS`] f32 (scale `1/n` gives the mean).
    pub fn sum(
        &self,
        stream: StreamId,
        x: impl Into<DeviceSpan>,
        n: u64,
        partials: impl Into<DeviceSpan>,
        out: impl Into<DeviceSpan>,
        scale: f32,
    ) -> Result<(), CudaError> {
        let x = x.into().check("x", n * 4)?;
        let partials = partials.into().check("partials", u64::from(SUM_PARTIALS) * 4)?;
        let out = out.into().check("out", 4)?;
        let s = self.stream(stream)?;
        // SAFETY: `cachalot_sum_partial(const float*, float*, u64)`, SUM_PARTIALS blocks of 256.
        unsafe { launch(&s, &self.functions.sum_partial, Self::blocks(SUM_PARTIALS), &[&x, &partials, &n]) }?;
        // SAFETY: `cachalot_sum_final(const float*, float*, u32, float)`, one block of 256.
        unsafe { launch(&s, &self.functions.sum_final, Self::blocks(1), &[&partials, &out, &SUM_PARTIALS, &scale]) }
    }

    // ---- losses ----

    /// Mean squared error ([`Mse`]); the gradient only if `grad` is given.
    pub fn mse<T: Into<DeviceSpan>>(&self, stream: StreamId, op: Mse<T>) -> Result<(), CudaError> {
        op.validate()?;
        let (loss_scale, grad_scale) = (op.loss_scale(), op.grad_scale());
        let Mse { pred, target, loss, grad, n } = op;
        let (pred, target) = (pred.into().check("pred", n * 4)?, target.into().check("target", n * 4)?);
        let loss = loss.into().check("loss", 4)?;
        let s = self.stream(stream)?;
        let scale = loss_scale;
        // SAFETY: `mse_loss(const float*, const float*, float*, u64, float)`, one block of 256.
        unsafe { launch(&s, &self.functions.mse_loss, Self::blocks(1), &[&pred, &target, &loss, &n, &scale]) }?;
        if let Some(grad) = grad {
            let grad = grad.into().check("grad", n * 4)?;
            let scale = grad_scale;
            // SAFETY: `mse_grad(const float*, const float*, float*, u64, float)`; checked.
            unsafe { launch(&s, &self.functions.mse_grad, self.grid(n), &[&pred, &target, &grad, &n, &scale]) }?;
        }
        Ok(())
    }

    /// Softmax cross-entropy ([`CrossEntropy`]). Takes a scratch block of `rows` f32 from the
    /// allocator for the per-row losses (freed at once: it is reused only by later work on
    /// the same stream).
    pub fn cross_entropy<T: Into<DeviceSpan>>(
        &self,
        allocator: &mut CachingAllocator<CudaBackend>,
        stream: StreamId,
        op: CrossEntropy<T>,
    ) -> Result<(), CudaError> {
        op.validate()?;
        self.check_allocator(allocator)?;
        let (elements, scale) = (op.elements(), op.scale());
        let CrossEntropy { logits, targets, loss, grad, rows, cols } = op;
        let logits = logits.into().check("logits", elements * 4)?;
        let targets = targets.into().check("targets", u64::from(rows) * 4)?;
        let loss = loss.into().check("loss", 4)?;
        let grad = grad.into().check("grad", elements * 4)?;
        let s = self.stream(stream)?;
        let scratch = allocator.malloc(u64::from(rows) * 4, stream)?;
        let row_loss = scratch.address();
        // SAFETY: `xent_rows(const float*, const u32*, float*, float*, u32, u32, float)`, one
        // block of 256 per row; operands checked, scratch holds `rows` floats.
        let launched = unsafe {
            launch(
                &s,
                &self.functions.xent_rows,
                Self::blocks(rows),
                &[&logits, &targets, &grad, &row_loss, &rows, &cols, &scale],
            )
        };
        let launched = launched.and_then(|()| {
            // SAFETY: `xent_mean(const float*, float*, u32, float)`, one block of 256.
            unsafe { launch(&s, &self.functions.xent_mean, Self::blocks(1), &[&row_loss, &loss, &rows, &scale]) }
        });
        allocator.free(scratch)?;
        launched
    }

    // ---- optimisers ----

    /// One SGD step ([`SgdStep`]); the momentum buffer is needed when `sgd.momentum != 0`.
    pub fn sgd_step<T: Into<DeviceSpan>>(&self, stream: StreamId, op: SgdStep<T>) -> Result<(), CudaError> {
        let checked = op.validate();
        let SgdStep { param, grad, momentum: momentum_buf, n, sgd, first_step } = op;
        if n == 0 {
            return Ok(());
        }
        let (param, grad) = (param.into().check("param", n * 4)?, grad.into().check("grad", n * 4)?);
        checked?;
        // Not read when momentum is 0: a null pointer will do.
        let buf = momentum_buf.map(|buf| buf.into().check("momentum_buf", n * 4)).transpose()?.unwrap_or(0);
        let (nesterov, first) = (i32::from(sgd.nesterov), i32::from(first_step));
        let s = self.stream(stream)?;
        // SAFETY: `sgd_step(float*, const float*, float*, u64, float, float, float, float, int,
        // int)`; operands checked (the buffer is not read when momentum is 0).
        unsafe {
            launch(
                &s,
                &self.functions.sgd_step,
                self.grid(n),
                &[
                    &param,
                    &grad,
                    &buf,
                    &n,
                    &sgd.lr,
                    &sgd.momentum,
                    &sgd.dampening,
                    &sgd.weight_decay,
                    &nesterov,
                    &first,
                ],
            )
        }
    }

    /// One Adam step ([`AdamStep`]).
    pub fn adam_step<T: Into<DeviceSpan>>(&self, stream: StreamId, op: AdamStep<T>) -> Result<(), CudaError> {
        op.validate()?;
        let (step_size, sqrt_bc2) = op.constants();
        let AdamStep { param, grad, exp_avg, exp_avg_sq, n, adam, .. } = op;
        if n == 0 {
            return Ok(());
        }
        let param = param.into().check("param", n * 4)?;
        let grad = grad.into().check("grad", n * 4)?;
        let m = exp_avg.into().check("exp_avg", n * 4)?;
        let v = exp_avg_sq.into().check("exp_avg_sq", n * 4)?;
        let s = self.stream(stream)?;
        // SAFETY: `adam_step(float*, const float*, float*, float*, u64, float x6)`; checked.
        unsafe {
            launch(
                &s,
                &self.functions.adam_step,
                self.grid(n),
                &[
                    &param,
                    &grad,
                    &m,
                    &v,
                    &n,
                    &step_size,
                    &adam.beta1,
                    &adam.beta2,
                    &adam.eps,
                    &adam.weight_decay,
                    &sqrt_bc2,
                ],
            )
        }
    }

    // ---- memory integrity ----

    /// `x[i] = pattern_word(seed, i)` for `words` 32-bit words (see [`pattern_word`]).
    pub fn fill_pattern(
        &self,
        stream: StreamId,
        x: impl Into<DeviceSpan>,
        words: u64,
        seed: u64,
    ) -> Result<(), CudaError> {
        if words == 0 {
            return Ok(());
        }
        let x = x.into().check("x", words * 4)?;
        let s = self.stream(stream)?;
        // SAFETY: `cachalot_fill_pattern(u32*, u64, u64)`; x checked.
        unsafe { launch(&s, &self.functions.fill_pattern, self.grid(words), &[&x, &words, &seed]) }
    }

    /// Adds to the u32 counter `errors[0]` the number of words of `x` that differ from
    /// `pattern_word(seed, i)`, on the device.
    pub fn check_pattern(
        &self,
        stream: StreamId,
        x: impl Into<DeviceSpan>,
        words: u64,
        seed: u64,
        errors: impl Into<DeviceSpan>,
    ) -> Result<(), CudaError> {
        if words == 0 {
            return Ok(());
        }
        let (x, errors) = (x.into().check("x", words * 4)?, errors.into().check("errors", 4)?);
        let s = self.stream(stream)?;
        // SAFETY: `cachalot_check_pattern(const u32*, u64, u64, u32*)`; operands checked.
        unsafe { launch(&s, &self.functions.check_pattern, self.grid(words), &[&x, &words, &seed, &errors]) }
    }

    /// Keeps writing `pattern_word(seed, i)` over `x` for at least `duration` with `blocks`
    /// blocks of 256 threads (few blocks leave the rest of the GPU to other streams), then
    /// writes it once more: a long-running kernel that writes a block.
    pub fn spin_fill_pattern(
        &self,
        stream: StreamId,
        x: impl Into<DeviceSpan>,
        words: u64,
        seed: u64,
        duration: Duration,
        blocks: u32,
    ) -> Result<(), CudaError> {
        let x = x.into().check("x", words * 4)?;
        let nanoseconds = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        let s = self.stream(stream)?;
        // SAFETY: `cachalot_spin_fill_pattern(u32*, u64, u64, u64)`; x checked.
        unsafe {
            launch(&s, &self.functions.spin_fill_pattern, Self::blocks(blocks), &[&x, &words, &seed, &nanoseconds])
        }
    }

    // ---- matrix products and the linear layer ----

    /// `C = op(A) · op(B) (+ beta · C) (+ bias)`; layouts in [`MatmulShape`] (row-major).
    ///
    /// The first product on a stream allocates the stream's cuBLAS workspace
    /// ([`WorkspaceSizes::cublas`]) from `allocator`; the first one with a bias also the
    /// cuBLASLt workspace, after it, and runs through cuBLASLt's bias epilogue (PyTorch's
    /// `addmm` → `gemm_and_bias`). An empty product (`m` or `n` is 0) does nothing.
    pub fn matmul<T: Into<DeviceSpan>>(
        &mut self,
        allocator: &mut CachingAllocator<CudaBackend>,
        stream: StreamId,
        op: Matmul<T>,
    ) -> Result<(), CudaError> {
        let Matmul { a, b, c, shape, beta, bias } = op;
        if shape.is_empty() {
            return Ok(());
        }
        let (ea, eb, ec) = shape.elements();
        let ops = Operands {
            a: a.into().check("a", ea * 4)?,
            b: b.into().check("b", eb * 4)?,
            c: c.into().check("c", ec * 4)?,
            bias: bias.map(|bias| bias.into().check("bias", u64::from(shape.n) * 4)).transpose()?,
        };
        let lt_bytes = self.workspace_sizes.cublaslt;
        let state = self.blas_for(allocator, stream)?;
        match ops.bias {
            // cuBLASLt wants k > 0; an empty contraction is C = beta·C + bias.
            Some(bias) if shape.k == 0 => {
                state.gemm(shape, ops, beta)?;
                self.add_bias(
                    stream,
                    DeviceSpan::new(ops.c, ec * 4),
                    DeviceSpan::new(bias, u64::from(shape.n) * 4),
                    shape.m,
                    shape.n,
                )
            }
            Some(_) => {
                state.ensure_lt(allocator, stream, lt_bytes)?;
                state.gemm_bias(shape, ops, beta)
            }
            None => state.gemm(shape, ops, beta),
        }
    }

    /// Linear layer forward, `y[batch, out] = x[batch, in] · w[out, in]ᵀ (+ bias[out])`
    /// (PyTorch's weight layout; with a bias, cuBLASLt as in PyTorch).
    #[allow(clippy::too_many_arguments)] // the layer's operands and its three sizes
    pub fn linear_forward(
        &mut self,
        allocator: &mut CachingAllocator<CudaBackend>,
        stream: StreamId,
        x: impl Into<DeviceSpan>,
        w: impl Into<DeviceSpan>,
        bias: Option<DeviceSpan>,
        y: impl Into<DeviceSpan>,
        batch: u32,
        inputs: u32,
        outputs: u32,
    ) -> Result<(), CudaError> {
        let (x, w, y) = (x.into(), w.into(), y.into());
        self.matmul(allocator, stream, Matmul { bias, ..Matmul::new(x, w, y, MatmulShape::nt(batch, outputs, inputs)) })
    }

    /// Linear layer backward from `dy[batch, out]`: `dx = dy · w` (if wanted),
    /// `dw (+)= dyᵀ · x` and `db (+)= Σ_batch dy` (if wanted); `accumulate` adds into `dw` and
    /// `db` as autograd does into `.grad`. Two cuBLAS products and a column sum.
    #[allow(clippy::too_many_arguments)] // the layer's operands and its three sizes
    pub fn linear_backward(
        &mut self,
        allocator: &mut CachingAllocator<CudaBackend>,
        stream: StreamId,
        x: impl Into<DeviceSpan>,
        w: impl Into<DeviceSpan>,
        dy: impl Into<DeviceSpan>,
        dx: Option<DeviceSpan>,
        dw: impl Into<DeviceSpan>,
        db: Option<DeviceSpan>,
        batch: u32,
        inputs: u32,
        outputs: u32,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        let (x, w, dy, dw) = (x.into(), w.into(), dy.into(), dw.into());
        if let Some(dx) = dx {
            self.matmul(allocator, stream, Matmul::new(dy, w, dx, MatmulShape::nn(batch, inputs, outputs)))?;
        }
        let beta = if accumulate { 1.0 } else { 0.0 };
        self.matmul(
            allocator,
            stream,
            Matmul { beta, ..Matmul::new(dy, x, dw, MatmulShape::tn(outputs, inputs, batch)) },
        )?;
        if let Some(db) = db {
            self.sum_rows(stream, SumRows { x: dy, out: db, rows: batch, cols: outputs, accumulate })?;
        }
        Ok(())
    }
}

/// One argument of a kernel launch: anything cudarc passes by value to a kernel parameter
/// (device addresses as `u64`, sizes, scalars).
trait KernelArg {
    /// Pushes `self` as the launch's next parameter.
    fn push<'a>(&'a self, launch: &mut LaunchArgs<'a>);
}

impl<T: DeviceRepr> KernelArg for T {
    fn push<'a>(&'a self, launch: &mut LaunchArgs<'a>) {
        launch.arg(self);
    }
}

/// Launches `function` on `stream` with `config` and `args` in the kernel's parameter order:
/// the one launch sequence of every kernel of this module.
///
/// # Safety
///
/// `args` must match the kernel's parameters in number, type and order, and every device
/// address among them must reach memory that holds what the kernel touches under `config`
/// (the callers check their operands first; each call states the kernel's signature).
unsafe fn launch(
    stream: &CudaStream,
    function: &CudaFunction,
    config: LaunchConfig,
    args: &[&dyn KernelArg],
) -> Result<(), CudaError> {
    let mut builder = stream.launch_builder(function);
    for arg in args {
        arg.push(&mut builder);
    }
    // SAFETY: the caller's contract (see above).
    unsafe { builder.launch(config) }.map(drop).map_err(CudaError::driver("cuLaunchKernel"))
}

impl StreamBlas {
    /// The workspace blocks, for freeing.
    fn into_workspaces(self) -> (Allocation, Option<Allocation>) {
        (self.workspace, self.lt.map(|lt| lt.workspace))
    }
}
