//! The kernel runner: WGSL kernels dispatched on allocations of a
//! `CachingAllocator<WgpuBackend>`, batched into one submission.
//!
//! An op is its struct from `cachalot_shaders::ops` (operands and arguments), whose `validate`
//! is the one check of its arguments on every backend; the runner checks the operands
//! (handles, sizes, binding limits).

use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};

use cachalot_core::{Allocation, CachingAllocator, StreamId};
use cachalot_shaders::MatmulShape;
use cachalot_shaders::ops::{
    ActivationBackward, ActivationForward, AdamStep, CrossEntropy, Matmul, Mse, SgdStep, SumRows,
};
use cachalot_shaders::wgsl::{self, MatmulTile, Module};

use crate::backend::WgpuBackend;
use crate::context::WgpuContext;
use crate::error::KernelError;
use crate::pipelines::{Kernel, PipelineKey};
use crate::readback::{MapState, Readback};

/// The stream that stands for the GPU queue.
///
/// wgpu has one queue. When a kernel uses an allocation, the runner records the use on this
/// stream (`record_stream`), so a later `free` records an event (the latest submission
/// number) and the block returns to the cache only once that submission has completed: the
/// wgpu form of PyTorch's `record_stream`. Allocate on any other stream, usually
/// [`StreamId::DEFAULT`].
pub const QUEUE_STREAM: StreamId = StreamId(1);

/// The `Params` uniform of `common.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    rows: u32,
    cols: u32,
    base: u32,
    f0: [f32; 4],
    f1: [f32; 4],
}

/// The `Params` uniform of `matmul.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct MatmulParams {
    m: u32,
    n: u32,
    k: u32,
    beta: f32,
}

/// A range of a buffer bound to one binding.
#[derive(Clone, Debug)]
struct Binding {
    buffer: wgpu::Buffer,
    offset: u64,
    size: u64,
}

impl Binding {
    fn slice(&self, start: u64, len: u64) -> Binding {
        Binding { buffer: self.buffer.clone(), offset: self.offset + start, size: len }
    }
}

/// One recorded step of a batch, encoded at submit.
#[derive(Debug)]
enum Op {
    Dispatch { kernel: Arc<Kernel>, bindings: Vec<Binding>, params: Vec<u8>, groups: (u32, u32) },
    Copy { src: Binding, dst: Binding },
}

/// Dispatches the WGSL kernels of `cachalot-shaders` on allocations.
///
/// Cheap to clone (it holds the shared [`WgpuContext`]). Work is recorded into a
/// [`KernelBatch`] and submitted at once; every allocation a batch uses is recorded on
/// [`QUEUE_STREAM`], so freeing it is safe at any time after the batch.
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use cachalot_core::{AllocatorConfig, CachingAllocator, StreamId};
/// use cachalot_shaders::MatmulShape;
/// use cachalot_shaders::ops::Matmul;
/// use cachalot_wgpu::{Kernels, WgpuBackend, WgpuConfig, WgpuContext};
///
/// let context = WgpuContext::request_blocking(WgpuConfig::default())?;
/// let mut allocator = CachingAllocator::new(WgpuBackend::new(context.clone()), AllocatorConfig::default())?;
/// let kernels = Kernels::new(context);
/// let (a, b, c) = (
///     allocator.malloc(64 * 32 * 4, StreamId::DEFAULT)?,
///     allocator.malloc(32 * 16 * 4, StreamId::DEFAULT)?,
///     allocator.malloc(64 * 16 * 4, StreamId::DEFAULT)?,
/// );
/// let mut batch = kernels.batch(&mut allocator);
/// batch.upload_f32(&a, &vec![1.0; 64 * 32])?;
/// batch.upload_f32(&b, &vec![0.5; 32 * 16])?;
/// batch.matmul(Matmul::new(&a, &b, &c, MatmulShape::nn(64, 16, 32)))?;
/// let result = batch.read_f32(&c, 64 * 16)?;
/// batch.submit()?;
/// assert_eq!(result.wait_f32()?[0], 16.0);
/// for x in [a, b, c] {
///     allocator.free(x)?; // safe at once: reuse waits for the submission
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Kernels {
    context: Arc<WgpuContext>,
    matmul_tile: Option<MatmulTile>,
}

impl Kernels {
    /// A runner on `context`'s device.
    pub fn new(context: Arc<WgpuContext>) -> Self {
        Kernels { context, matmul_tile: None }
    }

