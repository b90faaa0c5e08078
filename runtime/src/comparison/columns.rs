//! The runs `compare` puts side by side, one column each: what was measured (marks, stats,
//! timings, losses, trace, device facts) and the factors that shaped it, read from a cachalot
//! snapshot or from PyTorch's `expected.json`.

use cachalot_core::{DeviceFacts, MemoryStats, TraceAction, TraceEntry};
use cachalot_trace::Snapshot;
use cachalot_trace::replay::{ExpectedRun, ReplayOptions, replay};
use cachalot_trace::snapshot::FileFormat;
use cachalot_trace::snapshot::file::Timing;
use cachalot_trace::snapshot::pickle::read_snapshot;

use crate::device::sim::H200_MEMORY;
use crate::device::{StreamDiscipline, Workspaces};
use crate::error::RuntimeError;
use crate::experiments::{Check, Experiment};
use crate::run::RunRecord;
use crate::runtime::WORKSPACE_FRAME;

/// What shapes a run's allocator sequence beyond the program.
#[derive(Clone, Debug, PartialEq)]
pub struct Factors {
    /// The matrix products' persistent workspaces.
    pub workspaces: Option<Workspaces>,
    /// The allocator settings.
    pub settings: String,
    /// When freed blocks become reusable.
    pub discipline: StreamDiscipline,
    /// Device memory.
    pub capacity: u64,
    /// Largest segment the device allows.
    pub max_segment_size: Option<u64>,
}

/// One mark of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkValue {
    /// Label.
    pub label: String,
    /// `memory_allocated()`.
    pub allocated: u64,
    /// `memory_reserved()`.
    pub reserved: u64,
}

/// One run as the comparison sees it: a column of its tables.
#[derive(Clone, Debug)]
pub struct Column {
    /// File name.
    pub name: String,
    /// What it is (`cuda: NVIDIA H200`).
    pub title: String,
    /// The marks.
    pub marks: Vec<MarkValue>,
    /// `memory_stats()` at the end.
    pub stats: Option<MemoryStats>,
    /// Named durations.
    pub timings: Vec<Timing>,
    /// Losses per step (runs that computed).
    pub losses: Vec<f32>,
    /// Checks the run made.
    pub checks: Vec<Check>,
    /// Notes of the run.
    pub notes: Vec<String>,
    /// The error that stopped the run.
    pub error: Option<String>,
    /// The trace, for cachalot runs.
    pub trace: Option<Vec<TraceEntry>>,
    /// The factors.
    pub factors: Factors,
    /// How the workspaces were known.
    pub workspace_source: String,
    /// The experiment, when known.
    pub experiment: Option<Experiment>,
    /// The device facts, for cachalot runs.
    pub facts: Option<DeviceFacts>,
}

impl Column {
    /// The checks of the run that did not hold.
    pub fn failed_checks(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|k| !k.passed)
    }
}

/// Reads a cachalot snapshot or a PyTorch `expected.json` (written by
/// `shared/traces/capture.py`).
pub fn load(path: &std::path::Path) -> Result<Column, RuntimeError> {
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let input = |message: String| RuntimeError::Input { path: path.display().to_string(), message };
    let bytes = cachalot_trace::input::read(path).map_err(|e| input(e.reason()))?;
    match FileFormat::detect(&bytes) {
        FileFormat::TorchPickle => return from_pickle(name, path, &bytes).map_err(input),
        FileFormat::Cachalot => {}
        _ => {
            return Err(input(
                "not a file compare takes: a cachalot snapshot (`cachalot run --out`, `cachalot replay --out`), \
                 a PyTorch snapshot pickle, or PyTorch's NAME.expected.json"
                    .into(),
            ));
        }
    }
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| input(format!("not JSON: {e}")))?;
    if value.get("format").is_some() {
        let snapshot = Snapshot::from_json(&bytes).map_err(|e| input(e.to_string()))?;
        from_snapshot(name, snapshot).map_err(input)
    } else if value.get("marks").is_some() {
        let mut column = from_expected(name, &value).map_err(input)?;
        column.trace = pytorch_trace_beside(path);
        Ok(column)
    } else {
        Err(input("neither a cachalot snapshot nor a PyTorch expected.json (no 'format' or 'marks')".into()))
    }
}

