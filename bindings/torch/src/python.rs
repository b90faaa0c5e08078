//! `cachalot_torch._native`: the Python side's view of the process-wide registry (the pointers
//! of the C ABI for PyTorch, and the stats, history and snapshots PyTorch's API cannot reach
//! through a pluggable allocator). The Python package (`python/cachalot_torch`) wraps it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use cachalot_core::AllocatorConfig;
use cachalot_core::trace::TraceAction;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::abi::{self, registry};
use crate::registry::{DeviceKind, Failure, History, Settings};

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
/// (skipping the actions named in `skip`: "alloc", "free_requested", ...), or off.
#[pyfunction]
#[pyo3(signature = (enabled, max_entries, skip=Vec::new(), clear=false))]
fn record_memory_history(enabled: bool, max_entries: usize, skip: Vec<String>, clear: bool) -> PyResult<()> {
    let skip = skip
        .iter()
        .map(|name| {
            TraceAction::from_name(name)
                .ok_or_else(|| PyValueError::new_err(format!("unknown trace action {name:?} in skip_actions")))
        })
        .collect::<PyResult<Vec<_>>>()?;
    registry().record_history(enabled.then_some(History { max_entries, skip }), clear);
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

/// The native half of `cachalot_torch`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
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
