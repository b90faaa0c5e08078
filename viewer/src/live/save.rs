//! A run shown in the viewer written back as a file: a cachalot snapshot (JSON, everything the
//! viewer and `compare` read) or a PyTorch snapshot pickle (what
//! `torch.cuda.memory._dump_snapshot` writes, for memory_viz and other PyTorch tools).
//!
//! A live run's entries arrived in batches and its end state with `Finished`; the file joins
//! them: the experiment's end snapshot (device facts with the run's record, settings, segments,
//! `memory_stats()`, timings) with the trace, stacks and marks the viewer received. Loading the
//! file gives the same run the window showed (`viewer/tests/live.rs` checks it).

use cachalot_trace::Snapshot;
use cachalot_trace::snapshot::file::{FORMAT, VERSION};
use cachalot_trace::snapshot::{pickle, torch};

use crate::model::Run;

/// The kinds of file a run is saved as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveFormat {
    /// cachalot's snapshot (JSON).
    Cachalot,
    /// PyTorch's snapshot pickle.
    TorchPickle,
}

impl SaveFormat {
    /// The usual file name extension.
    pub fn extension(self) -> &'static str {
        match self {
            SaveFormat::Cachalot => "json",
            SaveFormat::TorchPickle => "pickle",
        }
    }
}

/// Why a run cannot be saved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SaveError {
    /// Entries may still arrive.
    #[error("{0}: the run is still going (stop it or wait for its end)")]
    StillRunning(String),
    /// Neither the file nor the experiment said what the end state was.
    #[error("{0}: the run has no recorded end state to save")]
    NoEndState(String),
    /// The device is unknown (a file without device facts).
    #[error("{0}: the run does not say which device it ran on")]
    NoDevice(String),
    /// The configuration or the pickle could not be written.
    #[error("{name}: {message}")]
    Write {
        /// The run.
        name: String,
        /// What failed.
        message: String,
    },
}

/// The run as a cachalot snapshot. `end` is what the experiment sent with `Finished` (its
/// header and end state; its trace is ignored); without it, the run's own recorded end state
/// is used (a file that was opened).
pub fn run_snapshot(run: &Run, end: Option<&Snapshot>) -> Result<Snapshot, SaveError> {
    if run.live {
        return Err(SaveError::StillRunning(run.name.clone()));
    }
    let mut snapshot = match end {
        Some(end) => Snapshot { trace: Vec::new(), ..end.clone() },
        None => {
            let device = run.device.clone().ok_or_else(|| SaveError::NoDevice(run.name.clone()))?;
            let (Some(segments), Some(stats)) = (&run.recorded_end, &run.recorded_stats) else {
                return Err(SaveError::NoEndState(run.name.clone()));
            };
            Snapshot {
                format: FORMAT.into(),
                version: VERSION,
                source: run.source.clone(),
                device,
                settings: run.settings.clone(),
                memory_fraction: run.memory_fraction,
                segments: segments.clone(),
                trace: Vec::new(),
                stacks: Vec::new(),
                annotations: Vec::new(),
                stats: stats.clone(),
                marks: Vec::new(),
                timings: Vec::new(),
                trace_complete: !run.initial_inferred,
            }
        }
    };
    snapshot.trace = run.trace.clone();
    snapshot.stacks = run.contexts.stacks().iter().map(|s| s.to_vec()).collect();
    snapshot.annotations = run.contexts.annotations().to_vec();
    snapshot.marks = run.marks.clone();
    Ok(snapshot)
}

/// The bytes of the run saved as `format` (see [`run_snapshot`] for `end`).
pub fn run_bytes(run: &Run, end: Option<&Snapshot>, format: SaveFormat) -> Result<Vec<u8>, SaveError> {
    let snapshot = run_snapshot(run, end)?;
    let write = |message: String| SaveError::Write { name: run.name.clone(), message };
    match format {
        SaveFormat::Cachalot => Ok(snapshot.to_json()),
        SaveFormat::TorchPickle => {
            let torch = torch::from_snapshot(&snapshot).map_err(|e| write(format!("settings: {e}")))?;
            pickle::write_snapshot(&torch).map_err(|e| write(e.to_string()))
        }
    }
}
