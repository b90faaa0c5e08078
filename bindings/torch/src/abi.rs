//! The C ABI PyTorch's `CUDAPluggableAllocator` calls, over the process-wide [`registry()`].
//!
//! `torch.cuda.memory.CUDAPluggableAllocator(path, "cachalot_torch_alloc", "cachalot_torch_free")`
//! takes the first two directly; the C++ hooks PyTorch 2.11 only reaches from C++
//! (`set_record_stream_fn`, `set_reset_fn`, `set_memory_fraction_fn`) take the others, through the
//! Python package's shim. Signatures, as `torch/csrc/cuda/CUDAPluggableAllocator.h` declares them:
//!
//! ```c
//! void* cachalot_torch_alloc(size_t size, int device, cudaStream_t stream);
//! void  cachalot_torch_free(void* ptr, size_t size, int device, cudaStream_t stream);
//! void  cachalot_torch_record_stream(void* ptr, cudaStream_t stream);
//! void  cachalot_torch_empty_cache(void);
//! void  cachalot_torch_set_memory_fraction(double fraction, int device);
//! const char* cachalot_torch_last_error(int* kind);   /* 0 none, 1 out of memory, 2 other */
//! int   cachalot_torch_configure(const char* settings, uint64_t simulator_capacity);
//! ```
//!
//! A failed `alloc` returns null and leaves its message for `cachalot_torch_last_error` on the
//! calling thread: PyTorch's pluggable allocator does not check for null itself, so the shim
//! raises `torch.OutOfMemoryError` (kind 1) or `RuntimeError` (kind 2) with it. The hooks
//! returning `void` cannot report to PyTorch; their failures are printed on stderr and kept for
//! `cachalot_torch_last_error`. No call unwinds into C: a panic becomes an error of kind 2.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use cachalot_core::{AllocatorConfig, PoolId, StreamId};

use crate::registry::{CallerFilter, DeviceKind, Failure, Registry, Settings};

/// `cachalot_torch_last_error`'s kind: no error since the last call.
pub const ERROR_NONE: c_int = 0;
/// `cachalot_torch_last_error`'s kind: the allocation cannot be met (PyTorch's OOM message).
pub const ERROR_OUT_OF_MEMORY: c_int = 1;
/// `cachalot_torch_last_error`'s kind: any other failure.
pub const ERROR_OTHER: c_int = 2;

/// The registry behind the C ABI: one per process, as PyTorch has one current allocator.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

thread_local! {
    /// The last failure on this thread and its message (kept alive for the returned pointer).
    static LAST_ERROR: RefCell<(c_int, CString)> = RefCell::new((ERROR_NONE, CString::default()));
}

fn set_last_error(failure: &Failure) {
    let kind = match failure {
        Failure::OutOfMemory(_) => ERROR_OUT_OF_MEMORY,
        Failure::Error(_) => ERROR_OTHER,
    };
    // A message with a NUL in it is cut there rather than lost.
    let message = failure.message().split('\0').next().unwrap_or_default();
    let message = CString::new(message).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = (kind, message));
}

/// Runs `f`, turning a panic into a [`Failure`] (nothing may unwind into PyTorch).
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => {
            let detail = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(Failure::Error(format!("cachalot_torch: {what} panicked: {detail}")))
        }
    }
}

/// Reports a failure of a `void` hook: kept for `cachalot_torch_last_error` and printed, since
/// PyTorch has no way to hear it.
fn report(what: &str, result: Result<(), Failure>) {
    if let Err(failure) = result {
        eprintln!("cachalot_torch: {what}: {}", failure.message());
        set_last_error(&failure);
    }
}

fn ordinal(device: c_int) -> Result<usize, Failure> {
    usize::try_from(device).map_err(|_| Failure::Error(format!("device {device} is not a CUDA device ordinal")))
}

