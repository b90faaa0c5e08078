//! [`Runtime`] and [`Tensor`]: f32 (and u32) tensors that own blocks of the device's caching
//! allocator, and the operations of the experiments on them.
//!
//! A tensor is one allocation; dropping it frees the block, as a PyTorch tensor's storage is
//! released when its last reference goes. Every operation allocates its outputs first (in the
//! order PyTorch's kernels and autograd do), then runs on the device. Nothing else allocates,
//! except what the real device's kernels allocate themselves — the CUDA device's persistent
//! cuBLAS / cuBLASLt workspaces on the first products (and the simulator's `cuda-*` profiles,
//! which model them) and the cross-entropy kernels' scratch row. So the allocator sees the
//! same sequence on every device, up to those documented differences.
//!
//! On queue-ordered devices (wgpu, the simulator's `wgpu` profile) the runtime records every
//! operand of every operation on [`QUEUE_STREAM`] before running it: one place, one list, so
//! both devices record exactly the same uses and their event sequences are equal.
//!
//! Every allocation is made from a stack of three frames, innermost first: the operation
//! (`linear`, `cross_entropy`, ...), the Rust code that called it (file and line, found with
//! `#[track_caller]`: the line of the experiment or library user that made the tensor), and the
//! experiment's phase (`step 3`); workspace and scratch blocks get a fourth, innermost frame
//! naming them. The viewer shows them (its Memory view groups live memory by them), and
//! `compare` finds the workspaces by them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::Location;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use cachalot_core::{Allocation, ContextId, DeviceFacts, Frame, Mark, MemoryStats, TraceEntry};
use cachalot_shaders::ops::{
    ActivationBackward, ActivationForward, AdamStep, CrossEntropy, Matmul, Mean, Mse, SgdStep, SumRows,
};
use cachalot_shaders::{Adam, MatmulShape, Sgd};
use cachalot_trace::Snapshot;
use cachalot_trace::snapshot::file::Timing;

use crate::device::{Activation, BackendKind, Device, PendingRead, QUEUE_STREAM, StreamDiscipline, Workspaces};
use crate::error::RuntimeError;
use crate::stream::{TraceSink, Watcher};

/// Name of the frame that marks an allocation a matrix product made for itself: on CUDA,
/// PyTorch's persistent cuBLAS / cuBLASLt workspaces.
pub const WORKSPACE_FRAME: &str = "cuBLAS/cuBLASLt workspace (first product on the stream)";
/// Name of the frame of the cross-entropy kernels' scratch row.
pub const SCRATCH_FRAME: &str = "cross-entropy row scratch";
/// File name of the runtime's operation frames.
pub const RUNTIME_FILE: &str = "cachalot-runtime";

/// Trace entries kept (as `capture.py` records PyTorch's).
const HISTORY: usize = 3_000_000;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 32-bit unsigned integer (class targets).
    U32,
}

/// What makes a stack: the inner frame, the operation, the phase and the Rust caller.
type ContextKey = (&'static str, &'static str, String, Option<&'static Location<'static>>);

/// Name of the frame of the Rust code that called an operation (its file and line are the
/// frame's).
pub const CALLER_FRAME: &str = "called from";

/// The state behind a [`Runtime`] and its tensors.
struct Inner {
    device: Box<dyn Device>,
    discipline: StreamDiscipline,
    /// Errors of frees made by drops, reported at the next call.
    deferred: Vec<RuntimeError>,
    experiment: String,
    phase: String,
    /// Where the operation running now was called from (set by [`Inner::enter`]).
    caller: Option<&'static Location<'static>>,
    contexts: HashMap<ContextKey, ContextId>,
    timings: Vec<Timing>,
    notes: Vec<String>,
    /// Who watches the run as it happens, if anyone.
    watcher: Option<Watcher>,
}

impl Inner {
    fn context(&mut self, inner_frame: Option<&'static str>, op: &'static str) -> ContextId {
        let key = (inner_frame.unwrap_or(""), op, self.phase.clone(), self.caller);
        if let Some(&id) = self.contexts.get(&key) {
            return id;
        }
        let mut frames = Vec::with_capacity(3);
        if let Some(name) = inner_frame {
            frames.push(Frame { filename: Arc::from(RUNTIME_FILE), line: 0, name: Arc::from(name) });
        }
        frames.push(Frame { filename: Arc::from(RUNTIME_FILE), line: 0, name: Arc::from(op) });
        if let Some(caller) = self.caller {
            frames.push(Frame {
                filename: Arc::from(caller.file()),
                line: i64::from(caller.line()),
                name: Arc::from(CALLER_FRAME),
            });
        }
        frames.push(Frame {
            filename: Arc::from(self.experiment.as_str()),
            line: 0,
            name: Arc::from(self.phase.as_str()),
        });
        let id = self.device.allocator_mut().intern_context(&frames);
        self.contexts.insert(key, id);
        id
    }