    /// The shared context.
    pub fn context(&self) -> &Arc<WgpuContext> {
        &self.context
    }

    /// Forces a matmul tile shape (for benchmarks); `None` picks one per product.
    pub fn with_matmul_tile(mut self, tile: Option<MatmulTile>) -> Self {
        self.matmul_tile = tile;
        self
    }

    /// The tile a product of `m × n` outputs runs with: the large tile when the device has
    /// the workgroup memory and invocations for it and the product has enough tiles to keep a
    /// big GPU busy, otherwise the small one.
    pub fn matmul_tile(&self, m: u32, n: u32) -> MatmulTile {
        if let Some(tile) = self.matmul_tile {
            return tile;
        }
        let limits = self.context.limits();
        let large = MatmulTile::LARGE;
        let (x, y) = large.workgroup_size();
        let fits = large.shared_bytes() <= limits.max_compute_workgroup_storage_size as u64
            && large.invocations() <= limits.max_compute_invocations_per_workgroup
            && x <= limits.max_compute_workgroup_size_x
            && y <= limits.max_compute_workgroup_size_y;
        let (gx, gy) = large.workgroups(m, n);
        // Below ~2 large tiles per SM of a big GPU (132 on an H100), 4x more small tiles win.
        if fits && gx as u64 * gy as u64 >= 256 { large } else { MatmulTile::SMALL }
    }

    /// A batch recording work on `allocator`'s allocations.
    pub fn batch<'a>(&self, allocator: &'a mut CachingAllocator<WgpuBackend>) -> KernelBatch<'a> {
        KernelBatch {
            kernels: self.clone(),
            ops: Vec::new(),
            pending: Pending { allocator, readbacks: Vec::new(), scratch: Vec::new() },
        }
    }

    /// Uploads `data` into `dst` in its own submission.
    pub fn upload_f32(
        &self,
        allocator: &mut CachingAllocator<WgpuBackend>,
        dst: &Allocation,
        data: &[f32],
    ) -> Result<u64, KernelError> {
        let mut batch = self.batch(allocator);
        batch.upload_f32(dst, data)?;
        batch.submit()
    }

    /// Starts reading `len` f32 values of `src` back in its own submission.
    pub fn read_f32(
        &self,
        allocator: &mut CachingAllocator<WgpuBackend>,
        src: &Allocation,
        len: usize,
    ) -> Result<Readback, KernelError> {
        let mut batch = self.batch(allocator);
        let readback = batch.read_f32(src, len)?;
        batch.submit()?;
        Ok(readback)
    }
}

/// Work recorded on allocations, submitted as one command buffer by [`KernelBatch::submit`].
///
/// Steps run in the order they were recorded (uploads and readbacks included). The batch
/// borrows the allocator, so no block it uses can be freed and handed out again before the
/// work is submitted; after the submit, freeing is safe at once (see [`QUEUE_STREAM`]).
/// Dropping a batch without submitting discards its work.
pub struct KernelBatch<'a> {
    kernels: Kernels,
    ops: Vec<Op>,
    pending: Pending<'a>,
}

/// What a batch owes until its work is submitted: readbacks to start and scratch blocks to
/// free. Dropped unsubmitted, it fails the readbacks and frees the scratch.
struct Pending<'a> {
    allocator: &'a mut CachingAllocator<WgpuBackend>,
    readbacks: Vec<(wgpu::Buffer, Arc<Mutex<MapState>>)>,
    scratch: Vec<Allocation>,
}

impl Pending<'_> {
    fn fail_readbacks(&mut self, reason: &str) {
        for (_, state) in self.readbacks.drain(..) {
            MapState::finish(&state, Err(reason.to_owned()));
        }
    }

    fn free_scratch(&mut self) -> Result<(), KernelError> {
        for allocation in std::mem::take(&mut self.scratch) {
            self.allocator.free(allocation)?;
        }
        Ok(())
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.fail_readbacks("the batch was dropped before it was submitted");
        // Nothing can report an error from a drop; a failed free leaves the block allocated.
        let _ = self.free_scratch();
    }
}

impl std::fmt::Debug for KernelBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelBatch")
            .field("ops", &self.ops.len())
            .field("readbacks", &self.pending.readbacks.len())
            .finish()
    }
}

