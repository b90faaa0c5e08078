//! `Registry`: one caching allocator per device, made on the first request for that device,
//! each behind its own mutex (PyTorch calls from many threads: autograd runs backward on its
//! own, DataLoader pin threads and NCCL watchdogs allocate too).
//!
//! PyTorch gives the allocator a pointer and gets a pointer back; the registry keeps, per
//! device, the live [`Allocation`] handle of each pointer it handed out, so `free` and
//! `record_stream` find their block. Every failure is an error value naming what failed; the
//! C ABI (`crate::abi`) turns them into a null pointer plus a message.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use cachalot_core::backend::Segments as _;
use cachalot_core::error::{OOM_CAUSE_LINE, format_size};
use cachalot_core::trace::TraceAction;
use cachalot_core::{
    Allocation, AllocatorConfig, AllocatorError, CachingAllocator, ContextId, Frame, PoolCheckpoint, PoolFilter,
    PoolId, SimBackend, StreamId,
};
use cachalot_trace::explain::cause_at_error;
use cachalot_trace::snapshot::pickle::write_snapshot;
use cachalot_trace::snapshot::torch::{TorchAllocatorSettings, TorchSegment, TorchSnapshot};
use rustc_hash::FxHashMap;

use crate::backend::DeviceBackend;

/// Device ordinals the registry serves (`0..MAX_DEVICES`).
pub const MAX_DEVICES: usize = 64;

/// Which device the allocators drive.
#[derive(Clone, Debug, PartialEq)]
pub enum DeviceKind {
    /// The CUDA device of the same ordinal, through `cachalot-cuda`.
    Cuda,
    /// A simulated device of `capacity` bytes per ordinal (tests; machines without a GPU).
    Simulator {
        /// Total memory of each simulated device.
        capacity: u64,
    },
}

/// The memory history settings (`torch.cuda.memory._record_memory_history`).
#[derive(Clone, Debug, PartialEq)]
pub struct History {
    /// Ring-buffer length.
    pub max_entries: usize,
    /// Actions not recorded.
    pub skip: Vec<TraceAction>,
    /// Which calls record the caller's stack (PyTorch's `context` with `stacks="python"`).
    pub stacks: Stacks,
}

/// Which calls record the caller's stack in the history and in the snapshot's blocks, as
/// PyTorch's `_record_memory_history(context=...)`: the stack comes from the
/// [`StackSource`] (the Python package's: the calling thread's Python frames).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Stacks {
    /// No stacks (`context=None`).
    #[default]
    Off = 0,
    /// Allocations record their stack; their frees report it too (`context="alloc"` or
    /// `"state"`).
    Alloc = 1,
    /// Allocations and frees record their own stacks (`context="all"`).
    All = 2,
}

/// Gathers the calling thread's stack, innermost frame first (empty where the thread has none,
/// e.g. autograd's backward thread). Called outside every device lock.
pub type StackSource = fn() -> Vec<Frame>;

/// What every allocator made from now on starts with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The allocator configuration (`PYTORCH_CUDA_ALLOC_CONF` syntax).
    pub config: AllocatorConfig,
    /// The device behind the allocators.
    pub device: DeviceKind,
    /// History recording, applied to devices made later too (PyTorch records on all devices).
    pub history: Option<History>,
    /// Where to write a PyTorch snapshot pickle when an allocation runs out of memory.
    pub oom_snapshot: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { config: AllocatorConfig::default(), device: DeviceKind::Cuda, history: None, oom_snapshot: None }
    }
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    /// The allocation cannot be met: PyTorch's out-of-memory message.
    OutOfMemory(String),
    /// Anything else (no device, a bad pointer, a driver error), in words.
    Error(String),
}

impl Failure {
    /// The message.
    pub fn message(&self) -> &str {
        match self {
            Failure::OutOfMemory(m) | Failure::Error(m) => m,
        }
    }
}

/// PyTorch's filter of the requests a private pool serves while allocations are routed to it
/// (`beginAllocateToPool`'s `std::function<bool(cudaStream_t)>`: the streams of one graph
/// capture, or the thread inside `use_mem_pool`). Asked on the allocating thread, under the
/// device's lock, before each request while the pool is routed to.
pub type CallerFilter = Box<dyn Fn(StreamId) -> bool + Send>;