    /// Starts operation `op`: its allocations are attributed to it and to the code that called
    /// the public operation (every function between that one and here is `#[track_caller]`).
    #[track_caller]
    fn enter(&mut self, op: &'static str) -> Result<(), RuntimeError> {
        self.caller = Some(Location::caller());
        if let Some(error) = self.deferred.pop() {
            self.deferred.clear();
            return Err(RuntimeError::Deferred(Box::new(error)));
        }
        if let Some(watcher) = &mut self.watcher {
            watcher.before_operation(self.device.allocator())?;
        }
        let id = self.context(None, op);
        self.device.allocator_mut().set_context(Some(id));
        Ok(())
    }

    fn leave(&mut self) {
        self.caller = None;
        self.device.allocator_mut().set_context(None);
    }

    /// Runs `f` with the allocations it makes attributed to `frame` inside `op`.
    fn within<R>(
        &mut self,
        frame: &'static str,
        op: &'static str,
        f: impl FnOnce(&mut dyn Device) -> Result<R, RuntimeError>,
    ) -> Result<R, RuntimeError> {
        let inner = self.context(Some(frame), op);
        self.device.allocator_mut().set_context(Some(inner));
        let result = f(self.device.as_mut());
        let outer = self.context(None, op);
        self.device.allocator_mut().set_context(Some(outer));
        result
    }

    fn alloc(&mut self, bytes: u64) -> Result<Allocation, RuntimeError> {
        self.device.malloc(bytes)
    }

    /// Records the operands' use by the next kernel on queue-ordered devices.
    fn uses(&mut self, operands: &[&Allocation]) -> Result<(), RuntimeError> {
        if self.discipline == StreamDiscipline::QueueStream {
            for a in operands {
                self.device.allocator_mut().record_stream(a, QUEUE_STREAM)?;
            }
        }
        Ok(())
    }

    /// Frees outputs of an operation that failed.
    fn discard(&mut self, outputs: impl IntoIterator<Item = Allocation>) {
        for a in outputs {
            if let Err(e) = self.device.free(a) {
                self.deferred.push(e);
            }
        }
    }
}

/// A tensor: one block of the device's allocator, a shape and an element type. Dropping it
/// frees the block.
pub struct Tensor {
    inner: Rc<RefCell<Inner>>,
    allocation: Allocation,
    shape: Vec<usize>,
    dtype: DType,
}

impl Tensor {
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> u64 {
        numel(&self.shape)
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The block.
    pub fn allocation(&self) -> &Allocation {
        &self.allocation
    }

    /// Bytes of data (`numel · 4`).
    pub fn bytes(&self) -> u64 {
        self.numel() * 4
    }

    fn dims2(&self, what: &str) -> Result<(u32, u32), RuntimeError> {
        match self.shape[..] {
            [rows, cols] => Ok((to_u32(rows, what)?, to_u32(cols, what)?)),
            _ => Err(RuntimeError::Shape(format!("{what} must be 2-D, is {:?}", self.shape))),
        }
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field("address", &format_args!("{:#x}", self.allocation.address()))
            .finish()
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        match self.inner.try_borrow_mut() {
            Ok(mut inner) => {
                if let Err(error) = inner.device.free(self.allocation) {
                    inner.deferred.push(error);
                }
            }
            // Only a drop inside a runtime call could find it busy, and no runtime call drops
            // a tensor; the block stays allocated rather than panicking in a drop.
            Err(_) => tracing::error!(address = self.allocation.address(), "tensor dropped while the runtime was busy"),
        }
    }
}

/// The gradients of a linear layer.
#[derive(Debug)]
pub struct LinearGrads {
    /// Gradient of the input, if asked for.
    pub dx: Option<Tensor>,
    /// Gradient of the weight.
    pub dw: Tensor,
    /// Gradient of the bias, if the layer has one.
    pub db: Option<Tensor>,
}

fn numel(shape: &[usize]) -> u64 {
    shape.iter().map(|&d| d as u64).product()
}

fn to_u32(v: usize, what: &str) -> Result<u32, RuntimeError> {
    u32::try_from(v).map_err(|_| RuntimeError::Shape(format!("{what}: dimension {v} is over 32 bits")))
}

/// A tensor runtime over one [`Device`] (see the module docs). Cheap to clone; tensors keep it
/// alive.
#[derive(Clone)]
pub struct Runtime {
    inner: Rc<RefCell<Inner>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.borrow();
        f.debug_struct("Runtime")
            .field("device", &inner.device.allocator().device().name)
            .field("discipline", &inner.discipline)
            .finish()
    }
}