impl<'a> KernelBatch<'a> {
    fn context(&self) -> &WgpuContext {
        &self.kernels.context
    }

    /// Checks a handle, records its use on the queue and resolves `bytes` of it.
    fn operand(&mut self, operand: &'static str, allocation: &Allocation, bytes: u64) -> Result<Binding, KernelError> {
        if allocation.stream() == QUEUE_STREAM {
            return Err(KernelError::QueueStream(allocation.address()));
        }
        // Fails for a stale, freed or foreign handle; marks the block as used by the queue.
        self.pending.allocator.record_stream(allocation, QUEUE_STREAM)?;
        if bytes > allocation.size() {
            return Err(KernelError::TooSmall { operand, needed: bytes, size: allocation.size() });
        }
        // Blocks are multiples of 512 bytes, so rounding to whole vec4s stays inside the block.
        let bound = bytes.max(4).next_multiple_of(16).min(allocation.size());
        let range = self.pending.allocator.backend().resolve(allocation.address(), bound)?;
        Ok(Binding { buffer: range.buffer.clone(), offset: range.offset, size: range.size })
    }

    /// Like [`KernelBatch::operand`], for an operand bound whole in one dispatch.
    fn whole(&mut self, operand: &'static str, allocation: &Allocation, bytes: u64) -> Result<Binding, KernelError> {
        let binding = self.operand(operand, allocation, bytes)?;
        let limit = self.context().limits().max_storage_buffer_binding_size;
        if binding.size > limit {
            return Err(KernelError::BindingTooLarge { operand, bytes: binding.size, limit });
        }
        Ok(binding)
    }

    fn entry(&self, module: Module, entry: &'static str) -> Result<Arc<Kernel>, KernelError> {
        self.context().kernel(PipelineKey::Entry { module, entry })
    }

    fn dispatch(
        &mut self,
        kernel: Arc<Kernel>,
        bindings: Vec<Binding>,
        params: &[u8],
        groups: u64,
    ) -> Result<(), KernelError> {
        let groups = grid(groups, self.context().limits().max_compute_workgroups_per_dimension)?;
        self.ops.push(Op::Dispatch { kernel, bindings, params: params.to_vec(), groups });
        Ok(())
    }

