//! `cachalot_torch._native`: the Python side's view of the process-wide registry (the pointers
//! of the C ABI for PyTorch, and the stats, history and snapshots PyTorch's API cannot reach
//! through a pluggable allocator). The Python package (`python/cachalot_torch`) wraps it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cachalot_core::trace::TraceAction;
use cachalot_core::{AllocatorConfig, Frame};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyBytes;

use crate::abi::{self, registry};
use crate::registry::{DeviceKind, Failure, History, Settings, Stacks};

fn runtime_error(failure: Failure) -> PyErr {
    PyRuntimeError::new_err(failure.message().to_owned())
}

/// Sets what devices made from now on start with: the allocator settings (PyTorch's
/// `PYTORCH_CUDA_ALLOC_CONF` syntax), simulated devices of `simulator_capacity` bytes instead
/// of CUDA when given, and the path of the snapshot to write on out of memory.
#[pyfunction]
#[pyo3(signature = (settings, simulator_capacity=None, oom_snapshot=None))]
fn configure(settings: &str, simulator_capacity: Option<u64>, oom_snapshot: Option<PathBuf>) -> PyResult<()> {
    let config = AllocatorConfig::parse(settings)
        .map_err(|e| PyValueError::new_err(format!("allocator settings {settings:?}: {e}")))?;
    let device = match simulator_capacity {
        Some(capacity) => DeviceKind::Simulator { capacity },
        None => DeviceKind::Cuda,
    };
    let history = registry().settings().history;
    registry().configure(Settings { config, device, history, oom_snapshot });
    Ok(())
}

/// The addresses of the C ABI's functions, for the C++ shim and `CUDAPluggableAllocator`.
#[pyfunction]
fn function_addresses() -> BTreeMap<&'static str, usize> {
    BTreeMap::from([
        ("alloc", abi::cachalot_torch_alloc as *const () as usize),
        ("free", abi::cachalot_torch_free as *const () as usize),
        ("record_stream", abi::cachalot_torch_record_stream as *const () as usize),
        ("empty_cache", abi::cachalot_torch_empty_cache as *const () as usize),
        ("set_memory_fraction", abi::cachalot_torch_set_memory_fraction as *const () as usize),
        ("last_error", abi::cachalot_torch_last_error as *const () as usize),
        ("create_pool", abi::cachalot_torch_create_pool as *const () as usize),
        ("begin_allocate_to_pool", abi::cachalot_torch_begin_allocate_to_pool as *const () as usize),
        ("end_allocate_to_pool", abi::cachalot_torch_end_allocate_to_pool as *const () as usize),
        ("release_pool", abi::cachalot_torch_release_pool as *const () as usize),
        ("empty_pool_cache", abi::cachalot_torch_empty_pool_cache as *const () as usize),
        ("pool_use_count", abi::cachalot_torch_pool_use_count as *const () as usize),
        ("pool_live_allocations_are", abi::cachalot_torch_pool_live_allocations_are as *const () as usize),
        ("cache_info", abi::cachalot_torch_cache_info as *const () as usize),
        ("enable_pool_hooks", abi::cachalot_torch_enable_pool_hooks as *const () as usize),
        ("pool_checkpoint", abi::cachalot_torch_pool_checkpoint as *const () as usize),
        ("checkpoint_drop", abi::cachalot_torch_checkpoint_drop as *const () as usize),
        ("pool_restore", abi::cachalot_torch_pool_restore as *const () as usize),
    ])
}