/// What a restore of a pool's checkpoint changed for PyTorch (its `CheckpointDelta`); a pointer
/// may be in both lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoredPool {
    /// Pointers freed: PyTorch no longer owns them.
    pub freed: Vec<u64>,
    /// Pointers handed out, each with its block size and stream, in the checkpoint's order.
    pub allocated: Vec<(u64, u64, StreamId)>,
}

/// One device's allocator and the handles of the pointers it handed out.
pub struct DeviceState {
    /// The allocator.
    pub allocator: CachingAllocator<DeviceBackend>,
    live: FxHashMap<u64, Allocation>,
    /// The pools routed to with PyTorch's own filters, oldest first, as the allocator routes
    /// them ([`PoolFilter::Caller`]).
    filters: Vec<(PoolId, CallerFilter)>,
    /// Checkpoints of private pools PyTorch holds (`getCheckpointState`), by handle, until it
    /// drops them.
    checkpoints: FxHashMap<u64, PoolCheckpoint>,
    /// The handle the next checkpoint gets (0 is never one).
    next_checkpoint: u64,
}

impl DeviceState {
    /// Number of pointers handed out and not freed.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }
}

type Slot = Result<Mutex<DeviceState>, String>;

/// The message of an allocation refused because its stream is being captured into a CUDA graph.
pub const CAPTURE_ERROR: &str = "an allocation on a stream that is capturing a CUDA graph, without the C++ shim's \
private-pool hooks (cachalot_torch.enable(shim=False)): graph capture allocates into a private memory pool, which \
PyTorch announces only to C++. Enable cachalot with its shim (the default), or capture with PyTorch's own allocator";

/// Refuses an allocation on a stream under CUDA graph capture. PyTorch's allocator serves it
/// from the capture's private pool, kept for the graph's replays; memory from the default pools
/// would be reused under the graph. Asked of the stream itself on every allocation, so every
/// way a capture can begin is caught (`torch.cuda.graph`, `CUDAGraph.capture_begin` without
/// Python's guard, a capture begun from C++).
fn refuse_capture(state: &DeviceState, size: u64, device: usize, stream: StreamId) -> Result<(), Failure> {
    match state.allocator.backend().capture_status(stream) {
        Ok(false) => Ok(()),
        Ok(true) => Err(Failure::Error(format!(
            "allocation of {size} bytes on device {device}, stream {:#x}: {CAPTURE_ERROR}",
            stream.0
        ))),
        Err(e) => Err(Failure::Error(format!(
            "allocation of {size} bytes on device {device}: cannot ask whether stream {:#x} is \
             capturing a CUDA graph: {e}",
            stream.0
        ))),
    }
}

/// The allocators of all devices.
pub struct Registry {
    slots: Vec<OnceLock<Slot>>,
    settings: Mutex<Settings>,
    /// [`Stacks`] of the history now on, read on every allocation without a lock.
    stacks: AtomicU8,
    stack_source: OnceLock<StackSource>,
    /// Whether PyTorch's private-pool hooks reach the allocator (the C++ shim installs them).
    /// Without them a graph capture would allocate from the default pools, so an allocation
    /// on a capturing stream is refused instead.
    pool_hooks: AtomicBool,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new(Settings::default())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic under the lock (caught at the C ABI) leaves the allocator as consistent as any
    // error does: keep serving.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Registry {
    /// A registry whose devices will start with `settings`.
    pub fn new(settings: Settings) -> Self {
        let stacks = settings.history.as_ref().map_or(Stacks::Off, |h| h.stacks);
        Registry {
            slots: (0..MAX_DEVICES).map(|_| OnceLock::new()).collect(),
            settings: Mutex::new(settings),
            stacks: AtomicU8::new(stacks as u8),
            stack_source: OnceLock::new(),
            pool_hooks: AtomicBool::new(false),
        }
    }

    /// Sets where stacks come from when the history records them (once; later calls are
    /// ignored). Without one, no stacks are recorded.
    pub fn set_stack_source(&self, source: StackSource) {
        let _ = self.stack_source.set(source);
    }

    /// The caller's stack, if the history records stacks for calls of kind `at_least`.
    fn gather_stack(&self, at_least: Stacks) -> Option<Vec<Frame>> {
        let recording = self.stacks.load(Ordering::Relaxed);
        if recording == Stacks::Off as u8 || recording < at_least as u8 {
            return None;
        }
        self.stack_source.get().map(|source| source())
    }

