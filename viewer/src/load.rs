//! Turning the bytes of a file into runs: cachalot snapshots (JSON), PyTorch snapshot pickles
//! (one run per device trace) and op files (replayed on the simulator). Recognised by content,
//! as the command line's `input` module does.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cachalot_core::{AllocatorConfig, CachingAllocator, SegmentSnapshot, SimBackend, StreamId};
use cachalot_trace::Snapshot;
use cachalot_trace::ops::OpFile;
use cachalot_trace::replay::{DEFAULT_DEVICE_TOTAL, ReplayOptions, replay};
use cachalot_trace::snapshot::torch::{TorchSegment, TorchSnapshot};
use cachalot_trace::snapshot::{FileFormat, pickle};

use crate::model::{Rules, Run, RunKind};

/// A file that cannot be opened.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// Nothing in it.
    #[error("{0}: the file is empty")]
    Empty(String),
    /// Not a format the viewer knows.
    #[error("{0}: not a cachalot snapshot (JSON), a PyTorch snapshot pickle or an op file")]
    Unrecognised(String),
    /// A known format, but broken; the message names the place.
    #[error("{name}: {message}")]
    Invalid {
        /// File name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A pickle with neither trace entries nor segments.
    #[error("{0}: the snapshot holds no segments and no trace")]
    NoTrace(String),
}

/// How far a load has come, shared with the thread doing it.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    done: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
}