impl Runtime {
    /// A runtime on `device`, recording the allocator's history from the start.
    pub fn new(mut device: Box<dyn Device>) -> Self {
        device.allocator_mut().record_history(true, HISTORY, &[], true);
        let discipline = device.discipline();
        Runtime {
            inner: Rc::new(RefCell::new(Inner {
                device,
                discipline,
                deferred: Vec::new(),
                experiment: "experiment".into(),
                phase: "main".into(),
                caller: None,
                contexts: HashMap::new(),
                timings: Vec::new(),
                notes: Vec::new(),
                watcher: None,
            })),
        }
    }

    /// Streams what the allocator records to `sink` as the run goes ([`crate::stream`]): it
    /// gets the device and what was recorded so far now, batches while operations run, and
    /// can stop the run. Replaces an earlier sink.
    pub fn watch(&self, sink: Box<dyn TraceSink>) {
        let mut inner = self.inner.borrow_mut();
        let watcher = Watcher::attach(sink, inner.device.allocator());
        inner.watcher = Some(watcher);
    }

    /// Hands the sink (if any) everything recorded that it has not seen yet.
    pub fn deliver_watched(&self) {
        let mut inner = self.inner.borrow_mut();
        let Inner { watcher, device, .. } = &mut *inner;
        if let Some(watcher) = watcher {
            watcher.deliver(device.allocator());
        }
    }

    // ---- the device ----

    /// Which backend the runtime runs on.
    pub fn kind(&self) -> BackendKind {
        self.inner.borrow().device.kind()
    }

    /// When freed blocks become reusable on this device.
    pub fn discipline(&self) -> StreamDiscipline {
        self.inner.borrow().discipline
    }

    /// Whether kernels compute (false for an allocation-only simulation).
    pub fn computes(&self) -> bool {
        self.inner.borrow().device.computes()
    }

    /// The device's matrix-product workspaces, if it has any.
    pub fn workspaces(&self) -> Option<Workspaces> {
        self.inner.borrow().device.workspaces()
    }

    /// Facts about the device.
    pub fn device_facts(&self) -> DeviceFacts {
        self.inner.borrow().device.allocator().device().clone()
    }

    /// Facts about the run beyond the device's (profile, adapter, ...).
    pub fn run_facts(&self) -> Vec<(String, String)> {
        self.inner.borrow().device.run_facts()
    }

    /// Names the experiment (the outer frame of every allocation's stack).
    pub fn set_experiment(&self, name: &str) {
        self.inner.borrow_mut().experiment = name.to_owned();
    }

    /// Names the phase the following operations belong to (`"step 3"`).
    pub fn set_phase(&self, phase: impl Into<String>) {
        self.inner.borrow_mut().phase = phase.into();
    }

