//! Running an experiment on a device and recording it: the snapshot the viewer opens and
//! `compare` reads, with the run's own facts in it.
//!
//! The facts go into the snapshot's `device.details` (free-form pairs every tool shows): a few
//! readable lines (`run: backend selection`, `run: streams`, `run: workspaces`, ...) and one
//! machine-readable entry, [`RECORD_KEY`], holding the [`RunRecord`] as JSON: the experiment
//! and its parameters, the discipline and workspaces, losses, checks and notes. With it,
//! `compare` can rerun the same experiment on the simulator to test why two runs differ.

use cachalot_core::Mark;
use cachalot_trace::Snapshot;

use crate::device::{BackendKind, StreamDiscipline, Workspaces};
use crate::error::RuntimeError;
use crate::experiments::{Experiment, Outcome};
use crate::runtime::Runtime;
use crate::select::{self, DeviceOptions, Selection};
use crate::stream::TraceSink;

/// Key of the machine-readable run record in `device.details`.
pub const RECORD_KEY: &str = "cachalot.run";

/// What a run was and what it found, stored in its snapshot.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    /// The experiment and its parameters.
    pub experiment: Experiment,
    /// The backend it ran on.
    pub backend: BackendKind,
    /// Why this backend (one line per backend considered).
    pub selection: Vec<String>,
    /// When freed blocks became reusable.
    pub discipline: StreamDiscipline,
    /// The cuBLAS / cuBLASLt workspaces the device's products allocate, if any.
    pub workspaces: Option<Workspaces>,
    /// The simulator's profile, on the simulator.
    pub profile: Option<String>,
    /// Whether kernels computed.
    pub computes: bool,
    /// Losses, checks and report lines.
    pub outcome: Outcome,
    /// Notes (limits that changed how operations ran, ...).
    pub notes: Vec<String>,
    /// The error that stopped the run, if it did not finish.
    pub error: Option<String>,
}

impl RunRecord {
    /// Stores the record (and readable lines) in `snapshot.device.details`.
    pub fn attach(&self, snapshot: &mut Snapshot) {
        let details = &mut snapshot.device.details;
        details.retain(|(k, _)| k != RECORD_KEY && !k.starts_with("run: "));
        details.push(("run: experiment".into(), self.experiment.name().into()));
        details.push(("run: backend selection".into(), self.selection.join("; ")));
        details.push(("run: streams".into(), self.discipline.describe().into()));
        details.push((
            "run: workspaces".into(),
            match self.workspaces {
                Some(ws) => format!("cuBLAS {} B, cuBLASLt {} B (first products)", ws.cublas, ws.cublaslt),
                None => "none".into(),
            },
        ));
        for note in &self.notes {
            details.push(("run: note".into(), note.clone()));
        }
        if let Some(error) = &self.error {
            details.push(("run: error".into(), error.clone()));
        }
        details.push((RECORD_KEY.into(), serde_json::to_string(self).unwrap_or_default()));
    }

    /// The record of a snapshot written by `cachalot run`, if it has one.
    pub fn from_snapshot(snapshot: &Snapshot) -> Option<Result<Self, String>> {
        let (_, json) = snapshot.device.details.iter().find(|(k, _)| k == RECORD_KEY)?;
        Some(serde_json::from_str(json).map_err(|e| format!("{RECORD_KEY}: {e}")))
    }
}

/// A finished (or failed) run.
#[derive(Debug)]
pub struct RunResult {
    /// The snapshot, record attached.
    pub snapshot: Snapshot,
    /// The record.
    pub record: RunRecord,
    /// `memory_summary()` at the end.
    pub summary: String,
    /// The marks.
    pub marks: Vec<Mark>,
}

impl RunResult {
    /// Whether the run finished and every check passed.
    pub fn succeeded(&self) -> bool {
        self.record.error.is_none() && self.record.outcome.passed()
    }
}

/// Opens the device `options` ask for and runs `experiment` on it. A failure of the
/// experiment is recorded in the result (the snapshot shows how far it got); failing to open
/// the device is an error.
pub fn execute(experiment: &Experiment, options: &DeviceOptions) -> Result<RunResult, RuntimeError> {
    let (device, selection) = select::open(options)?;
    Ok(execute_on(experiment, device, selection))
}

/// Runs `experiment` on an opened device.
pub fn execute_on(experiment: &Experiment, device: Box<dyn crate::device::Device>, selection: Selection) -> RunResult {
    let rt = Runtime::new(device);
    let result = experiment.run(&rt);
    record(experiment, &rt, selection, result)
}

/// Runs `experiment` on an opened device with `sink` watching it as it happens
/// ([`crate::stream`]): the sink receives the whole trace, its stacks and marks while the run
/// goes, and may stop it (the result then records [`RuntimeError::Stopped`]). The result is
/// the same as [`execute_on`]'s.
pub fn execute_watched(
    experiment: &Experiment,
    device: Box<dyn crate::device::Device>,
    selection: Selection,
    sink: Box<dyn TraceSink>,
) -> RunResult {
    let rt = Runtime::new(device);
    rt.watch(sink);
    let result = experiment.run(&rt);
    let result = record(experiment, &rt, selection, result);
    // What the experiment's last tensors freed on the way out.
    rt.deliver_watched();
    result
}

/// Runs `experiment` on `rt` without blocking (the browser's WebGPU device: see
/// [`Experiment::run_async`]), with the op file's text for an `ops` experiment, and records
/// it as [`execute_on`] does. The caller keeps `rt`, to watch the allocator while it runs.
pub async fn execute_async(
    experiment: &Experiment,
    rt: &Runtime,
    selection: Selection,
    ops_text: Option<&str>,
) -> RunResult {
    let result = experiment.run_with_ops_text(rt, ops_text).await;
    record(experiment, rt, selection, result)
}

/// The result of a run that ended with `result`: the snapshot with its record attached.
fn record(
    experiment: &Experiment,
    rt: &Runtime,
    selection: Selection,
    result: Result<Outcome, RuntimeError>,
) -> RunResult {
    let (outcome, error) = match result {
        Ok(outcome) => (outcome, None),
        Err(e) => (Outcome::default(), Some(e.to_string())),
    };
    let facts = rt.device_facts();
    let source = format!("run {} on {} ({})", experiment.name(), selection.backend.name(), facts.name);
    let mut snapshot = rt.snapshot(&source);
    snapshot.device.details.extend(rt.run_facts());
    let record = RunRecord {
        experiment: experiment.clone(),
        backend: selection.backend,
        selection: selection.lines,
        discipline: rt.discipline(),
        workspaces: rt.workspaces(),
        profile: rt.run_facts().into_iter().find(|(k, _)| k == "profile").map(|(_, v)| v),
        computes: rt.computes(),
        outcome,
        notes: rt.notes(),
        error,
    };
    record.attach(&mut snapshot);
    RunResult { summary: rt.memory_summary(false), marks: rt.marks(), snapshot, record }
}