    /// An element-wise kernel over `n` elements of every operand, in chunks that fit one
    /// binding (offsets stay multiples of the storage offset alignment). `whole` operands
    /// are bound entirely in every chunk; `params.base` is set to each chunk's first element.
    fn elementwise(
        &mut self,
        module: Module,
        entry: &'static str,
        chunked: &[(&'static str, &Allocation)],
        whole: &[(&'static str, &Allocation, u64)],
        n: u64,
        params: Params,
    ) -> Result<(), KernelError> {
        if n == 0 {
            return Ok(());
        }
        if n > u32::MAX as u64 {
            return Err(KernelError::InvalidArguments(format!("{n} elements: kernels index with 32 bits")));
        }
        let kernel = self.entry(module, entry)?;
        let mut full = Vec::with_capacity(chunked.len());
        for &(name, allocation) in chunked {
            full.push(self.operand(name, allocation, n * 4)?);
        }
        let mut fixed = Vec::with_capacity(whole.len());
        for &(name, allocation, bytes) in whole {
            fixed.push(self.whole(name, allocation, bytes)?);
        }
        let limits = self.context().limits();
        let align = (limits.min_storage_buffer_offset_alignment as u64).max(16);
        let chunk = (limits.max_storage_buffer_binding_size / align * align / 4).min(u32::MAX as u64 / 2);
        if chunk == 0 {
            return Err(KernelError::BindingTooLarge {
                operand: chunked[0].0,
                bytes: n * 4,
                limit: limits.max_storage_buffer_binding_size,
            });
        }
        let storage = module.storage_bindings() as usize;
        let mut start = 0;
        while start < n {
            let len = chunk.min(n - start);
            let mut bindings: Vec<Binding> = full.iter().map(|b| b.slice(start * 4, len * 4)).collect();
            bindings.extend(fixed.iter().cloned());
            pad_bindings(&mut bindings, storage, self.context());
            let params = Params { n: len as u32, base: start as u32, ..params };
            self.dispatch(kernel.clone(), bindings, bytemuck::bytes_of(&params), len.div_ceil(wgsl::WORKGROUP as u64))?;
            start += len;
        }
        Ok(())
    }

    // ---- matrix products and the linear layer ----

    /// `C = op(A) · op(B) (+ beta · C) (+ bias)`; layouts in [`MatmulShape`].
    pub fn matmul(&mut self, op: Matmul<&Allocation>) -> Result<(), KernelError> {
        let Matmul { a, b, c, shape, beta, bias } = op;
        if shape.is_empty() {
            return Ok(());
        }
        let (ea, eb, ec) = shape.elements();
        let mut bindings = vec![self.whole("a", a, ea * 4)?, self.whole("b", b, eb * 4)?, self.whole("c", c, ec * 4)?];
        match bias {
            Some(bias) => bindings.push(self.whole("bias", bias, shape.n as u64 * 4)?),
            // Never read: a range of its own, as WebGPU wants (see `pad_bindings`).
            None => pad_bindings(&mut bindings, 4, self.context()),
        }
        let MatmulShape { m, n, k, trans_a, trans_b } = shape;
        // vec4 loads need every operand's contiguous axis to hold whole vec4s.
        let vec = (if trans_a { m } else { k }) % 4 == 0 && (if trans_b { k } else { n }) % 4 == 0 && n % 4 == 0;
        let tile = self.kernels.matmul_tile(m, n);
        let kernel =
            self.context().kernel(PipelineKey::Matmul { tile, trans_a, trans_b, bias: bias.is_some(), vec })?;
        let (gx, gy) = tile.workgroups(m, n);
        let max = self.context().limits().max_compute_workgroups_per_dimension;
        if gx > max || gy > max {
            return Err(KernelError::InvalidArguments(format!(
                "a {m} x {n} product needs {gx} x {gy} workgroups, over max_compute_workgroups_per_dimension ({max})"
            )));
        }
        let params = MatmulParams { m, n, k, beta };
        self.ops.push(Op::Dispatch {
            kernel,
            bindings,
            params: bytemuck::bytes_of(&params).to_vec(),
            groups: (gx, gy),
        });
        Ok(())
    }

    /// Linear layer forward, `y[batch, out] = x[batch, in] · w[out, in]ᵀ + bias[out]`.
    #[allow(clippy::too_many_arguments)] // the layer's operands and its three sizes
    pub fn linear_forward(
        &mut self,
        x: &Allocation,
        w: &Allocation,
        bias: Option<&Allocation>,
        y: &Allocation,
        batch: u32,
        inputs: u32,
        outputs: u32,
    ) -> Result<(), KernelError> {
        self.matmul(Matmul { bias, ..Matmul::new(x, w, y, MatmulShape::nt(batch, outputs, inputs)) })
    }

    /// Linear layer backward from `dy[batch, out]`: `dx = dy · w` (if wanted),
    /// `dw (+)= dyᵀ · x` and `db (+)= Σ_batch dy` (if wanted); `accumulate` adds into `dw`
    /// and `db` as autograd does into `.grad`.
    #[allow(clippy::too_many_arguments)] // the layer's operands and its three sizes
    pub fn linear_backward(
        &mut self,
        x: &Allocation,
        w: &Allocation,
        dy: &Allocation,
        dx: Option<&Allocation>,
        dw: &Allocation,
        db: Option<&Allocation>,
        batch: u32,
        inputs: u32,
        outputs: u32,
        accumulate: bool,
    ) -> Result<(), KernelError> {
        if let Some(dx) = dx {
            self.matmul(Matmul::new(dy, w, dx, MatmulShape::nn(batch, inputs, outputs)))?;
        }
        let beta = if accumulate { 1.0 } else { 0.0 };
        self.matmul(Matmul { beta, ..Matmul::new(dy, x, dw, MatmulShape::tn(outputs, inputs, batch)) })?;
        if let Some(db) = db {
            self.sum_rows(SumRows { x: dy, out: db, rows: batch, cols: outputs, accumulate })?;
        }
        Ok(())
    }

    // ---- element-wise ----

    /// `x[i] = value` for `n` elements.
    pub fn fill(&mut self, x: &Allocation, n: u64, value: f32) -> Result<(), KernelError> {
        let params = Params { f0: [value, 0.0, 0.0, 0.0], ..Params::default() };
        self.elementwise(Module::Elementwise, "fill", &[("x", x)], &[], n, params)
    }

    /// `dst[i] = src[i]` for `n` elements (the ranges must not overlap).
    pub fn copy(&mut self, src: &Allocation, dst: &Allocation, n: u64) -> Result<(), KernelError> {
        self.elementwise(Module::Elementwise, "copy", &[("src", src), ("dst", dst)], &[], n, Params::default())
    }

    /// `y = act(x)` (ReLU: `max(x, 0)`; exact GELU: `x · Φ(x)`).
    pub fn activation(&mut self, op: ActivationForward<&Allocation>) -> Result<(), KernelError> {
        let ActivationForward { act, x, y, n } = op;
        self.elementwise(Module::Elementwise, act.forward_entry(), &[("x", x), ("y", y)], &[], n, Params::default())
    }

    /// `dx = act'(x) · dy` (ReLU: `dy` where `x > 0`, else 0; GELU: `dy · (Φ(x) + x · φ(x))`).
    pub fn activation_backward(&mut self, op: ActivationBackward<&Allocation>) -> Result<(), KernelError> {
        let ActivationBackward { act, x, dy, dx, n } = op;
        let operands = [("x", x), ("dy", dy), ("dx", dx)];
        self.elementwise(Module::Elementwise, act.backward_entry(), &operands, &[], n, Params::default())
    }

    /// `x[r, c] += bias[c]` for `x` of `[rows, cols]`.
    pub fn add_bias(&mut self, x: &Allocation, bias: &Allocation, rows: u32, cols: u32) -> Result<(), KernelError> {
        if cols == 0 {
            return Ok(());
        }
        let params = Params { cols, ..Params::default() };
        let n = rows as u64 * cols as u64;
        self.elementwise(Module::Elementwise, "add_bias", &[("x", x)], &[("bias", bias, cols as u64 * 4)], n, params)
    }

    /// Column sums `out[c] (+)= Σ_r x[r, c]` of `x[rows, cols]` (the bias gradient).
    ///
    /// An `x` larger than one binding may be is summed in chunks of whole rows, each added to
    /// `out` (browsers' limit is often 128 MiB, below a tensor a PyTorch program reduces).
    pub fn sum_rows(&mut self, op: SumRows<&Allocation>) -> Result<(), KernelError> {
        let SumRows { x, out, rows, cols, accumulate } = op;
        if cols == 0 {
            return Ok(());
        }
        let kernel = self.entry(Module::Elementwise, "sum_rows")?;
        let x = self.operand("x", x, op.elements() * 4)?;
        let out = self.whole("out", out, cols as u64 * 4)?;
        let limits = self.context().limits();
        let row_bytes = cols as u64 * 4;
        // Chunks start at multiples of the storage offset alignment: whole rows, a multiple of
        // `step` rows at a time.
        let align = u64::from(limits.min_storage_buffer_offset_alignment).max(4);
        let step = align / gcd(row_bytes, align);
        let chunk_rows = (limits.max_storage_buffer_binding_size / row_bytes / step * step).min(u32::MAX as u64);
        if chunk_rows == 0 {
            return Err(KernelError::BindingTooLarge {
                operand: "x",
                bytes: row_bytes * step,
                limit: limits.max_storage_buffer_binding_size,
            });
        }
        let mut first = 0u64;
        while first < rows as u64 || first == 0 {
            let count = chunk_rows.min(rows as u64 - first);
            let binding = if first == 0 && count == rows as u64 {
                x.clone()
            } else {
                x.slice(first * row_bytes, count * row_bytes)
            };
            let add = accumulate || first > 0;
            let f0 = [if add { 1.0 } else { 0.0 }, 0.0, 0.0, 0.0];
            let params = Params { rows: count as u32, cols, f0, ..Params::default() };
            let mut bindings = vec![binding, out.clone()];
            pad_bindings(&mut bindings, 3, self.context());
            self.dispatch(
                kernel.clone(),
                bindings,
                bytemuck::bytes_of(&params),
                (cols as u64).div_ceil(wgsl::WORKGROUP as u64),
            )?;
            first += count.max(1);
        }
        Ok(())
    }

    // ---- losses ----

    /// Mean squared error ([`Mse`]); the gradient only if `grad` is given.
    pub fn mse(&mut self, op: Mse<&Allocation>) -> Result<(), KernelError> {
        op.validate()?;
        let Mse { pred, target, loss, grad, n } = op;
        if n > u32::MAX as u64 {
            return Err(KernelError::InvalidArguments(format!("{n} elements are more than one reduction counts")));
        }
        let kernel = self.entry(Module::Mse, "mse_loss")?;
        let p = self.whole("pred", pred, n * 4)?;
        let t = self.whole("target", target, n * 4)?;
        let l = self.whole("loss", loss, 4)?;
        let params = Params { n: n as u32, f0: [op.loss_scale(), 0.0, 0.0, 0.0], ..Params::default() };
        self.dispatch(kernel, vec![p.clone(), t.clone(), p, l], bytemuck::bytes_of(&params), 1)?;
        if let Some(grad) = grad {
            let params = Params { f0: [op.grad_scale(), 0.0, 0.0, 0.0], ..Params::default() };
            let operands = [("pred", pred), ("target", target), ("grad", grad)];
            self.elementwise(Module::Mse, "mse_grad", &operands, &[], n, params)?;
        }
        Ok(())
    }

    /// Softmax cross-entropy ([`CrossEntropy`]). Takes a scratch block of `rows` f32 from the
    /// allocator for the per-row losses.
    pub fn cross_entropy(&mut self, op: CrossEntropy<&Allocation>) -> Result<(), KernelError> {
        op.validate()?;
        let CrossEntropy { logits, targets, loss, grad, rows, cols } = op;
        let rows_kernel = self.entry(Module::CrossEntropy, "xent_rows")?;
        let mean_kernel = self.entry(Module::CrossEntropy, "xent_mean")?;
        let elements = op.elements();
        let bindings = vec![
            self.whole("logits", logits, elements * 4)?,
            self.whole("targets", targets, rows as u64 * 4)?,
            self.whole("grad", grad, elements * 4)?,
        ];
        let row_loss = self.pending.allocator.malloc(rows as u64 * 4, StreamId::DEFAULT)?;
        self.pending.scratch.push(row_loss);
        let mut bindings = bindings;
        bindings.push(self.whole("row_loss", &row_loss, rows as u64 * 4)?);
        bindings.push(self.whole("loss", loss, 4)?);
        let params = Params { rows, cols, f0: [op.scale(), 0.0, 0.0, 0.0], ..Params::default() };
        self.dispatch(rows_kernel, bindings.clone(), bytemuck::bytes_of(&params), rows as u64)?;
        self.dispatch(mean_kernel, bindings, bytemuck::bytes_of(&params), 1)
    }

    // ---- optimisers ----

    /// One SGD step ([`SgdStep`]); the momentum buffer is needed when `sgd.momentum != 0`.
    pub fn sgd_step(&mut self, op: SgdStep<&Allocation>) -> Result<(), KernelError> {
        op.validate()?;
        let SgdStep { param, grad, momentum: momentum_buf, n, sgd, first_step } = op;
        let f0 = [sgd.lr, sgd.momentum, sgd.dampening, sgd.weight_decay];
        let f1 = [f32::from(u8::from(first_step)), f32::from(u8::from(sgd.nesterov)), 0.0, 0.0];
        let params = Params { f0, f1, ..Params::default() };
        let mut operands = vec![("param", param), ("grad", grad)];
        // Without momentum the buffer is never read: the kernel's slot is padded.
        operands.extend(momentum_buf.map(|buf| ("momentum_buf", buf)));
        self.elementwise(Module::Optim, "sgd_step", &operands, &[], n, params)
    }

    /// One Adam step ([`AdamStep`]).
    pub fn adam_step(&mut self, op: AdamStep<&Allocation>) -> Result<(), KernelError> {
        op.validate()?;
        let AdamStep { param, grad, exp_avg, exp_avg_sq, n, adam, .. } = op;
        let (step_size, sqrt_bc2) = op.constants();
        let params = Params {
            f0: [step_size, adam.beta1, adam.beta2, adam.eps],
            f1: [adam.weight_decay, sqrt_bc2, 0.0, 0.0],
            ..Params::default()
        };
        let operands = [("param", param), ("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)];
        self.elementwise(Module::Optim, "adam_step", &operands, &[], n, params)
    }

    // ---- transfers ----

    /// Writes `data` to the start of `dst`, in order with the batch's other steps.
    pub fn upload_bytes(&mut self, dst: &Allocation, data: &[u8]) -> Result<(), KernelError> {
        if data.is_empty() {
            return Ok(());
        }
        let dst = self.operand("dst", dst, data.len() as u64)?;
        // Copies move multiples of 4 bytes; the block has room for the padding.
        let len = (data.len() as u64).next_multiple_of(4);
        let staging = self.context().device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("cachalot upload"),
            size: len,
            usage: wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        {
            let mut view = staging.get_mapped_range_mut(..).map_err(|e| KernelError::Wgpu(e.to_string()))?;
            view.slice(..data.len()).copy_from_slice(data);
        }
        staging.unmap();
        let src = Binding { buffer: staging, offset: 0, size: len };
        self.ops.push(Op::Copy { src, dst: Binding { size: len, ..dst } });
        Ok(())
    }

    /// Writes f32 values to the start of `dst`.
    pub fn upload_f32(&mut self, dst: &Allocation, data: &[f32]) -> Result<(), KernelError> {
        self.upload_bytes(dst, bytemuck::cast_slice(data))
    }

    /// Writes u32 values (e.g. class indices) to the start of `dst`.
    pub fn upload_u32(&mut self, dst: &Allocation, data: &[u32]) -> Result<(), KernelError> {
        self.upload_bytes(dst, bytemuck::cast_slice(data))
    }

    /// Copies the first `len` bytes of `src` to the host, after the steps recorded before.
    /// The data can be taken once the batch is submitted and the copy has run.
    pub fn read_bytes(&mut self, src: &Allocation, len: u64) -> Result<Readback, KernelError> {
        let padded = len.max(4).next_multiple_of(4);
        let src = self.operand("src", src, padded)?;
        let buffer = self.context().device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("cachalot readback"),
            size: padded,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let state = Arc::new(Mutex::new(MapState::default()));
        self.ops.push(Op::Copy {
            src: Binding { size: padded, ..src },
            dst: Binding { buffer: buffer.clone(), offset: 0, size: padded },
        });
        self.pending.readbacks.push((buffer.clone(), Arc::clone(&state)));
        Ok(Readback { context: Arc::clone(&self.kernels.context), buffer, len, state, submission: 0 })
    }

    /// Copies `len` f32 values of `src` to the host.
    pub fn read_f32(&mut self, src: &Allocation, len: usize) -> Result<Readback, KernelError> {
        self.read_bytes(src, len as u64 * 4)
    }

    /// Copies `len` u32 values of `src` to the host.
    pub fn read_u32(&mut self, src: &Allocation, len: usize) -> Result<Readback, KernelError> {
        self.read_bytes(src, len as u64 * 4)
    }

    /// Steps recorded so far.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Encodes and submits everything recorded, returns the submission number, and frees the
    /// batch's scratch blocks (safe at once: they return to the cache when the submission
    /// completes). Readbacks of the batch become ready when it completes.
    pub fn submit(self) -> Result<u64, KernelError> {
        self.encode()?.submit()
    }

    /// Encodes everything recorded into a command buffer without submitting it (creating
    /// bind groups and validating takes host time; a benchmark times only
    /// [`EncodedBatch::submit`] and the wait).
    pub fn encode(self) -> Result<EncodedBatch<'a>, KernelError> {
        let KernelBatch { kernels, ops, mut pending } = self;
        let context = kernels.context;
        let (encoded, error) = context.scoped(wgpu::ErrorFilter::Validation, || encode(&context, ops));
        let error = match (encoded, error) {
            (Ok(commands), None) => return Ok(EncodedBatch { context, commands: Some(commands), pending }),
            (Err(error), _) => error,
            (Ok(_), Some(error)) => KernelError::Wgpu(error.to_string()),
        };
        pending.fail_readbacks(&format!("the batch failed: {error}"));
        Err(error)
    }
}

/// A batch encoded into a command buffer, ready to submit.
pub struct EncodedBatch<'a> {
    context: Arc<WgpuContext>,
    commands: Option<wgpu::CommandBuffer>,
    pending: Pending<'a>,
}

impl std::fmt::Debug for EncodedBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodedBatch").field("readbacks", &self.pending.readbacks.len()).finish()
    }
}

impl EncodedBatch<'_> {
    /// Submits the work, returns the submission number, starts the readbacks and frees the
    /// scratch blocks (safe at once: they return to the cache when the submission completes).
    pub fn submit(mut self) -> Result<u64, KernelError> {
        let submission = self.context.submit(self.commands.take());
        for (buffer, state) in self.pending.readbacks.drain(..) {
            let callback_state = Arc::clone(&state);
            buffer.map_async(wgpu::MapMode::Read, .., move |result| {
                MapState::finish(&callback_state, result.map_err(|e| e.to_string()));
            });
        }
        self.pending.free_scratch()?;
        Ok(submission)
    }
}

/// Builds the command buffer: one uniform buffer for every dispatch's parameters, compute
/// passes between copies.
fn encode(context: &WgpuContext, ops: Vec<Op>) -> Result<wgpu::CommandBuffer, KernelError> {
    let device = context.device();
    let stride = (wgsl::PARAMS_BYTES).next_multiple_of(context.limits().min_uniform_buffer_offset_alignment as u64);
    let dispatches = ops.iter().filter(|op| matches!(op, Op::Dispatch { .. })).count() as u64;
    let uniforms = (dispatches > 0).then(|| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("cachalot kernel parameters"),
            size: dispatches * stride,
            usage: wgpu::BufferUsages::UNIFORM,
            mapped_at_creation: true,
        })
    });
    if let Some(uniforms) = &uniforms {
        {
            let mut view = uniforms.get_mapped_range_mut(..).map_err(|e| KernelError::Wgpu(e.to_string()))?;
            let mut at = 0usize;
            for op in &ops {
                if let Op::Dispatch { params, .. } = op {
                    view.slice(at..at + params.len()).copy_from_slice(params);
                    at += stride as usize;
                }
            }
        }
        uniforms.unmap();
    }

    let mut bind_groups = Vec::with_capacity(dispatches as usize);
    let mut slot = 0u64;
    for op in &ops {
        let Op::Dispatch { kernel, bindings, params, .. } = op else { continue };
        let Some(uniforms) = &uniforms else { break };
        let mut entries: Vec<wgpu::BindGroupEntry<'_>> = bindings
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &b.buffer,
                    offset: b.offset,
                    size: NonZeroU64::new(b.size),
                }),
            })
            .collect();
        entries.push(wgpu::BindGroupEntry {
            binding: bindings.len() as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: uniforms,
                offset: slot * stride,
                size: NonZeroU64::new(params.len() as u64),
            }),
        });
        bind_groups.push(device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &kernel.layout,
            entries: &entries,
        }));
        slot += 1;
    }

    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("cachalot batch") });
    let mut groups = bind_groups.iter();
    let mut ops = ops.iter().peekable();
    while let Some(op) = ops.next() {
        match op {
            Op::Copy { src, dst } => {
                encoder.copy_buffer_to_buffer(&src.buffer, src.offset, &dst.buffer, dst.offset, src.size);
            }
            Op::Dispatch { .. } => {
                let mut pass =
                    encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
                let mut current = Some(op);
                while let Some(Op::Dispatch { kernel, groups: (x, y), .. }) = current {
                    let Some(group) = groups.next() else { break };
                    pass.set_pipeline(&kernel.pipeline);
                    pass.set_bind_group(0, group, &[]);
                    pass.dispatch_workgroups(*x, *y, 1);
                    current = if matches!(ops.peek(), Some(Op::Dispatch { .. })) { ops.next() } else { None };
                }
            }
        }
    }
    Ok(encoder.finish())
}

/// Repeats the first binding into unused slots (never read; any valid range will do).
/// Fills the storage bindings a kernel declares but this call does not use with disjoint
/// ranges of the context's spare buffer: WebGPU refuses two writable bindings that overlap, so
/// a padding binding may not repeat an operand or another padding binding.
fn pad_bindings(bindings: &mut Vec<Binding>, storage: usize, context: &WgpuContext) {
    let mut slot = 0;
    while bindings.len() < storage {
        let (buffer, offset, size) = context.unused_binding(slot);
        bindings.push(Binding { buffer, offset, size });
        slot += 1;
    }
}

/// The greatest common divisor.
fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// A 2-D grid of `groups` workgroups: x up to the per-dimension limit, y the rest.
fn grid(groups: u64, limit: u32) -> Result<(u32, u32), KernelError> {
    let limit = limit.max(1) as u64;
    let x = groups.clamp(1, limit);
    let y = groups.div_ceil(x);
    if y > limit {
        return Err(KernelError::InvalidArguments(format!("{groups} workgroups exceed a {limit} x {limit} grid")));
    }
    Ok((x as u32, y as u32))
}