/// `alloc_fn` of `CUDAPluggableAllocator`: a device pointer of at least `size` bytes on
/// `device` for use on `stream`, or null with the reason left for
/// [`cachalot_torch_last_error`]. `size` 0 is null without an error.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_alloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    let result = guarded("alloc", || registry().alloc(size as u64, ordinal(device)?, StreamId(stream as u64)));
    match result {
        Ok(address) => address as usize as *mut c_void,
        Err(failure) => {
            set_last_error(&failure);
            std::ptr::null_mut()
        }
    }
}

/// `free_fn` of `CUDAPluggableAllocator`: returns `ptr` to the cache of `device`. `size` and
/// `stream` are PyTorch's record of the allocation; the allocator keeps its own.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_free(ptr: *mut c_void, size: usize, device: c_int, stream: *mut c_void) {
    let _ = (size, stream);
    report("free", guarded("free", || registry().free(ptr as u64, ordinal(device)?)));
}

/// `record_stream_fn`: the block of `ptr` is used on `stream` too (`Tensor.record_stream`), so
/// once freed it is not reused before the work queued on `stream` until then has finished.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    report("record_stream", guarded("record_stream", || registry().record_stream(ptr as u64, StreamId(stream as u64))));
}

/// `reset_fn` (PyTorch's `emptyCache`): releases every unused cached segment of every device.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_empty_cache() {
    report("empty_cache", guarded("empty_cache", || registry().empty_cache()));
}

/// `memory_fraction_fn`: caps `device`'s reserved memory at `fraction` of its total.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_set_memory_fraction(fraction: f64, device: c_int) {
    report(
        "set_memory_fraction",
        guarded("set_memory_fraction", || registry().set_memory_fraction(fraction, ordinal(device)?)),
    );
}

/// The last failure on the calling thread: its message (valid until the thread's next call
/// into this library), and its kind in `*kind` when `kind` is not null ([`ERROR_NONE`],
/// [`ERROR_OUT_OF_MEMORY`] or [`ERROR_OTHER`]). Reading it clears the kind.
///
/// # Safety
/// `kind` is null or points to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_torch_last_error(kind: *mut c_int) -> *const c_char {
    LAST_ERROR.with(|slot| {
        let mut slot = slot.borrow_mut();
        if !kind.is_null() {
            // SAFETY: the caller passes a writable int or null.
            unsafe { *kind = slot.0 };
        }
        slot.0 = ERROR_NONE;
        slot.1.as_ptr()
    })
}

/// Sets what devices made from now on start with: `settings` in `PYTORCH_CUDA_ALLOC_CONF`
/// syntax (null or "" for the defaults), on CUDA when `simulator_capacity` is 0, else on
/// simulated devices of that many bytes. Returns 0, or 1 with the reason for
/// [`cachalot_torch_last_error`] (a configuration that does not parse).
///
/// # Safety
/// `settings` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_torch_configure(settings: *const c_char, simulator_capacity: u64) -> c_int {
    let text = if settings.is_null() {
        String::new()
    } else {
        // SAFETY: the caller passes a NUL-terminated string.
        unsafe { CStr::from_ptr(settings) }.to_string_lossy().into_owned()
    };
    let result = guarded("configure", || {
        let config =
            AllocatorConfig::parse(&text).map_err(|e| Failure::Error(format!("allocator settings {text:?}: {e}")))?;
        let device = if simulator_capacity == 0 {
            DeviceKind::Cuda
        } else {
            DeviceKind::Simulator { capacity: simulator_capacity }
        };
        let current = registry().settings();
        registry().configure(Settings { config, device, ..current });
        Ok(())
    });
    match result {
        Ok(()) => 0,
        Err(failure) => {
            set_last_error(&failure);
            1
        }
    }
}

/// Runs a pool hook: 0 on success, or 1 with the reason for [`cachalot_torch_last_error`]
/// (the shim raises it as PyTorch's `RuntimeError`).
fn status(what: &str, f: impl FnOnce() -> Result<(), Failure>) -> c_int {
    match guarded(what, f) {
        Ok(()) => 0,
        Err(failure) => {
            set_last_error(&failure);
            1
        }
    }
}