    /// The settings devices made from now on start with.
    pub fn settings(&self) -> Settings {
        lock(&self.settings).clone()
    }

    /// Replaces the settings. Devices already made keep their configuration and backend; the
    /// history and OOM-snapshot settings apply to all.
    pub fn configure(&self, settings: Settings) {
        let stacks = settings.history.as_ref().map_or(Stacks::Off, |h| h.stacks);
        *lock(&self.settings) = settings;
        self.stacks.store(stacks as u8, Ordering::Relaxed);
    }

    /// Device `device`'s allocator, made now if this is the first request for it.
    pub fn device(&self, device: usize) -> Result<&Mutex<DeviceState>, Failure> {
        let slot = self.slots.get(device).ok_or_else(|| {
            Failure::Error(format!("device {device} is beyond the {MAX_DEVICES} devices cachalot_torch serves"))
        })?;
        slot.get_or_init(|| self.make_device(device).map(Mutex::new)).as_ref().map_err(|e| Failure::Error(e.clone()))
    }

    fn make_device(&self, device: usize) -> Result<DeviceState, String> {
        let settings = self.settings();
        let backend = match settings.device {
            DeviceKind::Cuda => {
                DeviceBackend::cuda(device).map_err(|e| format!("CUDA device {device} is not usable: {e}"))?
            }
            DeviceKind::Simulator { capacity } => DeviceBackend::Sim(SimBackend::new(capacity)),
        };
        let mut allocator = CachingAllocator::new(backend, settings.config.clone())
            .map_err(|e| format!("cannot make the allocator of device {device}: {e}"))?;
        if let Some(history) = &settings.history {
            allocator.record_history(true, history.max_entries, &history.skip, false);
        }
        Ok(DeviceState {
            allocator,
            live: FxHashMap::default(),
            filters: Vec::new(),
            checkpoints: FxHashMap::default(),
            next_checkpoint: 1,
        })
    }

    /// The devices made so far, in ordinal order.
    pub fn devices(&self) -> impl Iterator<Item = (usize, &Mutex<DeviceState>)> {
        self.slots.iter().enumerate().filter_map(|(i, slot)| match slot.get() {
            Some(Ok(state)) => Some((i, state)),
            _ => None,
        })
    }

    /// Runs `f` on device `device`'s state (made now if needed), under its lock.
    pub fn with_device<R>(&self, device: usize, f: impl FnOnce(&mut DeviceState) -> R) -> Result<R, Failure> {
        let state = self.device(device)?;
        Ok(f(&mut lock(state)))
    }

    /// `alloc(size, device, stream)`: a device pointer of at least `size` bytes for use on
    /// `stream`. A zero-byte request is the null pointer, as PyTorch's allocator answers it,
    /// without touching the allocator.
    pub fn alloc(&self, size: u64, device: usize, stream: StreamId) -> Result<u64, Failure> {
        if size == 0 {
            return Ok(0);
        }
        // Gathered before the device lock: the stack source takes the GIL, and a thread holding
        // the GIL may be waiting for this lock (memory_stats from Python).
        let stack = self.gather_stack(Stacks::Alloc);
        let result = {
            let mut state = lock(self.device(device)?);
            if !self.pool_hooks.load(Ordering::Relaxed) {
                refuse_capture(&state, size, device, stream)?;
            }
            if !state.filters.is_empty() {
                // `get_pool`: the pool routed to last whose filter accepts the request.
                let route = state.filters.iter().rev().find(|(_, accepts)| accepts(stream)).map(|&(pool, _)| pool);
                state.allocator.set_caller_route(route);
            }
            let context = stack.map(|frames| state.allocator.intern_context(&frames));
            state.allocator.set_context(context);
            let result = state.allocator.malloc(size, stream);
            state.allocator.set_context(None);
            match result {
                Ok(allocation) => {
                    state.live.insert(allocation.address(), allocation);
                    Ok(allocation.address())
                }
                Err(AllocatorError::OutOfMemory(oom)) => {
                    // While the allocator is as the error left it.
                    let cause = cause_at_error(&state.allocator, &oom, stream, format_size);
                    Err((AllocatorError::OutOfMemory(oom), Some(cause)))
                }
                Err(error) => Err((error, None)),
            }
        };
        match result {
            Ok(address) => Ok(address),
            Err((AllocatorError::OutOfMemory(oom), cause)) => {
                // Outside the device lock: the snapshot takes every device's lock in turn.
                let snapshot = self.write_oom_snapshot();
                Err(Failure::OutOfMemory(oom_message(&oom.message, cause.as_deref(), snapshot.as_deref())))
            }
            Err((other, _)) => {
                Err(Failure::Error(format!("allocation of {size} bytes on device {device} failed: {other}")))
            }
        }
    }