impl Progress {
    /// Records progress.
    pub fn set(&self, done: usize, total: usize) {
        self.done.store(done, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
    }

    /// Fraction done, 0 to 1.
    pub fn fraction(&self) -> f32 {
        let total = self.total.load(Ordering::Relaxed);
        match total {
            0 => 0.0,
            t => self.done.load(Ordering::Relaxed) as f32 / t as f32,
        }
    }
}

/// Parses the bytes of a file called `name` and builds its runs.
pub fn load_bytes(name: &str, bytes: &[u8], progress: &Progress) -> Result<Vec<Run>, LoadError> {
    let invalid = |message: String| LoadError::Invalid { name: name.to_owned(), message };
    match FileFormat::detect(bytes) {
        FileFormat::TorchPickle => {
            let torch = pickle::read_snapshot(bytes).map_err(|e| invalid(e.to_string()))?;
            torch_runs(name, torch, progress)
        }
        FileFormat::Cachalot => {
            let snapshot = Snapshot::from_json(bytes).map_err(|e| invalid(e.to_string()))?;
            Ok(vec![snapshot_run(name, snapshot, RunKind::Cachalot, progress)])
        }
        FileFormat::Ops => {
            let text = std::str::from_utf8(bytes).map_err(|e| invalid(format!("not UTF-8 text: {e}")))?;
            let ops = OpFile::parse(text).map_err(|e| invalid(e.to_string()))?;
            Ok(vec![ops_run(name, &ops, progress)])
        }
        FileFormat::Empty => Err(LoadError::Empty(name.to_owned())),
        FileFormat::Unknown => Err(LoadError::Unrecognised(name.to_owned())),
    }
}

/// A run from a cachalot snapshot.
pub fn snapshot_run(name: &str, snapshot: Snapshot, kind: RunKind, progress: &Progress) -> Run {
    let rules = AllocatorConfig::parse(&snapshot.settings).map(|c| Rules::from_config(&c)).unwrap_or_default();
    let mut run = Run::new(name, kind, rules);
    run.contexts = snapshot.context_table();
    run.source = snapshot.source;
    run.device = Some(snapshot.device);
    run.settings = snapshot.settings;
    run.memory_fraction = snapshot.memory_fraction;
    run.marks = snapshot.marks;
    run.trace = snapshot.trace;
    run.recorded_end = Some(snapshot.segments);
    run.recorded_stats = Some(snapshot.stats);
    run.build(snapshot.trace_complete, |done, total| progress.set(done, total));
    run
}

/// The rules of a PyTorch snapshot's `allocator_settings`.
fn torch_rules(torch: &TorchSnapshot) -> (Rules, String) {
    let Some(settings) = &torch.allocator_settings else { return (Rules::default(), String::new()) };
    let mut rules = AllocatorConfig::parse(&settings.settings).map(|c| Rules::from_config(&c)).unwrap_or_default();
    // The parsed fields are what PyTorch really used, whatever the string says.
    rules.divisions = settings.roundup_power2_divisions;
    rules.max_split = u64::try_from(settings.max_split_size).unwrap_or(u64::MAX);
    rules.expandable = settings.expandable_segments;
    (rules, settings.settings.clone())
}

fn torch_segment(s: &TorchSegment) -> SegmentSnapshot {
    SegmentSnapshot {
        address: s.address,
        total_size: s.total_size,
        allocated_size: s.allocated_size,
        active_size: s.active_size,
        requested_size: s.requested_size,
        stream: StreamId(s.stream),
        pool: s.segment_type,
        is_expandable: s.is_expandable,
        pool_id: cachalot_core::PoolId(s.segment_pool_id.0.max(0) as u64, s.segment_pool_id.1.max(0) as u64),
        context: s.frames,
        blocks: s
            .blocks
            .iter()
            .map(|b| cachalot_core::BlockSnapshot {
                address: b.address,
                size: b.size,
                requested_size: b.requested_size,
                state: b.state,
                context: b.frames,
            })
            .collect(),
    }
}

/// One run per device with trace entries or segments. A snapshot taken without history
/// (`torch.cuda.memory_snapshot()`, or `_record_memory_history(enabled="state")`) becomes a
/// run of no entries that shows its segments.
fn torch_runs(name: &str, mut torch: TorchSnapshot, progress: &Progress) -> Result<Vec<Run>, LoadError> {
    let (rules, settings) = torch_rules(&torch);
    let mut devices: Vec<usize> =
        (0..torch.device_traces.len()).filter(|&d| !torch.device_traces[d].is_empty()).collect();
    for s in &torch.segments {
        let d = usize::try_from(s.device).unwrap_or(0);
        if !devices.contains(&d) {
            devices.push(d);
        }
    }
    devices.sort_unstable();
    if devices.is_empty() {
        return Err(LoadError::NoTrace(name.to_owned()));
    }
    let mut runs = Vec::new();
    for &device in &devices {
        let label = if devices.len() > 1 { format!("{name} [device {device}]") } else { name.to_owned() };
        let mut run = Run::new(label, RunKind::Torch { device }, rules.clone());
        run.source = format!("PyTorch snapshot {name}");
        run.settings = settings.clone();
        run.contexts = torch.contexts.clone();
        run.trace = torch.device_traces.get_mut(device).map(std::mem::take).unwrap_or_default();
        let complete = !run.trace.is_empty();
        let mut end: Vec<SegmentSnapshot> =
            torch.segments.iter().filter(|s| s.device == device as i64).map(torch_segment).collect();
        end.sort_by_key(|s| s.address);
        run.recorded_end = Some(end);
        // PyTorch's ring buffer may have dropped the start: `build` notices entries about
        // memory it never saw allocated and then works backwards from the end state.
        run.build(complete, |done, total| progress.set(done, total));
        runs.push(run);
    }
    Ok(runs)
}

/// An op file replayed on the simulator with history recording.
fn ops_run(name: &str, ops: &OpFile, progress: &Progress) -> Run {
    let mut failure = None;
    let snapshot = match CachingAllocator::new(SimBackend::new(DEFAULT_DEVICE_TOTAL), AllocatorConfig::default()) {
        Ok(mut allocator) => {
            allocator.record_history(true, usize::MAX, &[], false);
            let mut handles = vec![None; ops.handles];
            if let Err(e) = ops.replay(&mut allocator, &mut handles, false) {
                failure = Some(e.to_string());
            }
            Some(Snapshot::capture(&allocator, format!("op file {name} on the simulator")))
        }
        Err(e) => {
            failure = Some(e.to_string());
            None
        }
    };
    let mut run = match snapshot {
        Some(snapshot) => snapshot_run(name, snapshot, RunKind::Ops, progress),
        None => Run::new(name, RunKind::Ops, Rules::default()),
    };
    if let Some(message) = failure {
        run.anomalies.insert(0, crate::model::Anomaly { index: run.end() as u32, message });
        run.anomaly_count += 1;
    }
    run
}

/// Replays a PyTorch run's trace through cachalot's allocator on the simulator, for comparing
/// what PyTorch recorded with what cachalot does.
pub fn replay_run(run: &Run, progress: &Progress) -> Result<Run, String> {
    let mut torch = TorchSnapshot {
        device_traces: vec![run.trace.clone()],
        contexts: run.contexts.clone(),
        ..TorchSnapshot::default()
    };
    torch.allocator_settings = AllocatorConfig::parse(&run.settings)
        .ok()
        .map(|c| cachalot_trace::snapshot::torch::TorchAllocatorSettings::from_config(&c));
    let mut options = ReplayOptions::for_snapshot(&torch, None).map_err(|e| e.to_string())?;
    if let Some(device) = &run.device {
        options.device_total = device.total_memory;
    }
    let outcome = replay(&torch, &options, |done, total| progress.set(done, total)).map_err(|e| e.to_string())?;
    let snapshot = Snapshot::capture(&outcome.allocator, format!("cachalot replay of {}", run.name));
    let mut replayed = snapshot_run(&format!("{} (cachalot replay)", run.name), snapshot, RunKind::Replay, progress);
    for d in outcome.divergences.iter().take(20) {
        replayed.anomalies.push(crate::model::Anomaly { index: d.index as u32, message: d.message.clone() });
    }
    replayed.anomaly_count += outcome.divergences.len();
    Ok(replayed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_bytes_are_errors() {
        let p = Progress::default();
        assert!(matches!(load_bytes("x", b"", &p), Err(LoadError::Empty(_))));
        assert!(matches!(load_bytes("x", b"  \n", &p), Err(LoadError::Empty(_))));
        assert!(matches!(load_bytes("x", b"hello", &p), Err(LoadError::Unrecognised(_))));
        assert!(matches!(load_bytes("x", b"{\"format\": 3", &p), Err(LoadError::Invalid { .. })));
        assert!(matches!(load_bytes("x", b"\x80\x04garbage", &p), Err(LoadError::Invalid { .. })));
        assert!(matches!(load_bytes("x", b"a 0\n", &p), Err(LoadError::Invalid { .. })));
    }

    #[test]
    fn a_snapshot_without_history_shows_its_segments() {
        let mut a = CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default()).unwrap();
        let _x = a.malloc(5 << 20, StreamId::DEFAULT).unwrap();
        let _y = a.malloc(1000, StreamId(3)).unwrap();
        let mut torch = cachalot_trace::snapshot::torch::from_allocator(&a, None);
        torch.device_traces.clear();
        let bytes = pickle::write_snapshot(&torch).unwrap();
        let runs = load_bytes("state.pickle", &bytes, &Progress::default()).unwrap();
        let run = &runs[0];
        assert_eq!((run.trace.len(), run.end()), (0, 0));
        assert!(!run.initial_inferred);
        assert_eq!(run.head().segments.len(), 2);
        assert_eq!(run.head().stats.allocated_bytes.all().current, (5 << 20) + 1024);
        assert!(matches!(run.verification, crate::model::Verification::Matches { .. }));
    }

    #[test]
    fn op_files_replay_on_the_simulator() {
        let runs = load_bytes("ops", b"a 0 1048576\na 1 512 7\nf 0\n", &Progress::default()).unwrap();
        let run = &runs[0];
        assert_eq!(run.kind, RunKind::Ops);
        assert_eq!(run.trace.len(), 6, "{:?}", run.trace);
        assert!(matches!(run.verification, crate::model::Verification::Matches { .. }));
    }
}