/// A column of a PyTorch snapshot pickle: its trace replayed on the simulator (with the
/// `NAME.expected.json` beside it, where there is one, for the settings, memory fraction and
/// device size), as `cachalot replay TRACE --out` writes it. A pickle has no marks; its stats
/// and allocator events compare.
fn from_pickle(name: String, path: &std::path::Path, bytes: &[u8]) -> Result<Column, String> {
    let torch = read_snapshot(bytes).map_err(|e| e.to_string())?;
    let expected = ExpectedRun::beside(path)?;
    let options = ReplayOptions::for_snapshot(&torch, expected.as_ref()).map_err(|e| e.to_string())?;
    let outcome = replay(&torch, &options, |_, _| {}).map_err(|e| e.to_string())?;
    from_snapshot(name, Snapshot::capture(&outcome.allocator, format!("replay of {}", path.display())))
}

/// A column of a cachalot snapshot.
pub fn from_snapshot(name: String, snapshot: Snapshot) -> Result<Column, String> {
    let record = RunRecord::from_snapshot(&snapshot).transpose()?;
    let facts = snapshot.device.clone();
    let traced_workspaces = workspaces_in_trace(&snapshot);
    let (workspaces, workspace_source) = match (&record, traced_workspaces) {
        (Some(r), _) => (
            r.workspaces,
            match r.workspaces {
                Some(_) => "the device's workspace sizes (PyTorch 2.11's rule)".into(),
                None => "none on this device".into(),
            },
        ),
        (None, Some(ws)) => (Some(ws), "found in the trace".into()),
        (None, None) => (None, "none found in the trace".into()),
    };
    let factors = Factors {
        workspaces,
        settings: snapshot.settings.clone(),
        discipline: record.as_ref().map_or(StreamDiscipline::DefaultStream, |r| r.discipline),
        capacity: facts.total_memory,
        max_segment_size: facts.max_segment_size,
    };
    let title = match &record {
        Some(r) => format!("{}: {}", r.backend.name(), facts.name),
        None => format!("{}: {} ({})", facts.backend, facts.name, snapshot.source),
    };
    let marks = snapshot.marks.iter().map(|m| MarkValue {
        label: m.label.clone(),
        allocated: m.allocated,
        reserved: m.reserved,
    });
    Ok(Column {
        name,
        title,
        marks: marks.collect(),
        stats: Some(snapshot.stats.clone()),
        timings: snapshot.timings.clone(),
        losses: record.as_ref().filter(|r| r.computes).map(|r| r.outcome.losses.clone()).unwrap_or_default(),
        checks: record.as_ref().map(|r| r.outcome.checks.clone()).unwrap_or_default(),
        notes: record.as_ref().map(|r| r.notes.clone()).unwrap_or_default(),
        error: record.as_ref().and_then(|r| r.error.clone()),
        trace: snapshot.trace_complete.then(|| snapshot.trace.clone()),
        factors,
        workspace_source,
        experiment: record.map(|r| r.experiment),
        facts: Some(facts),
    })
}

/// The workspaces a trace shows: blocks allocated from the runtime's workspace frame.
fn workspaces_in_trace(snapshot: &Snapshot) -> Option<Workspaces> {
    let frames: Vec<bool> =
        snapshot.stacks.iter().map(|s| s.first().is_some_and(|f| &*f.name == WORKSPACE_FRAME)).collect();
    let sizes: Vec<u64> = snapshot
        .trace
        .iter()
        .filter(|e| {
            e.action == TraceAction::Alloc && e.context.is_some_and(|c| frames.get(c.0 as usize) == Some(&true))
        })
        .map(|e| e.size)
        .collect();
    match sizes[..] {
        [] => None,
        [cublas] => Some(Workspaces { cublas, cublaslt: 0 }),
        [cublas, cublaslt, ..] => Some(Workspaces { cublas, cublaslt }),
    }
}