    /// `free(ptr, size, device, stream)`: returns a pointer from [`Registry::alloc`]. The block
    /// stays unusable until the work of every stream recorded on it (`record_stream`) is done.
    pub fn free(&self, address: u64, device: usize) -> Result<(), Failure> {
        if address == 0 {
            return Ok(());
        }
        let stack = self.gather_stack(Stacks::All);
        let mut state = lock(self.device(device)?);
        let allocation = state.live.remove(&address).ok_or_else(|| {
            Failure::Error(format!("free of {address:#x} on device {device}, which cachalot_torch did not hand out"))
        })?;
        let context = stack.map(|frames| state.allocator.intern_context(&frames));
        state.allocator.set_context(context);
        let result = state.allocator.free(allocation);
        state.allocator.set_context(None);
        result.map_err(|e| Failure::Error(format!("free of {address:#x} failed: {e}")))
    }

    /// `record_stream(ptr, stream)`: the block of `ptr` is also used on `stream`. PyTorch does
    /// not say which device the pointer is on, so each device made so far is asked.
    pub fn record_stream(&self, address: u64, stream: StreamId) -> Result<(), Failure> {
        if address == 0 {
            return Ok(());
        }
        for (_, state) in self.devices() {
            let mut state = lock(state);
            if let Some(allocation) = state.live.get(&address).copied() {
                return state
                    .allocator
                    .record_stream(&allocation, stream)
                    .map_err(|e| Failure::Error(format!("record_stream of {address:#x} failed: {e}")));
            }
        }
        Err(Failure::Error(format!("record_stream of {address:#x}, which cachalot_torch did not hand out")))
    }

    /// `empty_cache()` on every device made so far (PyTorch's `emptyCache` has no device).
    pub fn empty_cache(&self) -> Result<(), Failure> {
        for (device, state) in self.devices() {
            lock(state)
                .allocator
                .empty_cache()
                .map_err(|e| Failure::Error(format!("empty_cache on device {device} failed: {e}")))?;
        }
        Ok(())
    }

    /// Says that PyTorch's private-pool hooks reach the allocator from now on (the shim's
    /// `beginAllocateToPool` & co.): captures are routed to pools, no longer refused.
    pub fn enable_pool_hooks(&self) {
        self.pool_hooks.store(true, Ordering::Relaxed);
    }

    fn pool_call<R>(
        &self,
        device: usize,
        what: &str,
        pool: PoolId,
        call: impl FnOnce(&mut DeviceState) -> Result<R, AllocatorError>,
    ) -> Result<R, Failure> {
        self.with_device(device, call)?
            .map_err(|e| Failure::Error(format!("{what} of pool {pool} on device {device}: {e}")))
    }

    /// `createOrIncrefPool` (a `MemPool` made): pool `pool` exists with one more user.
    pub fn create_pool(&self, device: usize, pool: PoolId) -> Result<(), Failure> {
        self.pool_call(device, "createOrIncrefPool", pool, |state| state.allocator.create_pool(pool))
    }

    /// `beginAllocateToPool` (a graph capture beginning, `use_mem_pool` entered): the requests
    /// `filter` accepts are served from pool `pool`, which gains a user.
    pub fn begin_allocate_to_pool(&self, device: usize, pool: PoolId, filter: CallerFilter) -> Result<(), Failure> {
        self.pool_call(device, "beginAllocateToPool", pool, |state| {
            state.allocator.begin_allocate_to_pool(pool, PoolFilter::Caller)?;
            state.filters.push((pool, filter));
            Ok(())
        })
    }