/// Describes CUDA device `device` or raises `RuntimeError` saying why it is not usable
/// (no `libcuda`, no device).
#[pyfunction]
fn cuda_status(device: usize) -> PyResult<String> {
    cachalot_cuda::probe(device).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// `torch.cuda.memory_stats(device)`, flat and sorted (`"allocated_bytes.all.current"`, ...).
#[pyfunction]
fn memory_stats(device: usize) -> PyResult<BTreeMap<String, i64>> {
    registry().with_device(device, |state| state.allocator.stats().to_flat()).map_err(runtime_error)
}

/// `torch.cuda.memory_summary(device, abbreviated)`.
#[pyfunction]
fn memory_summary(device: usize, abbreviated: bool) -> PyResult<String> {
    registry().with_device(device, |state| state.allocator.memory_summary(abbreviated)).map_err(runtime_error)
}

/// `torch.cuda.reset_peak_memory_stats(device)`.
#[pyfunction]
fn reset_peak_memory_stats(device: usize) -> PyResult<()> {
    registry().with_device(device, |state| state.allocator.reset_peak_stats()).map_err(runtime_error)
}

/// `torch.cuda.reset_accumulated_memory_stats(device)`.
#[pyfunction]
fn reset_accumulated_memory_stats(device: usize) -> PyResult<()> {
    registry().with_device(device, |state| state.allocator.reset_accumulated_stats()).map_err(runtime_error)
}

/// `torch.cuda.empty_cache()`: every device made so far.
#[pyfunction]
fn empty_cache() -> PyResult<()> {
    registry().empty_cache().map_err(runtime_error)
}

/// `torch.cuda.set_per_process_memory_fraction(fraction, device)`.
#[pyfunction]
fn set_memory_fraction(fraction: f64, device: usize) -> PyResult<()> {
    registry().set_memory_fraction(fraction, device).map_err(runtime_error)
}

/// `torch.cuda.get_per_process_memory_fraction(device)`.
#[pyfunction]
fn memory_fraction(device: usize) -> PyResult<f64> {
    registry().with_device(device, |state| state.allocator.memory_fraction()).map_err(runtime_error)
}

/// `torch.cuda.memory._record_memory_history`: on with a ring buffer of `max_entries` entries
/// (skipping the actions named in `skip`: "alloc", "free_requested", ...), or off. `stacks`:
/// whose Python stacks are recorded: "off", "alloc" (allocations; their frees report them) or
/// "all" (frees their own too).
#[pyfunction]
#[pyo3(signature = (enabled, max_entries, skip=Vec::new(), clear=false, stacks="off"))]
fn record_memory_history(
    enabled: bool,
    max_entries: usize,
    skip: Vec<String>,
    clear: bool,
    stacks: &str,
) -> PyResult<()> {
    let stacks = match stacks {
        "off" => Stacks::Off,
        "alloc" => Stacks::Alloc,
        "all" => Stacks::All,
        other => return Err(PyValueError::new_err(format!("stacks is \"off\", \"alloc\" or \"all\", not {other:?}"))),
    };
    let skip = skip
        .iter()
        .map(|name| {
            TraceAction::from_name(name)
                .ok_or_else(|| PyValueError::new_err(format!("unknown trace action {name:?} in skip_actions")))
        })
        .collect::<PyResult<Vec<_>>>()?;
    registry().record_history(enabled.then_some(History { max_entries, skip, stacks }), clear);
    Ok(())
}

/// The pickle of `torch.cuda.memory._snapshot()` for every device made so far.
#[pyfunction]
#[pyo3(signature = (include_traces=true))]
fn snapshot_pickle(py: Python<'_>, include_traces: bool) -> PyResult<Bound<'_, PyBytes>> {
    let bytes = registry().snapshot_pickle(include_traces).map_err(runtime_error)?;
    Ok(PyBytes::new(py, &bytes))
}

/// Ordinals of the devices the allocator serves so far.
#[pyfunction]
fn devices() -> Vec<usize> {
    registry().devices().map(|(device, _)| device).collect()
}

/// Checks the allocator's internal invariants on `device` (for tests): `None`, or what is wrong.
#[pyfunction]
fn check_consistency(device: usize) -> PyResult<Option<String>> {
    registry().with_device(device, |state| state.allocator.check_consistency().err()).map_err(runtime_error)
}

/// The calling thread's Python stack, innermost frame first, for the history (the registry's
/// [`crate::registry::StackSource`]). PyTorch's allocator gathers the same frames the same way
/// (`CapturedTraceback::gather`: attach to the interpreter, walk the frames): the operator that
/// allocates has released the GIL, which is taken back here. A thread without Python frames
/// (autograd's backward thread) gets an empty stack, as in PyTorch's snapshots; so does any
/// thread while the interpreter shuts down.
fn python_stack() -> Vec<Frame> {
    Python::try_attach(|py| python_frames(py).unwrap_or_default()).unwrap_or_default()
}

/// Code objects seen so far, with their file and function names as the history keeps them. The
/// code object is held, so its address (the key) is never reused.
struct CodeNames {
    _code: Py<PyAny>,
    filename: Arc<str>,
    name: Arc<str>,
}

static CODE_NAMES: Mutex<Option<HashMap<usize, CodeNames>>> = Mutex::new(None);

fn python_frames(py: Python<'_>) -> PyResult<Vec<Frame>> {
    static GETFRAME: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let getframe = GETFRAME.get_or_try_init(py, || py.import("sys")?.getattr("_getframe").map(Bound::unbind))?;
    // ValueError where the thread has no Python frame.
    let Ok(mut frame) = getframe.bind(py).call0() else { return Ok(Vec::new()) };
    let mut names = CODE_NAMES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let names = names.get_or_insert_with(HashMap::new);
    let mut frames = Vec::new();
    while !frame.is_none() {
        let code = frame.getattr(intern!(py, "f_code"))?;
        let key = code.as_ptr() as usize;
        let entry = match names.get(&key) {
            Some(entry) => entry,
            None => {
                let filename: String = code.getattr(intern!(py, "co_filename"))?.extract()?;
                let name: String = code.getattr(intern!(py, "co_name"))?.extract()?;
                names.entry(key).or_insert(CodeNames {
                    _code: code.clone().unbind(),
                    filename: filename.into(),
                    name: name.into(),
                })
            }
        };
        // f_lineno is None in a few frames (a generator being torn down): line 0 there.
        let line: i64 = frame.getattr(intern!(py, "f_lineno"))?.extract().unwrap_or(0);
        frames.push(Frame { filename: entry.filename.clone(), line, name: entry.name.clone() });
        frame = frame.getattr(intern!(py, "f_back"))?;
    }
    Ok(frames)
}

/// The native half of `cachalot_torch`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    registry().set_stack_source(python_stack);
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(function_addresses, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_status, m)?)?;
    m.add_function(wrap_pyfunction!(memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(memory_summary, m)?)?;
    m.add_function(wrap_pyfunction!(reset_peak_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(reset_accumulated_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(set_memory_fraction, m)?)?;
    m.add_function(wrap_pyfunction!(memory_fraction, m)?)?;
    m.add_function(wrap_pyfunction!(record_memory_history, m)?)?;
    m.add_function(wrap_pyfunction!(snapshot_pickle, m)?)?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    m.add_function(wrap_pyfunction!(check_consistency, m)?)?;
    Ok(())
}