/// Compute capability major of a GPU by name, for PyTorch's workspace rule.
fn major_of(gpu: &str) -> Option<i32> {
    let g = gpu.to_ascii_uppercase();
    let any = |names: &[&str]| names.iter().any(|n| g.contains(n));
    if any(&["H100", "H200", "H800", "H20", "GH200"]) {
        Some(9)
    } else if any(&["B100", "B200", "B300", "GB200", "GB300"]) {
        Some(10)
    } else if any(&["RTX 50", "RTX PRO 6000"]) {
        Some(12)
    } else if any(&["A100", "A800", "A30", "A40", "A10", "RTX 30", "RTX A", "L4", "L40", "RTX 40", "ADA"]) {
        Some(8)
    } else if any(&["V100", "T4", "RTX 20"]) {
        Some(7)
    } else {
        None
    }
}

/// The trace of `NAME.pickle` beside `NAME.expected.json` (PyTorch's recorded snapshot), if
/// there is one that can be read.
fn pytorch_trace_beside(expected: &std::path::Path) -> Option<Vec<TraceEntry>> {
    let file = expected.file_name()?.to_str()?;
    let stem = file.strip_suffix(".expected.json")?;
    let bytes = cachalot_trace::input::read(&expected.with_file_name(format!("{stem}.pickle"))).ok()?;
    let snapshot = cachalot_trace::snapshot::pickle::read_snapshot(&bytes).ok()?;
    snapshot.device_traces.into_iter().next()
}

/// A column of PyTorch's `NAME.expected.json` given as bytes (an upload in the browser, where
/// no file lies beside it: the column has no PyTorch trace, as [`load`] gives it when no
/// `NAME.pickle` lies beside the file).
pub fn from_expected_json(name: String, bytes: &[u8]) -> Result<Column, String> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    if value.get("marks").is_none() {
        return Err("not PyTorch's expected.json (no 'marks')".into());
    }
    from_expected(name, &value)
}

/// A column of PyTorch's `expected.json`.
fn from_expected(name: String, value: &serde_json::Value) -> Result<Column, String> {
    let text = |key: &str| value.get(key).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
    let run = cachalot_trace::replay::ExpectedRun::from_json(value.to_string().as_bytes())?;
    let gpu = text("gpu");
    let workload = text("workload");
    let (workspaces, workspace_source) = match major_of(&gpu) {
        Some(major) => {
            (Some(Workspaces::pytorch(major)), format!("PyTorch 2.11's rule for compute capability {major}.x ({gpu})"))
        }
        None => (None, format!("unknown: compute capability of '{gpu}' not known")),
    };
    let stats = if run.memory_stats.is_empty() { None } else { MemoryStats::from_flat(&run.memory_stats).ok() };
    let marks = run
        .marks
        .iter()
        .filter_map(|m| Some(MarkValue { label: m.label.clone(), allocated: m.allocated?, reserved: m.reserved? }))
        .collect();
    Ok(Column {
        name,
        title: format!("pytorch {}: {gpu} ({workload})", text("torch")),
        marks,
        stats,
        timings: Vec::new(),
        losses: Vec::new(),
        checks: Vec::new(),
        notes: Vec::new(),
        error: None,
        trace: None,
        factors: Factors {
            workspaces,
            settings: run.settings.clone(),
            discipline: StreamDiscipline::DefaultStream,
            capacity: run.device_total.unwrap_or(H200_MEMORY),
            max_segment_size: None,
        },
        workspace_source,
        experiment: (workload == "seeds").then_some(Experiment::Seeds),
        facts: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_architectures() {
        assert_eq!(major_of("NVIDIA H200"), Some(9));
        assert_eq!(major_of("NVIDIA A100-SXM4-80GB"), Some(8));
        assert_eq!(major_of("llvmpipe"), None);
    }
}