    /// `endAllocateToPool` (a capture ended, `use_mem_pool` left): requests are no longer routed
    /// to pool `pool`. Its filter is dropped.
    pub fn end_allocate_to_pool(&self, device: usize, pool: PoolId) -> Result<(), Failure> {
        self.pool_call(device, "endAllocateToPool", pool, |state| {
            state.allocator.end_allocate_to_pool(pool)?;
            state.filters.retain(|(routed, _)| *routed != pool);
            if state.filters.is_empty() {
                state.allocator.set_caller_route(None);
            }
            Ok(())
        })
    }

    /// `releasePool` (a graph reset, a `MemPool` deleted, `use_mem_pool` left): one user fewer.
    pub fn release_pool(&self, device: usize, pool: PoolId) -> Result<(), Failure> {
        self.pool_call(device, "releasePool", pool, |state| state.allocator.release_pool(pool))
    }

    /// `emptyCache(mempool_id)` on every device made so far, as PyTorch's (it names no device):
    /// the default pools' `empty_cache` for `(0, 0)`, else that private pool's once released.
    pub fn empty_pool_cache(&self, pool: PoolId) -> Result<(), Failure> {
        for (device, state) in self.devices() {
            lock(state)
                .allocator
                .empty_pool_cache(pool)
                .map_err(|e| Failure::Error(format!("emptyCache of pool {pool} on device {device}: {e}")))?;
        }
        Ok(())
    }

    /// `getPoolUseCount`: the users of pool `pool`, 0 for a pool that does not exist.
    pub fn pool_use_count(&self, device: usize, pool: PoolId) -> Result<u32, Failure> {
        self.with_device(device, |state| {
            state.allocator.private_pools().into_iter().find(|&(id, _)| id == pool).map_or(0, |(_, users)| users)
        })
    }

    /// `checkPoolLiveAllocations`: whether the allocated blocks of pool `pool` are exactly the
    /// pointers `expected` (CUDA-graph trees ask before they reuse a pool's memory). A pool
    /// that does not exist holds none.
    pub fn pool_live_allocations_are(&self, device: usize, pool: PoolId, expected: &[u64]) -> Result<bool, Failure> {
        self.with_device(device, |state| {
            let live = state.allocator.pool_live_allocations(pool).unwrap_or_default();
            let mut expected = expected.to_vec();
            expected.sort_unstable();
            expected.dedup();
            live == expected
        })
    }

    /// `getCheckpointState` (CUDA-graph trees, after recording a graph): a checkpoint of pool
    /// `pool`, kept until [`Registry::drop_checkpoint`]; its handle, never 0.
    pub fn checkpoint_pool(&self, device: usize, pool: PoolId) -> Result<u64, Failure> {
        self.pool_call(device, "getCheckpointState", pool, |state| {
            let checkpoint = state.allocator.checkpoint_pool(pool)?;
            let handle = state.next_checkpoint;
            state.next_checkpoint += 1;
            state.checkpoints.insert(handle, checkpoint);
            Ok(handle)
        })
    }

    /// PyTorch dropped the checkpoint `handle` (its `AllocatorState` died).
    pub fn drop_checkpoint(&self, device: usize, handle: u64) -> Result<(), Failure> {
        self.with_device(device, |state| state.checkpoints.remove(&handle))?
            .map(|_| ())
            .ok_or_else(|| Failure::Error(format!("checkpoint {handle} of device {device} does not exist")))
    }

    /// `setCheckpointPoolState` (CUDA-graph trees, to record a graph off the current path): puts
    /// the pool of checkpoint `handle` back into its state. The pointers the pool's allocations
    /// had are no longer handed out; those of the blocks allocated at the checkpoint are, as
    /// if `alloc` had returned them.
    pub fn restore_pool(&self, device: usize, handle: u64) -> Result<RestoredPool, Failure> {
        self.with_device(device, |state| {
            let checkpoint = state
                .checkpoints
                .get(&handle)
                .cloned()
                .ok_or_else(|| Failure::Error(format!("checkpoint {handle} of device {device} does not exist")))?;
            let delta = state.allocator.restore_pool(&checkpoint).map_err(|e| {
                Failure::Error(format!("setCheckpointPoolState of pool {} on device {device}: {e}", checkpoint.pool))
            })?;
            for address in &delta.freed {
                state.live.remove(address);
            }
            let mut allocated = Vec::with_capacity(delta.allocated.len());
            for allocation in delta.allocated {
                state.live.insert(allocation.address(), allocation);
                allocated.push((allocation.address(), allocation.size(), allocation.stream()));
            }
            Ok(RestoredPool { freed: delta.freed, allocated })
        })?
    }

