//! What the tests share: devices (or the reason to skip), runs, and the shared data.

#![allow(dead_code)] // each module uses a part

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use cachalot_core::{AllocatorConfig, TraceEntry};
use cachalot_runtime::comparison::{self, Column, Comparison};
use cachalot_runtime::device::cuda::CudaDevice;
use cachalot_runtime::device::wgpu::WgpuDevice;
use cachalot_runtime::{BackendKind, Device, Experiment, RunResult, Selection, SimDevice, SimProfile, execute_on};
use cachalot_wgpu::{WgpuConfig, WgpuContext, WgpuError};

/// The project's shared data (`../shared` beside the checkout, or `CACHALOT_SHARED_DIR`).
pub fn shared_dir() -> PathBuf {
    match std::env::var_os("CACHALOT_SHARED_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata"),
    }
}

/// `seeds.expected.json` of PyTorch 2.11 on an H200.
pub fn seeds_expected() -> PathBuf {
    shared_dir().join("traces/pytorch-2.11-h200/seeds.expected.json")
}

/// PyTorch's seeds marks as (label, allocated, reserved).
pub fn pytorch_seeds_marks() -> Vec<(String, u64, u64)> {
    let path = seeds_expected();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (set CACHALOT_SHARED_DIR to the shared folder)", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["marks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (m["label"].as_str().unwrap().to_owned(), m["allocated"].as_u64().unwrap(), m["reserved"].as_u64().unwrap())
        })
        .collect()
}

/// PyTorch's seeds trace (from `seeds.pickle`).
pub fn pytorch_seeds_trace() -> Vec<TraceEntry> {
    let bytes = std::fs::read(shared_dir().join("traces/pytorch-2.11-h200/seeds.pickle")).unwrap();
    let snapshot = cachalot_trace::snapshot::pickle::read_snapshot(&bytes).unwrap();
    snapshot.device_traces.into_iter().next().unwrap()
}

fn gpu_required() -> bool {
    std::env::var("CACHALOT_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// One wgpu context per test binary (kernels compile once), or `None` after saying why the
/// test is skipped.
pub fn wgpu_context() -> Option<Arc<WgpuContext>> {
    static SHARED: OnceLock<Option<Arc<WgpuContext>>> = OnceLock::new();
    SHARED
        .get_or_init(|| match WgpuContext::request_blocking(WgpuConfig::default()) {
            Ok(context) => Some(context),
            Err(WgpuError::NoAdapter(reason)) if !gpu_required() => {
                let _ = writeln!(
                    std::io::stderr(),
                    "skipped: no wgpu adapter ({reason}); install mesa-vulkan-drivers, or set CACHALOT_REQUIRE_GPU=1"
                );
                None
            }
            Err(error) => panic!("no usable wgpu device: {error}"),
        })
        .clone()
}

/// A wgpu device with the default allocator configuration.
pub fn wgpu_device() -> Option<Box<dyn Device>> {
    let context = wgpu_context()?;
    Some(Box::new(WgpuDevice::new(context, AllocatorConfig::default()).unwrap()))
}

/// A CUDA device, or `None` after saying why the test is skipped (a failure with
/// `CACHALOT_REQUIRE_CUDA=1`).
pub fn cuda_device(test: &str) -> Option<Box<dyn Device>> {
    match CudaDevice::open(0, AllocatorConfig::default()) {
        Ok(device) => Some(Box::new(device)),
        Err(error) if !cachalot_cuda::cuda_required() => {
            let _ = writeln!(std::io::stderr(), "skipped {test}: no usable CUDA device ({error})");
            None
        }
        Err(error) => panic!("{test}: CACHALOT_REQUIRE_CUDA is set, but no CUDA device is usable: {error}"),
    }
}

/// A simulator device.
pub fn sim(profile: SimProfile, compute: bool) -> Box<dyn Device> {
    Box::new(SimDevice::new(profile, AllocatorConfig::default(), compute).unwrap())
}

/// Runs `experiment` on `device`; panics if it stops or a check fails.
pub fn run(experiment: &Experiment, device: Box<dyn Device>) -> RunResult {
    let backend = device.kind();
    let result = execute_on(experiment, device, Selection { backend, lines: vec![format!("{backend:?} (test)")] });
    assert_eq!(result.record.error, None, "{} stopped on {backend:?}", experiment.name());
    for check in &result.record.outcome.checks {
        assert!(check.passed, "{} on {backend:?}: {}: {}", experiment.name(), check.name, check.detail);
    }
    result
}

/// (label, allocated, reserved) of a run's marks.
pub fn marks(result: &RunResult) -> Vec<(String, u64, u64)> {
    result.marks.iter().map(|m| (m.label.clone(), m.allocated, m.reserved)).collect()
}

/// A run as a compare column, through its JSON file, as `cachalot compare` reads it.
pub fn column(result: &RunResult, name: &str) -> Column {
    let path = std::env::temp_dir().join(format!("cachalot-runtime-test-{}-{name}.json", std::process::id()));
    std::fs::write(&path, result.snapshot.to_json()).unwrap();
    let column = comparison::load(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    column
}

/// What a failed comparison assertion shows: the differences, losses and event comparisons
/// (the runs' traces would drown them).
pub fn describe(comparison: &Comparison) -> String {
    format!(
        "{:#?}\n{:#?}\n{:#?}\n{:?}",
        comparison.differences, comparison.losses, comparison.events, comparison.verdict
    )
}

/// Which backend a result ran on.
pub fn backend(result: &RunResult) -> BackendKind {
    result.record.backend
}