/// `createOrIncrefPool(device, (id0, id1))`: a `MemPool` made. Returns 0, or 1 with the reason.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_create_pool(device: c_int, id0: u64, id1: u64) -> c_int {
    status("createOrIncrefPool", || registry().create_pool(ordinal(device)?, PoolId(id0, id1)))
}

/// A filter PyTorch gave `beginAllocateToPool`, held by the shim: `accepts(context, stream)`
/// answers it (non-zero: the request is the pool's), `release(context)` frees it once the pool
/// is no longer routed to.
struct ForeignFilter {
    accepts: extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    release: extern "C" fn(*mut c_void),
    context: *mut c_void,
}

// SAFETY: the shim's filter object may be called from any thread (PyTorch calls the allocator,
// and so the filter, from every thread that allocates), and the registry calls it only under
// the device's lock, one call at a time.
unsafe impl Send for ForeignFilter {}

impl ForeignFilter {
    fn accepts(&self, stream: StreamId) -> bool {
        (self.accepts)(self.context, stream.0 as *mut c_void) != 0
    }
}

impl Drop for ForeignFilter {
    fn drop(&mut self) {
        (self.release)(self.context);
    }
}

/// `beginAllocateToPool(device, (id0, id1), filter)`: a graph capture begins, or `use_mem_pool`
/// is entered. The requests `accepts(context, stream)` accepts (non-zero) are served from the
/// pool until [`cachalot_torch_end_allocate_to_pool`]; `release(context)` is called once the
/// filter is no longer needed (also when this call fails). Returns 0, or 1 with the reason.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_begin_allocate_to_pool(
    device: c_int,
    id0: u64,
    id1: u64,
    accepts: extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    release: extern "C" fn(*mut c_void),
    context: *mut c_void,
) -> c_int {
    let foreign = ForeignFilter { accepts, release, context };
    let filter: CallerFilter = Box::new(move |stream: StreamId| foreign.accepts(stream));
    status("beginAllocateToPool", || registry().begin_allocate_to_pool(ordinal(device)?, PoolId(id0, id1), filter))
}

/// `endAllocateToPool(device, (id0, id1))`: the capture ended or `use_mem_pool` was left.
/// Returns 0, or 1 with the reason.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_end_allocate_to_pool(device: c_int, id0: u64, id1: u64) -> c_int {
    status("endAllocateToPool", || registry().end_allocate_to_pool(ordinal(device)?, PoolId(id0, id1)))
}

/// `releasePool(device, (id0, id1))`: one user of the pool fewer. Returns 0, or 1 with the reason.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_release_pool(device: c_int, id0: u64, id1: u64) -> c_int {
    status("releasePool", || registry().release_pool(ordinal(device)?, PoolId(id0, id1)))
}

/// `emptyCache((id0, id1))` on every device: `(0, 0)` is `torch.cuda.empty_cache()`, another id
/// that private pool's, once released (a `MemPool`'s deletion). Returns 0, or 1 with the reason.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_empty_pool_cache(id0: u64, id1: u64) -> c_int {
    status("emptyCache", || registry().empty_pool_cache(PoolId(id0, id1)))
}

/// `getPoolUseCount(device, (id0, id1))`: the pool's users (0 for an unknown pool), or -1 with
/// the reason.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_pool_use_count(device: c_int, id0: u64, id1: u64) -> i64 {
    match guarded("getPoolUseCount", || registry().pool_use_count(ordinal(device)?, PoolId(id0, id1))) {
        Ok(count) => i64::from(count),
        Err(failure) => {
            set_last_error(&failure);
            -1
        }
    }
}