    /// `cacheInfo` (cuDNN's autotuner sizes its workspace with it): the largest free block in
    /// any pool of device `device`, or `at_least` if that is larger; for `at_least` 0, the
    /// device's free memory is the first guess, as PyTorch's `cacheInfo` makes it.
    pub fn cache_info(&self, device: usize, at_least: u64) -> Result<u64, Failure> {
        self.with_device(device, |state| {
            let mut largest = at_least;
            if largest == 0 {
                let (free, _) = state
                    .allocator
                    .backend_mut()
                    .memory_info()
                    .map_err(|e| Failure::Error(format!("cacheInfo on device {device}: {e}")))?;
                largest = free;
            }
            let cached = state.allocator.largest_free_block();
            Ok(largest.max(cached))
        })?
    }

    /// `set_per_process_memory_fraction(fraction, device)`.
    pub fn set_memory_fraction(&self, fraction: f64, device: usize) -> Result<(), Failure> {
        self.with_device(device, |state| state.allocator.set_memory_fraction(fraction))?
            .map_err(|e| Failure::Error(format!("memory fraction {fraction} on device {device}: {e}")))
    }

    /// Turns history recording on (with `max_entries` and the actions to skip) or off, on
    /// every device made so far and those made later.
    pub fn record_history(&self, history: Option<History>, clear: bool) {
        lock(&self.settings).history = history.clone();
        self.stacks.store(history.as_ref().map_or(Stacks::Off, |h| h.stacks) as u8, Ordering::Relaxed);
        for (_, state) in self.devices() {
            let mut state = lock(state);
            match &history {
                Some(h) => state.allocator.record_history(true, h.max_entries, &h.skip, clear),
                None => state.allocator.record_history(false, 0, &[], true),
            }
        }
    }

    /// What `torch.cuda.memory._snapshot()` returns, for all devices made so far: segments of
    /// every device, one trace per ordinal up to the highest made (empty for the others), and
    /// the allocator settings of the first device.
    pub fn snapshot(&self, include_traces: bool) -> TorchSnapshot {
        let mut snapshot = TorchSnapshot::default();
        for (device, state) in self.devices() {
            let state = lock(state);
            let allocator = &state.allocator;
            // Each device interns its own stacks: they move into the snapshot's one table.
            let table = allocator.contexts();
            let mut ids = FxHashMap::default();
            let mut context = |id: Option<ContextId>| {
                id.map(|id| *ids.entry(id).or_insert_with(|| snapshot.contexts.intern(table.frames(id))))
            };
            let mut segments: Vec<TorchSegment> =
                allocator.snapshot().iter().map(|s| TorchSegment::from_segment(s, device as i64)).collect();
            for segment in &mut segments {
                segment.frames = context(segment.frames);
                for block in &mut segment.blocks {
                    block.frames = context(block.frames);
                }
            }
            let mut trace = if include_traces { allocator.trace() } else { Vec::new() };
            for entry in &mut trace {
                entry.context = context(entry.context);
                // Annotations are never set through PyTorch's pluggable interface.
                entry.annotation = None;
            }
            snapshot.segments.extend(segments);
            snapshot.device_traces.resize_with(device + 1, Vec::new);
            snapshot.device_traces[device] = trace;
            if snapshot.allocator_settings.is_none() {
                snapshot.allocator_settings = Some(TorchAllocatorSettings::from_config(allocator.config()));
            }
        }
        if snapshot.allocator_settings.is_none() {
            snapshot.allocator_settings = Some(TorchAllocatorSettings::from_config(&self.settings().config));
        }
        snapshot
    }

    /// [`Registry::snapshot`] as PyTorch's pickle (what `_dump_snapshot` writes).
    pub fn snapshot_pickle(&self, include_traces: bool) -> Result<Vec<u8>, Failure> {
        write_snapshot(&self.snapshot(include_traces)).map_err(|e| Failure::Error(format!("snapshot pickle: {e}")))
    }