    /// Waits for all work submitted to the device.
    #[track_caller]
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        let mut inner = self.inner.borrow_mut();
        inner.enter("synchronize")?;
        let result = inner.device.synchronize();
        inner.leave();
        result
    }

    // ---- the allocator ----

    /// `torch.cuda.memory_allocated()`.
    pub fn memory_allocated(&self) -> u64 {
        self.inner.borrow().device.allocator().memory_allocated()
    }

    /// `torch.cuda.memory_reserved()`.
    pub fn memory_reserved(&self) -> u64 {
        self.inner.borrow().device.allocator().memory_reserved()
    }

    /// `torch.cuda.memory_stats()`.
    pub fn stats(&self) -> MemoryStats {
        self.inner.borrow().device.allocator().stats()
    }

    /// `torch.cuda.memory_summary()`.
    pub fn memory_summary(&self, abbreviated: bool) -> String {
        self.inner.borrow().device.allocator().memory_summary(abbreviated)
    }

    /// `torch.cuda.empty_cache()`.
    #[track_caller]
    pub fn empty_cache(&self) -> Result<(), RuntimeError> {
        let mut inner = self.inner.borrow_mut();
        inner.enter("empty_cache")?;
        let result = inner.device.empty_cache();
        inner.leave();
        result
    }

    /// Records `memory_allocated()` / `memory_reserved()` under `label`, as
    /// `torch.cuda.memory_allocated()` would read there. Reports a failed free of a dropped
    /// tensor first.
    #[track_caller]
    pub fn mark(&self, label: impl Into<String>) -> Result<(), RuntimeError> {
        let mut inner = self.inner.borrow_mut();
        inner.enter("mark")?;
        inner.leave();
        inner.device.allocator_mut().mark(label.into());
        // A mark is where a reader looks: the watcher sees it at once.
        let Inner { watcher, device, .. } = &mut *inner;
        if let Some(watcher) = watcher {
            watcher.deliver(device.allocator());
        }
        Ok(())
    }

    /// The marks so far.
    pub fn marks(&self) -> Vec<Mark> {
        self.inner.borrow().device.allocator().marks().to_vec()
    }

    /// The allocator's trace so far.
    pub fn trace(&self) -> Vec<TraceEntry> {
        self.inner.borrow().device.allocator().trace()
    }

    /// Records a named duration (time per step).
    pub fn record_time(&self, label: impl Into<String>, elapsed: Duration) {
        self.inner.borrow_mut().timings.push(Timing { label: label.into(), seconds: elapsed.as_secs_f64() });
    }

    /// The durations recorded so far.
    pub fn timings(&self) -> Vec<Timing> {
        self.inner.borrow().timings.clone()
    }

    /// Adds a note to the run's report (e.g. a limit that changed how an operation ran).
    pub fn note(&self, note: impl Into<String>) {
        self.inner.borrow_mut().notes.push(note.into());
    }

    /// The notes so far: the experiment's, then the device's.
    pub fn notes(&self) -> Vec<String> {
        let inner = self.inner.borrow();
        inner.notes.iter().cloned().chain(inner.device.notes()).collect()
    }

    /// A snapshot of the allocator (state, trace, stats, marks) with the recorded timings.
    pub fn snapshot(&self, source: &str) -> Snapshot {
        let inner = self.inner.borrow();
        let mut snapshot = Snapshot::capture(inner.device.allocator(), source);
        snapshot.timings = inner.timings.clone();
        snapshot
    }

    /// Ends a run: reports failed frees of dropped tensors, waits for the device and completes
    /// the frees still waiting for it (so the final state and summary show no pending frees; on
    /// queue-ordered devices these are the last `free_completed` entries of the trace), and
    /// checks the allocator's invariants.
    #[track_caller]
    pub fn finish(&self) -> Result<(), RuntimeError> {
        let mut inner = self.inner.borrow_mut();
        inner.enter("finish")?;
        let settled = inner.device.synchronize();
        inner.leave();
        settled?;
        inner.device.allocator_mut().process_events()?;
        inner.device.allocator().check_consistency().map_err(RuntimeError::Check)
    }

    // ---- creating and reading tensors ----

    fn wrap(&self, allocation: Allocation, shape: Vec<usize>, dtype: DType) -> Tensor {
        Tensor { inner: Rc::clone(&self.inner), allocation, shape, dtype }
    }

    fn check_owner(&self, tensors: &[&Tensor]) -> Result<(), RuntimeError> {
        if tensors.iter().all(|t| Rc::ptr_eq(&t.inner, &self.inner)) {
            Ok(())
        } else {
            Err(RuntimeError::Shape("a tensor of another runtime was passed".into()))
        }
    }

    /// `torch.empty(shape)`: uninitialised f32.
    #[track_caller]
    pub fn empty(&self, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        self.empty_typed(shape, DType::F32)
    }

    #[track_caller]
    fn empty_typed(&self, shape: &[usize], dtype: DType) -> Result<Tensor, RuntimeError> {
        let mut inner = self.inner.borrow_mut();
        inner.enter("empty")?;
        let result = inner.alloc(numel(shape) * 4);
        inner.leave();
        drop(inner);
        Ok(self.wrap(result?, shape.to_vec(), dtype))
    }

    /// `torch.full(shape, value)` on the device.
    #[track_caller]
    pub fn full(&self, shape: &[usize], value: f32) -> Result<Tensor, RuntimeError> {
        let n = numel(shape);
        let allocation = self.filled("full", n * 4, |device, a| device.fill(a, n, value))?;
        Ok(self.wrap(allocation, shape.to_vec(), DType::F32))
    }

    /// Allocates `bytes` inside `op` and writes them with `write`; if the write fails, the block
    /// is freed again and the error returned.
    #[track_caller]
    fn filled(
        &self,
        op: &'static str,
        bytes: u64,
        write: impl FnOnce(&mut dyn Device, &Allocation) -> Result<(), RuntimeError>,
    ) -> Result<Allocation, RuntimeError> {
        let mut inner = self.inner.borrow_mut();
        inner.enter(op)?;
        let result =
            inner.alloc(bytes).and_then(|a| match inner.uses(&[&a]).and_then(|_| write(inner.device.as_mut(), &a)) {
                Ok(()) => Ok(a),
                Err(e) => {
                    inner.discard([a]);
                    Err(e)
                }
            });
        inner.leave();
        result
    }

    /// `torch.zeros(shape)` on the device.
    #[track_caller]
    pub fn zeros(&self, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        self.full(shape, 0.0)
    }

    /// A tensor of host data (`torch.tensor(data).to(device)`).
    #[track_caller]
    pub fn from_f32(&self, shape: &[usize], data: &[f32]) -> Result<Tensor, RuntimeError> {
        let words: Vec<u32> = data.iter().map(|v| v.to_bits()).collect();
        self.upload(shape, &words, DType::F32)
    }

    /// A u32 tensor of host data (class targets).
    #[track_caller]
    pub fn from_u32(&self, shape: &[usize], data: &[u32]) -> Result<Tensor, RuntimeError> {
        self.upload(shape, data, DType::U32)
    }

    #[track_caller]
    fn upload(&self, shape: &[usize], words: &[u32], dtype: DType) -> Result<Tensor, RuntimeError> {
        if numel(shape) != words.len() as u64 {
            return Err(RuntimeError::Shape(format!("{} values for shape {shape:?}", words.len())));
        }
        let allocation = self.filled("to_device", words.len() as u64 * 4, |device, a| device.upload(a, words))?;
        Ok(self.wrap(allocation, shape.to_vec(), dtype))
    }

    /// Reads an f32 tensor back (after the work queued before). An allocation-only simulation
    /// reads zeros.
    #[track_caller]
    pub fn to_vec(&self, t: &Tensor) -> Result<Vec<f32>, RuntimeError> {
        Ok(self.read_words(t)?.into_iter().map(f32::from_bits).collect())
    }

    /// Reads a u32 tensor back.
    #[track_caller]
    pub fn to_vec_u32(&self, t: &Tensor) -> Result<Vec<u32>, RuntimeError> {
        self.read_words(t)
    }

    /// Reads the first `count` f32 values of a tensor back.
    #[track_caller]
    pub fn to_vec_prefix(&self, t: &Tensor, count: usize) -> Result<Vec<f32>, RuntimeError> {
        Ok(self.read_prefix(t, count)?.into_iter().map(f32::from_bits).collect())
    }

    #[track_caller]
    fn read_words(&self, t: &Tensor) -> Result<Vec<u32>, RuntimeError> {
        self.read_prefix(t, t.numel() as usize)
    }

    #[track_caller]
    fn read_prefix(&self, t: &Tensor, count: usize) -> Result<Vec<u32>, RuntimeError> {
        self.check_owner(&[t])?;
        let count = count.min(t.numel() as usize);
        let mut inner = self.inner.borrow_mut();
        inner.enter("to_host")?;
        let result = inner.uses(&[&t.allocation]).and_then(|_| inner.device.read(&t.allocation, count));
        inner.leave();
        result
    }

    /// [`Runtime::to_vec`] without blocking: the copy is queued now (recorded as the same
    /// `to_host` use), and the values arrive when the device has made them. What the browser
    /// needs, where nothing may wait on the page's thread; on other devices the future is
    /// ready at once.
    pub async fn read_f32(&self, t: &Tensor) -> Result<Vec<f32>, RuntimeError> {
        self.read_f32_prefix(t, t.numel() as usize).await
    }

    /// [`Runtime::to_vec_prefix`] without blocking (see [`Runtime::read_f32`]).
    pub async fn read_f32_prefix(&self, t: &Tensor, count: usize) -> Result<Vec<f32>, RuntimeError> {
        let pending = self.read_prefix_later(t, count)?;
        // No borrow of the runtime is held across the wait: the page may look at the
        // allocator (draw the live run) meanwhile.
        Ok(pending.await?.into_iter().map(f32::from_bits).collect())
    }

    fn read_prefix_later(&self, t: &Tensor, count: usize) -> Result<PendingRead, RuntimeError> {
        self.check_owner(&[t])?;
        let count = count.min(t.numel() as usize);
        let mut inner = self.inner.borrow_mut();
        inner.enter("to_host")?;
        let result = inner.uses(&[&t.allocation]).and_then(|_| inner.device.read_later(&t.allocation, count));
        inner.leave();
        result
    }

    /// Lets whoever polls the experiment's future run other work (the browser draws a frame)
    /// before the experiment goes on: a future that is pending once. Experiments call it
    /// between steps that read nothing back, so a page stays responsive; when blocked on
    /// natively it costs one poll.
    pub async fn yield_now(&self) {
        yield_now().await
    }

    /// Runs `f` with the device's allocator (to read what it recorded while the experiment
    /// runs, as a live view does). Not to be called from inside an operation.
    pub fn with_allocator<R>(&self, f: impl FnOnce(&mut dyn cachalot_core::Allocator) -> R) -> R {
        f(self.inner.borrow_mut().device.allocator_mut())
    }

    /// `x.fill_(value)`.
    #[track_caller]
    pub fn fill(&self, x: &Tensor, value: f32) -> Result<(), RuntimeError> {
        self.check_owner(&[x])?;
        self.in_place("fill_", &[&x.allocation], |d| d.fill(&x.allocation, x.numel(), value))
    }

    /// Runs an operation that allocates nothing.
    #[track_caller]
    fn in_place(
        &self,
        op: &'static str,
        operands: &[&Allocation],
        f: impl FnOnce(&mut dyn Device) -> Result<(), RuntimeError>,
    ) -> Result<(), RuntimeError> {
        let mut inner = self.inner.borrow_mut();
        inner.enter(op)?;
        let result = inner.uses(operands).and_then(|_| f(inner.device.as_mut()));
        inner.leave();
        result
    }

    /// Allocates the outputs (`bytes` each, in order), records the uses of `inputs` and the
    /// outputs, and runs `f`; frees the outputs if anything fails.
    #[track_caller]
    fn with_outputs(
        &self,
        op: &'static str,
        bytes: &[u64],
        inputs: &[&Allocation],
        f: impl FnOnce(&mut Inner, &[Allocation]) -> Result<(), RuntimeError>,
    ) -> Result<Vec<Allocation>, RuntimeError> {
        let mut inner = self.inner.borrow_mut();
        inner.enter(op)?;
        let mut outputs = Vec::with_capacity(bytes.len());
        let mut result = Ok(());
        for &b in bytes {
            match inner.alloc(b) {
                Ok(a) => outputs.push(a),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if result.is_ok() {
            let operands: Vec<&Allocation> = inputs.iter().copied().chain(outputs.iter()).collect();
            result = inner.uses(&operands).and_then(|_| f(&mut inner, &outputs));
        }
        if let Err(e) = result {
            inner.discard(outputs);
            inner.leave();
            return Err(e);
        }
        inner.leave();
        Ok(outputs)
    }

    fn one(&self, mut outputs: Vec<Allocation>, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        let a = outputs.pop().ok_or_else(|| RuntimeError::Shape("an operation made no output".into()))?;
        Ok(self.wrap(a, shape.to_vec(), DType::F32))
    }

    // ---- operations ----

    /// `alpha * x`, a new tensor.
    #[track_caller]
    pub fn scale(&self, x: &Tensor, alpha: f32) -> Result<Tensor, RuntimeError> {
        self.check_owner(&[x])?;
        let n = x.numel();
        let out = self.with_outputs("mul", &[n * 4], &[&x.allocation], |inner, o| {
            inner.device.scale(&x.allocation, &o[0], alpha, n)
        })?;
        self.one(out, x.shape())
    }

    /// `torch.mean(x)`: a 0-d tensor. Allocates what PyTorch's reduction does — the result,
    /// a 2,112-byte staging block and a 4-byte semaphore (zeroed) — and frees the last two.
    #[track_caller]
    pub fn mean(&self, x: &Tensor) -> Result<Tensor, RuntimeError> {
        self.check_owner(&[x])?;
        let n = x.numel();
        let mut outputs = self.with_outputs("mean", &[4, 2112, 4], &[&x.allocation], |inner, o| {
            let (out, staging, semaphore) = (&o[0], &o[1], &o[2]);
            inner.device.fill_u32(semaphore, 1, 0)?;
            inner.device.mean(Mean { x: &x.allocation, staging, out, n })
        })?;
        let mut inner = self.inner.borrow_mut();
        for a in [outputs.pop(), outputs.pop()].into_iter().flatten() {
            if let Err(e) = inner.device.free(a) {
                inner.deferred.push(e);
            }
        }
        drop(inner);
        self.one(outputs, &[])
    }

    /// `op(a) · op(b)` with the layouts of `shape`, a new `[m, n]` tensor.
    #[track_caller]
    pub fn matmul(&self, a: &Tensor, b: &Tensor, shape: MatmulShape) -> Result<Tensor, RuntimeError> {
        self.check_owner(&[a, b])?;
        let (ea, eb, ec) = shape.elements();
        if a.numel() != ea || b.numel() != eb {
            return Err(RuntimeError::Shape(format!(
                "{shape:?} needs {ea} and {eb} elements, the operands have {} and {}",
                a.numel(),
                b.numel()
            )));
        }
        let out = self.with_outputs("matmul", &[ec * 4], &[&a.allocation, &b.allocation], |inner, o| {
            inner.within(WORKSPACE_FRAME, "matmul", |d| {
                d.matmul(Matmul::new(&a.allocation, &b.allocation, &o[0], shape))
            })
        })?;
        self.one(out, &[shape.m as usize, shape.n as usize])
    }

    /// `nn.Linear` forward: `x[batch, in] · w[out, in]ᵀ + b[out]`, a new `[batch, out]`
    /// tensor (output first, then — on CUDA, first time — the workspaces, as in PyTorch).
    #[track_caller]
    pub fn linear(&self, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor, RuntimeError> {
        self.check_owner(&[x, w])?;
        let (batch, inputs) = x.dims2("linear input")?;
        let (outputs, w_in) = w.dims2("linear weight")?;
        if w_in != inputs || b.is_some_and(|b| b.numel() != outputs as u64) {
            return Err(RuntimeError::Shape(format!(
                "linear: input {:?}, weight {:?}, bias {:?}",
                x.shape,
                w.shape,
                b.map(|b| b.shape.clone())
            )));
        }
        let mut operands = vec![&x.allocation, &w.allocation];
        if let Some(b) = b {
            self.check_owner(&[b])?;
            operands.push(&b.allocation);
        }
        let shape = MatmulShape::nt(batch, outputs, inputs);
        let bytes = batch as u64 * outputs as u64 * 4;
        let out = self.with_outputs("linear", &[bytes], &operands, |inner, o| {
            inner.within(WORKSPACE_FRAME, "linear", |d| {
                let bias = b.map(|b| &b.allocation);
                d.matmul(Matmul { bias, ..Matmul::new(&x.allocation, &w.allocation, &o[0], shape) })
            })
        })?;
        self.one(out, &[batch as usize, outputs as usize])
    }

    /// `nn.Linear` backward from `dy[batch, out]`: `dx = dy · w` (if `need_dx`),
    /// `dw = dyᵀ · x`, `db = Σ_batch dy` (if `bias`), allocated and computed in that order.
    #[track_caller]
    pub fn linear_backward(
        &self,
        x: &Tensor,
        w: &Tensor,
        dy: &Tensor,
        need_dx: bool,
        bias: bool,
    ) -> Result<LinearGrads, RuntimeError> {
        self.check_owner(&[x, w, dy])?;
        let (batch, inputs) = x.dims2("linear input")?;
        let (outputs, w_in) = w.dims2("linear weight")?;
        if w_in != inputs || dy.shape() != [batch as usize, outputs as usize] {
            return Err(RuntimeError::Shape(format!(
                "linear backward: input {:?}, weight {:?}, grad {:?}",
                x.shape, w.shape, dy.shape
            )));
        }
        let dx = if need_dx {
            let bytes = batch as u64 * inputs as u64 * 4;
            let out =
                self.with_outputs("linear_backward", &[bytes], &[&dy.allocation, &w.allocation], |inner, o| {
                    inner.within(WORKSPACE_FRAME, "linear_backward", |d| {
                        d.matmul(Matmul::new(
                            &dy.allocation,
                            &w.allocation,
                            &o[0],
                            MatmulShape::nn(batch, inputs, outputs),
                        ))
                    })
                })?;
            Some(self.one(out, x.shape())?)
        } else {
            None
        };
        let bytes = outputs as u64 * inputs as u64 * 4;
        let out = self.with_outputs("linear_backward", &[bytes], &[&dy.allocation, &x.allocation], |inner, o| {
            inner.within(WORKSPACE_FRAME, "linear_backward", |d| {
                d.matmul(Matmul::new(&dy.allocation, &x.allocation, &o[0], MatmulShape::tn(outputs, inputs, batch)))
            })
        })?;
        let dw = self.one(out, w.shape())?;
        let db = if bias {
            let out = self.with_outputs("linear_backward", &[outputs as u64 * 4], &[&dy.allocation], |inner, o| {
                let sums = SumRows { x: &dy.allocation, out: &o[0], rows: batch, cols: outputs, accumulate: false };
                inner.device.sum_rows(sums)
            })?;
            Some(self.one(out, &[outputs as usize])?)
        } else {
            None
        };
        Ok(LinearGrads { dx, dw, db })
    }

    /// `act(x)`, a new tensor.
    #[track_caller]
    pub fn activation(&self, act: Activation, x: &Tensor) -> Result<Tensor, RuntimeError> {
        self.check_owner(&[x])?;
        let n = x.numel();
        let out = self.with_outputs(act.name(), &[n * 4], &[&x.allocation], |inner, o| {
            inner.device.activation(ActivationForward { act, x: &x.allocation, y: &o[0], n })
        })?;
        self.one(out, x.shape())
    }

    /// The gradient of `act` at `x` times `dy`, a new tensor.
    #[track_caller]
    pub fn activation_backward(&self, act: Activation, x: &Tensor, dy: &Tensor) -> Result<Tensor, RuntimeError> {
        self.check_owner(&[x, dy])?;
        let n = x.numel();
        if dy.numel() != n {
            return Err(RuntimeError::Shape(format!("activation backward: {:?} and {:?}", x.shape, dy.shape)));
        }
        let out = self.with_outputs(act.backward_entry(), &[n * 4], &[&x.allocation, &dy.allocation], |inner, o| {
            inner.device.activation_backward(ActivationBackward {
                act,
                x: &x.allocation,
                dy: &dy.allocation,
                dx: &o[0],
                n,
            })
        })?;
        self.one(out, x.shape())
    }

    /// Mean squared error: `(loss, d loss / d pred)` (the loss a 0-d tensor).
    #[track_caller]
    pub fn mse(&self, pred: &Tensor, target: &Tensor) -> Result<(Tensor, Tensor), RuntimeError> {
        self.check_owner(&[pred, target])?;
        let n = pred.numel();
        if target.numel() != n {
            return Err(RuntimeError::Shape(format!("mse: {:?} and {:?}", pred.shape, target.shape)));
        }
        let mut out = self.with_outputs("mse", &[4, n * 4], &[&pred.allocation, &target.allocation], |inner, o| {
            inner.device.mse(Mse {
                pred: &pred.allocation,
                target: &target.allocation,
                loss: &o[0],
                grad: Some(&o[1]),
                n,
            })
        })?;
        let grad = self.one(out.pop().into_iter().collect(), pred.shape())?;
        let loss = self.one(out, &[])?;
        Ok((loss, grad))
    }

    /// Softmax cross-entropy of `logits[rows, classes]` against u32 `targets[rows]`, mean over
    /// rows: `(loss, d loss / d logits)`.
    #[track_caller]
    pub fn cross_entropy(&self, logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor), RuntimeError> {
        self.check_owner(&[logits, targets])?;
        let (rows, cols) = logits.dims2("logits")?;
        if targets.numel() != rows as u64 || targets.dtype != DType::U32 {
            return Err(RuntimeError::Shape(format!(
                "cross_entropy: {rows} rows of logits, targets {:?} of {:?}",
                targets.shape, targets.dtype
            )));
        }
        let elements = rows as u64 * cols as u64;
        let mut out = self.with_outputs(
            "cross_entropy",
            &[4, elements * 4],
            &[&logits.allocation, &targets.allocation],
            |inner, o| {
                inner.within(SCRATCH_FRAME, "cross_entropy", |d| {
                    let (logits, targets) = (&logits.allocation, &targets.allocation);
                    d.cross_entropy(CrossEntropy { logits, targets, loss: &o[0], grad: &o[1], rows, cols })
                })
            },
        )?;
        let grad = self.one(out.pop().into_iter().collect(), logits.shape())?;
        let loss = self.one(out, &[])?;
        Ok((loss, grad))
    }

    /// One `torch.optim.SGD` step on `param` in place (`momentum` buffer when
    /// `sgd.momentum != 0`; `first_step` initialises it).
    #[track_caller]
    pub fn sgd_step(
        &self,
        param: &Tensor,
        grad: &Tensor,
        momentum: Option<&Tensor>,
        sgd: Sgd,
        first_step: bool,
    ) -> Result<(), RuntimeError> {
        self.check_owner(&[param, grad])?;
        let n = param.numel();
        let mut operands = vec![&param.allocation, &grad.allocation];
        if let Some(m) = momentum {
            self.check_owner(&[m])?;
            operands.push(&m.allocation);
        }
        self.in_place("sgd_step", &operands, |d| {
            let momentum = momentum.map(|m| &m.allocation);
            d.sgd_step(SgdStep { param: &param.allocation, grad: &grad.allocation, momentum, n, sgd, first_step })
        })
    }

    /// One `torch.optim.Adam` step (`step` from 1) on `param` in place.
    #[track_caller]
    pub fn adam_step(
        &self,
        param: &Tensor,
        grad: &Tensor,
        exp_avg: &Tensor,
        exp_avg_sq: &Tensor,
        adam: Adam,
        step: u32,
    ) -> Result<(), RuntimeError> {
        self.check_owner(&[param, grad, exp_avg, exp_avg_sq])?;
        let n = param.numel();
        let operands = [&param.allocation, &grad.allocation, &exp_avg.allocation, &exp_avg_sq.allocation];
        self.in_place("adam_step", &operands, |d| {
            let (param, grad) = (&param.allocation, &grad.allocation);
            let (exp_avg, exp_avg_sq) = (&exp_avg.allocation, &exp_avg_sq.allocation);
            d.adam_step(AdamStep { param, grad, exp_avg, exp_avg_sq, n, adam, step })
        })
    }

    /// A block of `bytes` bytes with no kernel use (an op file's allocation).
    #[track_caller]
    pub fn raw(&self, bytes: u64) -> Result<Tensor, RuntimeError> {
        let mut inner = self.inner.borrow_mut();
        inner.enter("allocate")?;
        let result = inner.alloc(bytes);
        inner.leave();
        drop(inner);
        Ok(self.wrap(result?, vec![bytes.div_ceil(4) as usize], DType::U32))
    }
}

/// A future that is pending once (waking its task at once) and then ready: whoever polls it
/// runs other work in between (the browser's page draws a frame). Blocked on natively, it
/// costs one poll.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await
}