/// `checkPoolLiveAllocations(device, (id0, id1), expected)`: 1 if the pool's allocated blocks
/// are exactly the `count` pointers at `expected`, 0 if not, -1 with the reason.
///
/// # Safety
/// `expected` points to `count` readable pointers (or `count` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_torch_pool_live_allocations_are(
    device: c_int,
    id0: u64,
    id1: u64,
    expected: *const u64,
    count: usize,
) -> c_int {
    let expected: &[u64] = match count {
        0 => &[],
        // SAFETY: the caller passes `count` readable pointers.
        _ => unsafe { std::slice::from_raw_parts(expected, count) },
    };
    match guarded("checkPoolLiveAllocations", || {
        registry().pool_live_allocations_are(ordinal(device)?, PoolId(id0, id1), expected)
    }) {
        Ok(same) => c_int::from(same),
        Err(failure) => {
            set_last_error(&failure);
            -1
        }
    }
}

/// `cacheInfo(device, largest)`: `*largest` becomes the largest free block of any pool of the
/// device, if larger; a 0 passed in starts from the device's free memory, as PyTorch's does.
/// Returns 0, or 1 with the reason.
///
/// # Safety
/// `largest` points to a readable and writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_torch_cache_info(device: c_int, largest: *mut usize) -> c_int {
    // SAFETY: the caller passes a readable, writable size_t.
    let at_least = unsafe { *largest } as u64;
    match guarded("cacheInfo", || registry().cache_info(ordinal(device)?, at_least)) {
        Ok(bytes) => {
            // SAFETY: as above.
            unsafe { *largest = usize::try_from(bytes).unwrap_or(usize::MAX) };
            0
        }
        Err(failure) => {
            set_last_error(&failure);
            1
        }
    }
}

/// `getCheckpointState(device, (id0, id1))` (CUDA-graph trees, after recording a graph): a
/// checkpoint of the pool, kept until [`cachalot_torch_checkpoint_drop`]. Returns its handle
/// (never 0), or 0 with the reason.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_pool_checkpoint(device: c_int, id0: u64, id1: u64) -> u64 {
    match guarded("getCheckpointState", || registry().checkpoint_pool(ordinal(device)?, PoolId(id0, id1))) {
        Ok(handle) => handle,
        Err(failure) => {
            set_last_error(&failure);
            0
        }
    }
}

/// The checkpoint `checkpoint` of `device` is no longer needed (PyTorch's `AllocatorState`
/// holding it died).
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_checkpoint_drop(device: c_int, checkpoint: u64) {
    report("checkpoint_drop", guarded("checkpoint_drop", || registry().drop_checkpoint(ordinal(device)?, checkpoint)));
}

/// Receives what a restore changed, one pointer a call: `allocated` 0 for a pointer freed
/// (`size` 0, `stream` null), 1 for a pointer handed out (its block size and stream).
pub type RestoreSink =
    extern "C" fn(context: *mut c_void, allocated: c_int, ptr: *mut c_void, size: usize, stream: *mut c_void);

/// `setCheckpointPoolState(device, checkpoint)` (CUDA-graph trees, to record a graph off the
/// current path): puts the checkpoint's pool back into the checkpointed state. Then tells
/// `sink(context, ...)` each pointer freed, then each pointer handed out (PyTorch's
/// `CheckpointDelta`; a pointer may be in both), outside the device's lock. Returns 0, or 1 with
/// the reason (the pool changed nothing then).
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_pool_restore(
    device: c_int,
    checkpoint: u64,
    sink: RestoreSink,
    context: *mut c_void,
) -> c_int {
    match guarded("setCheckpointPoolState", || registry().restore_pool(ordinal(device)?, checkpoint)) {
        Ok(restored) => {
            for address in restored.freed {
                sink(context, 0, address as usize as *mut c_void, 0, std::ptr::null_mut());
            }
            for (address, size, stream) in restored.allocated {
                let size = usize::try_from(size).unwrap_or(usize::MAX);
                sink(context, 1, address as usize as *mut c_void, size, stream.0 as usize as *mut c_void);
            }
            0
        }
        Err(failure) => {
            set_last_error(&failure);
            1
        }
    }
}

/// Says that the shim installed PyTorch's private-pool hooks: captures are routed to their
/// pools from now on instead of refused.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_torch_enable_pool_hooks() {
    registry().enable_pool_hooks();
}