    /// Writes the snapshot `snapshot_on_oom` asks for; its path where it was written.
    fn write_oom_snapshot(&self) -> Option<PathBuf> {
        let path = self.settings().oom_snapshot?;
        let written = self
            .snapshot_pickle(true)
            .and_then(|bytes| std::fs::write(&path, bytes).map_err(|e| Failure::Error(e.to_string())));
        match written {
            Ok(()) => {
                eprintln!("cachalot_torch: out of memory; snapshot written to {}", path.display());
                Some(path)
            }
            Err(e) => {
                eprintln!("cachalot_torch: out of memory; the snapshot to {} failed: {}", path.display(), e.message());
                None
            }
        }
    }
}

/// PyTorch's out-of-memory message, then cachalot's line: the main cause, and where the fix is
/// found (`cachalot explain` of the snapshot, replaying the job's history under candidate
/// changes).
fn oom_message(message: &str, cause: Option<&str>, snapshot: Option<&Path>) -> String {
    let Some(cause) = cause else { return message.to_owned() };
    let next = match snapshot {
        Some(path) => format!(
            "`cachalot explain {}` finds the smallest fix and proves it by replaying the job (the history \
             torch.cuda.memory._record_memory_history recorded)",
            path.display()
        ),
        None => "cachalot_torch.enable(snapshot_on_oom=PATH) writes a snapshot in which `cachalot explain` finds the \
                 fix"
        .to_owned(),
    };
    format!("{message}{OOM_CAUSE_LINE}{cause}. {next}.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachalot_trace::snapshot::pickle::read_snapshot;

    fn simulated(settings: &str) -> Registry {
        Registry::new(Settings {
            config: AllocatorConfig::parse(settings).expect("valid settings"),
            device: DeviceKind::Simulator { capacity: 8 << 30 },
            ..Settings::default()
        })
    }

    /// PyTorch's message, then one line with the main cause (here the memory fraction, with the
    /// device's free memory beside it) and where the fix is found; without the line the message
    /// is PyTorch's.
    #[test]
    fn an_out_of_memory_error_ends_with_its_main_cause() {
        let registry = simulated("");
        registry.set_memory_fraction(0.25, 0).expect("a device");
        registry.alloc(1 << 30, 0, StreamId::DEFAULT).expect("fits under 2 GiB");
        let Err(Failure::OutOfMemory(message)) = registry.alloc(3 << 30 >> 1, 0, StreamId::DEFAULT) else {
            panic!("1.5 GiB more exceeds the fraction's 2 GiB")
        };
        let (pytorch, ours) = message.split_once(OOM_CAUSE_LINE).expect("cachalot's line");
        assert!(pytorch.starts_with("CUDA out of memory. Tried to allocate 1.50 GiB."), "{pytorch}");
        assert!(
            ours.starts_with("main cause: the memory fraction's allowance refused memory the device had"),
            "{ours}"
        );
        assert!(ours.contains("snapshot_on_oom"), "{ours}");
        assert_eq!(
            cachalot_core::OutOfMemoryError::allocator_part(&message),
            cachalot_core::OutOfMemoryError::allocator_part(pytorch)
        );
    }

    #[test]
    fn the_snapshot_pickle_holds_every_device_and_its_history() {
        let registry = simulated("");
        registry.record_history(Some(History { max_entries: 1000, skip: Vec::new(), stacks: Stacks::Off }), false);
        let a = registry.alloc(1 << 20, 0, StreamId::DEFAULT).expect("fits");
        let b = registry.alloc(3 << 20, 2, StreamId(0x10)).expect("fits");
        registry.free(a, 0).expect("live");
        let bytes = registry.snapshot_pickle(true).expect("writes");
        let snapshot = read_snapshot(&bytes).expect("PyTorch's format reads back");
        let devices: Vec<i64> = snapshot.segments.iter().map(|s| s.device).collect();
        assert_eq!(devices, [0, 2]);
        assert_eq!(snapshot.device_traces.len(), 3);
        let actions = |d: usize| snapshot.device_traces[d].iter().map(|e| e.action.name()).collect::<Vec<_>>();
        assert_eq!(actions(0), ["segment_alloc", "alloc", "free_requested", "free_completed"]);
        assert!(actions(1).is_empty());
        assert_eq!(actions(2), ["segment_alloc", "alloc"]);
        assert_eq!(snapshot.segments[1].stream, 0x10);
        registry.free(b, 2).expect("live");
    }

    #[test]
    fn stacks_reach_the_trace_and_the_blocks_with_each_devices_ids_merged() {
        use std::sync::atomic::AtomicUsize;
        // Each call a different stack, so device 1's first stack (its id 0) must not come out
        // as device 0's.
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        fn source() -> Vec<Frame> {
            let n = CALLS.fetch_add(1, Ordering::Relaxed);
            vec![Frame { filename: "train.py".into(), line: n as i64, name: format!("call{n}").into() }]
        }
        let registry = simulated("");
        registry.set_stack_source(source);
        let history = |stacks| Some(History { max_entries: 100, skip: Vec::new(), stacks });
        registry.record_history(history(Stacks::Alloc), false);
        let a = registry.alloc(1 << 20, 0, StreamId::DEFAULT).expect("fits");
        let b = registry.alloc(1 << 20, 1, StreamId::DEFAULT).expect("fits");
        registry.free(a, 0).expect("live"); // Stacks::Alloc: no stack gathered for the free
        let snapshot = registry.snapshot(true);
        let name =
            |id: Option<ContextId>| snapshot.contexts.frames(id.expect("a stack")).first().map(|f| f.name.clone());
        let alloc_of = |d: usize| snapshot.device_traces[d].iter().find(|e| e.action == TraceAction::Alloc).copied();
        assert_eq!(name(alloc_of(0).expect("alloc").context).as_deref(), Some("call0"));
        assert_eq!(name(alloc_of(1).expect("alloc").context).as_deref(), Some("call1"));
        let free = snapshot.device_traces[0].iter().find(|e| e.action == TraceAction::FreeRequested).expect("free");
        assert_eq!(name(free.context).as_deref(), Some("call0"), "the free reports the allocation's stack");
        let live = snapshot.segments.iter().find(|s| s.device == 1).expect("device 1's segment").blocks[0].frames;
        assert_eq!(name(live).as_deref(), Some("call1"));
        assert_eq!(CALLS.load(Ordering::Relaxed), 2);

        registry.record_history(history(Stacks::All), false);
        registry.free(b, 1).expect("live");
        let snapshot = registry.snapshot(true);
        let free = snapshot.device_traces[1].iter().find(|e| e.action == TraceAction::FreeRequested).expect("free");
        assert_eq!(snapshot.contexts.frames(free.context.expect("a stack"))[0].name.as_ref(), "call2");
        registry.record_history(history(Stacks::Off), false);
        let c = registry.alloc(1 << 20, 1, StreamId::DEFAULT).expect("fits");
        assert_eq!(CALLS.load(Ordering::Relaxed), 3, "no stack gathered with stacks off");
        registry.free(c, 1).expect("live");
    }

    #[test]
    fn history_set_before_a_device_exists_applies_when_it_is_made() {
        let registry = simulated("expandable_segments:True");
        registry.record_history(
            Some(History { max_entries: 10, skip: vec![TraceAction::Alloc], stacks: Stacks::Off }),
            false,
        );
        let p = registry.alloc(512, 5, StreamId::DEFAULT).expect("fits");
        let trace = registry.with_device(5, |d| d.allocator.trace()).expect("made");
        assert_eq!(trace.iter().map(|e| e.action.name()).collect::<Vec<_>>(), ["segment_map"]);
        registry.record_history(None, true);
        registry.free(p, 5).expect("live");
        assert!(registry.with_device(5, |d| d.allocator.trace()).expect("made").is_empty());
        let settings = registry.snapshot(false).allocator_settings.expect("settings");
        assert!(settings.expandable_segments);
    }

    #[test]
    fn a_device_that_cannot_be_made_says_why_every_time() {
        let registry = Registry::new(Settings {
            config: AllocatorConfig::parse("backend:cudaMallocAsync").expect("valid settings"),
            device: DeviceKind::Simulator { capacity: 1 << 30 },
            ..Settings::default()
        });
        for _ in 0..2 {
            let failure = registry.alloc(512, 0, StreamId::DEFAULT).expect_err("refused");
            assert!(failure.message().contains("cudaMallocAsync"), "{}", failure.message());
        }
        assert_eq!(registry.devices().count(), 0);
    }
}
