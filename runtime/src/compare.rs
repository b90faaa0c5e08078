//! `compare`: runs side by side — snapshots written by `cachalot run` and PyTorch's
//! `expected.json` — with the differences and, where it can be known, why.
//!
//! The first run is the baseline. For each other run whose marks differ, the reasons are
//! tested, not guessed: each run's snapshot says what it was (the experiment and parameters)
//! and the factors that shape its allocator sequence ([`Factors`]: the matrix-product
//! workspaces, the stream discipline, the allocator settings, the capacity, the largest
//! segment). The experiment is rerun on the simulator, without computing, with the baseline's
//! factors (which must give the baseline's marks) and then with the other run's factors
//! switched in one at a time: a factor that changes the simulated marks is a reason, with the
//! marks and bytes it accounts for, and when the last simulation gives the other run's marks
//! exactly, every difference is explained. What is left is reported as unexplained.
//!
//! Besides marks: stats (peaks, segment counts, device allocations), time per step, losses
//! per step (checked against a relative tolerance), the normalised event sequences of every
//! pair of runs with traces, and the device limits (alignment, buffer and binding sizes).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cachalot_core::{AllocatorConfig, DeviceFacts, MemoryStats, TraceAction, TraceEntry};
use cachalot_trace::Snapshot;
use cachalot_trace::snapshot::file::Timing;

use crate::device::sim::{H200_MEMORY, SimDevice, SimProfile};
use crate::device::{StreamDiscipline, Workspaces};
use crate::error::RuntimeError;
use crate::experiments::{Check, Experiment};
use crate::run::RunRecord;
use crate::runtime::{Runtime, WORKSPACE_FRAME};
use crate::trace::{self, TraceComparison};

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

/// One run as `compare` sees it.
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

/// Options of [`compare`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CompareOptions {
    /// Largest relative difference of losses accepted.
    pub loss_tolerance: f64,
    /// Rerun experiments on the simulator to test reasons.
    pub verify: bool,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions { loss_tolerance: 1e-3, verify: true }
    }
}

/// The outcome of [`compare`].
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The report, as text.
    pub text: String,
    /// Mark differences no reason accounts for.
    pub unexplained: usize,
    /// Loss steps over the tolerance.
    pub loss_failures: usize,
    /// Failed checks or runs that stopped with an error.
    pub failed_runs: usize,
}

impl Report {
    /// Whether nothing is unexplained, losses agree and every run finished with its checks.
    pub fn ok(&self) -> bool {
        self.unexplained == 0 && self.loss_failures == 0 && self.failed_runs == 0
    }
}

// ---- loading ----

/// Reads a cachalot snapshot or a PyTorch `expected.json` (written by
/// `shared/traces/capture.py`).
pub fn load(path: &std::path::Path) -> Result<Column, RuntimeError> {
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let input = |message: String| RuntimeError::Input { path: path.display().to_string(), message };
    let bytes = std::fs::read(path).map_err(|e| input(e.to_string()))?;
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
    let bytes = std::fs::read(expected.with_file_name(format!("{stem}.pickle"))).ok()?;
    let snapshot = cachalot_trace::snapshot::pickle::read_snapshot(&bytes).ok()?;
    snapshot.device_traces.into_iter().next()
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

// ---- simulating ----

/// What the simulator did with an experiment.
#[derive(Clone, Debug)]
pub struct Simulated {
    /// The marks.
    pub marks: Vec<MarkValue>,
    /// The allocator's trace.
    pub trace: Vec<TraceEntry>,
    /// The error that stopped the run, if any.
    pub error: Option<String>,
}

/// Runs `experiment` on the simulator, without computing, with `factors`.
pub fn simulate(experiment: &Experiment, factors: &Factors) -> Result<Simulated, RuntimeError> {
    let profile = SimProfile {
        name: "what-if".into(),
        discipline: factors.discipline,
        workspaces: factors.workspaces,
        capacity: factors.capacity,
        max_segment_size: factors.max_segment_size,
    };
    let config = AllocatorConfig::parse(&factors.settings).map_err(|e| RuntimeError::Parameters(e.to_string()))?;
    let rt = Runtime::new(Box::new(SimDevice::new(profile, config, false)?));
    let error = experiment.run(&rt).err().map(|e| e.to_string());
    let marks =
        rt.marks().into_iter().map(|m| MarkValue { label: m.label, allocated: m.allocated, reserved: m.reserved });
    Ok(Simulated { marks: marks.collect(), trace: rt.trace(), error })
}

/// A factor that differs between two runs: its name, why it matters, and how to switch it.
struct FactorChange {
    name: &'static str,
    description: String,
    apply: fn(&mut Factors, &Factors),
}

fn differing_factors(a: &Column, b: &Column) -> Vec<FactorChange> {
    let (fa, fb) = (&a.factors, &b.factors);
    let mut out = Vec::new();
    if fa.workspaces != fb.workspaces {
        let describe = |ws: Option<Workspaces>, c: &Column| match ws {
            Some(ws) => format!(
                "{} allocates a {} B cuBLAS workspace and a {} B cuBLASLt workspace at its first matrix products, \
                 and keeps them ({})",
                c.name,
                group(ws.cublas),
                group(ws.cublaslt),
                c.workspace_source
            ),
            None => format!("{} allocates no workspace ({})", c.name, c.workspace_source),
        };
        out.push(FactorChange {
            name: "cuBLAS/cuBLASLt workspaces",
            description: format!(
                "{}; {}. {}",
                describe(fa.workspaces, a),
                describe(fb.workspaces, b),
                if fa.workspaces.is_none() || fb.workspaces.is_none() {
                    "PyTorch's CUDA matmuls keep these persistent workspaces; the WGSL matmul of wgpu needs none"
                } else {
                    "PyTorch 2.11 sizes them by compute capability (32 MiB on 9.x, 10.x, 12.x; 8.125 MiB otherwise) \
                     and CUBLAS_WORKSPACE_CONFIG"
                }
            ),
            apply: |f, to| f.workspaces = to.workspaces,
        });
    }
    if fa.settings != fb.settings {
        out.push(FactorChange {
            name: "allocator settings",
            description: format!("settings '{}' vs '{}'", fa.settings, fb.settings),
            apply: |f, to| f.settings = to.settings.clone(),
        });
    }
    if fa.discipline != fb.discipline {
        out.push(FactorChange {
            name: "stream discipline",
            description: format!("{}: {}; {}: {}", a.name, fa.discipline.describe(), b.name, fb.discipline.describe()),
            apply: |f, to| f.discipline = to.discipline,
        });
    }
    if fa.capacity != fb.capacity {
        out.push(FactorChange {
            name: "device memory",
            description: format!("{} B vs {} B", group(fa.capacity), group(fb.capacity)),
            apply: |f, to| f.capacity = to.capacity,
        });
    }
    if fa.max_segment_size != fb.max_segment_size {
        let show = |m: Option<u64>| m.map_or("unlimited".to_owned(), |m| format!("{} B", group(m)));
        out.push(FactorChange {
            name: "largest segment (max_buffer_size)",
            description: format!("{} vs {}", show(fa.max_segment_size), show(fb.max_segment_size)),
            apply: |f, to| f.max_segment_size = to.max_segment_size,
        });
    }
    out
}

/// Labels whose values differ between two mark lists, with labels only one has.
fn mark_differences(a: &[MarkValue], b: &[MarkValue]) -> Vec<String> {
    let bm: BTreeMap<&str, &MarkValue> = b.iter().map(|m| (m.label.as_str(), m)).collect();
    let am: BTreeMap<&str, &MarkValue> = a.iter().map(|m| (m.label.as_str(), m)).collect();
    let mut out: Vec<String> = a
        .iter()
        .filter(|m| bm.get(m.label.as_str()).is_none_or(|o| o.allocated != m.allocated || o.reserved != m.reserved))
        .map(|m| m.label.clone())
        .collect();
    out.extend(b.iter().filter(|m| !am.contains_key(m.label.as_str())).map(|m| m.label.clone()));
    out
}

/// `X − A` per mark, grouped over consecutive marks with the same change.
fn describe_change(before: &[MarkValue], after: &[MarkValue]) -> Vec<String> {
    let am: BTreeMap<&str, &MarkValue> = after.iter().map(|m| (m.label.as_str(), m)).collect();
    let mut groups: Vec<(Vec<&str>, i128, i128)> = Vec::new();
    for m in before {
        let Some(o) = am.get(m.label.as_str()) else { continue };
        let (da, dr) = (o.allocated as i128 - m.allocated as i128, o.reserved as i128 - m.reserved as i128);
        if da == 0 && dr == 0 {
            continue;
        }
        match groups.last_mut() {
            Some((labels, a, r)) if *a == da && *r == dr => labels.push(&m.label),
            _ => groups.push((vec![&m.label], da, dr)),
        }
    }
    groups
        .into_iter()
        .map(|(labels, da, dr)| {
            let at = match labels[..] {
                [one] => one.to_owned(),
                [first, .., last] => format!("{first} .. {last} ({} marks)", labels.len()),
                [] => String::new(),
            };
            format!("{at}: allocated {}, reserved {}", signed(da), signed(dr))
        })
        .collect()
}

// ---- the report ----

/// Compares runs: the first is the baseline (see the module docs).
pub fn compare(columns: &[Column], options: CompareOptions) -> Report {
    let mut report = Report::default();
    let mut out = String::new();
    let letter = |i: usize| (b'A' + (i % 26) as u8) as char;

    // Runs.
    let _ = writeln!(out, "runs");
    for (i, c) in columns.iter().enumerate() {
        let ws = match c.factors.workspaces {
            Some(ws) => format!("workspaces {} + {} B", group(ws.cublas), group(ws.cublaslt)),
            None => "no workspaces".into(),
        };
        let streams = match c.factors.discipline {
            StreamDiscipline::DefaultStream => "default stream",
            StreamDiscipline::QueueStream => "queue stream",
        };
        let settings =
            if c.factors.settings.is_empty() { "default settings".into() } else { c.factors.settings.clone() };
        let _ = writeln!(out, "  {}  {}  {}", letter(i), c.name, c.title);
        let _ = writeln!(out, "     {streams}; {ws}; {settings}");
        if let Some(e) = &c.error {
            let _ = writeln!(out, "     STOPPED: {e}");
            report.failed_runs += 1;
        }
        let failed: Vec<&Check> = c.checks.iter().filter(|k| !k.passed).collect();
        for k in &failed {
            let _ = writeln!(out, "     CHECK FAILED: {}: {}", k.name, k.detail);
        }
        report.failed_runs += usize::from(!failed.is_empty());
    }

    // Marks.
    let mut labels: Vec<&str> = Vec::new();
    for c in columns {
        for m in &c.marks {
            if !labels.contains(&m.label.as_str()) {
                labels.push(&m.label);
            }
        }
    }
    if !labels.is_empty() {
        let _ =
            writeln!(out, "\nmarks: memory_allocated / memory_reserved in bytes ('=': as {}; '*': differs)", letter(0));
        let width = labels.iter().map(|l| l.len()).max().unwrap_or(5).max(5);
        let cell = 27;
        let mut header = format!("  {:<width$}", "mark");
        for i in 0..columns.len() {
            let _ = write!(header, " {:>cell$}", letter(i));
        }
        let _ = writeln!(out, "{header}");
        for label in &labels {
            let base = columns.first().and_then(|c| c.marks.iter().find(|m| m.label == *label));
            let mut row = format!("  {label:<width$}");
            for (i, c) in columns.iter().enumerate() {
                let text = match c.marks.iter().find(|m| m.label == *label) {
                    None => "—".to_owned(),
                    Some(m) if i > 0 && base.is_some_and(|b| b == m) => "=".to_owned(),
                    Some(m) => {
                        let star = if i > 0 { "*" } else { "" };
                        format!("{} / {}{star}", group(m.allocated), group(m.reserved))
                    }
                };
                let _ = write!(row, " {text:>cell$}");
            }
            let _ = writeln!(out, "{row}");
        }
    }

    // Differences and reasons.
    if let Some(base) = columns.first() {
        let mut wrote_header = false;
        for (i, other) in columns.iter().enumerate().skip(1) {
            let diffs = mark_differences(&base.marks, &other.marks);
            if diffs.is_empty() {
                continue;
            }
            if !wrote_header {
                let _ = writeln!(out, "\ndifferences");
                wrote_header = true;
            }
            let _ = writeln!(
                out,
                "  {} vs {}: {} of {} marks differ",
                letter(i),
                letter(0),
                diffs.len(),
                base.marks.len().max(other.marks.len())
            );
            let unexplained = explain(base, other, options, &mut out);
            report.unexplained += unexplained;
        }
    }

    stats_section(columns, &mut out);
    timing_section(columns, &mut out);
    report.loss_failures = loss_section(columns, options.loss_tolerance, &mut out);
    events_section(columns, options, &mut out);
    limits_section(columns, &mut out);

    let verdict = if report.ok() {
        "every difference has a known reason".to_owned()
    } else {
        format!(
            "{} unexplained mark difference(s), {} loss step(s) over tolerance, {} run(s) stopped or failed checks",
            report.unexplained, report.loss_failures, report.failed_runs
        )
    };
    let _ = writeln!(out, "\nverdict: {verdict}");
    report.text = out;
    report
}

/// Writes the reasons `other` differs from `base`; returns how many differing marks stay
/// unexplained.
fn explain(base: &Column, other: &Column, options: CompareOptions, out: &mut String) -> usize {
    let diffs = mark_differences(&base.marks, &other.marks);
    let changes = differing_factors(base, other);
    let experiment = match (&base.experiment, &other.experiment) {
        (Some(a), Some(b)) if a != b => {
            let _ = writeln!(out, "    reason: different experiments or parameters ({} vs {})", a.name(), b.name());
            return 0;
        }
        (Some(a), Some(_)) => Some(a),
        // A run whose program is unknown (another tool's snapshot) cannot be rerun.
        _ => None,
    };
    let verified = match experiment.filter(|_| options.verify) {
        Some(experiment) => verify(experiment, base, other, &changes, out),
        None => None,
    };
    if let Some(left) = verified {
        return left;
    }
    // Not verifiable: name the factors that differ as possible causes.
    if changes.is_empty() {
        let _ = writeln!(out, "    no factor known to cachalot differs: unexplained at {}", diffs.join(", "));
        return diffs.len();
    }
    for c in &changes {
        let _ = writeln!(out, "    possible reason (not verified): {}: {}", c.name, c.description);
    }
    let _ = writeln!(out, "    unexplained (no experiment to rerun): {}", diffs.join(", "));
    diffs.len()
}

/// Tests the factors on the simulator; `None` when the simulator cannot reproduce the baseline.
fn verify(
    experiment: &Experiment,
    base: &Column,
    other: &Column,
    changes: &[FactorChange],
    out: &mut String,
) -> Option<usize> {
    let mut factors = base.factors.clone();
    let mut marks = match simulate(experiment, &factors) {
        Ok(sim) => sim.marks,
        Err(e) => {
            let _ = writeln!(out, "    cannot rerun {} on the simulator: {e}", experiment.name());
            return None;
        }
    };
    let off = mark_differences(&base.marks, &marks);
    if !off.is_empty() {
        let _ = writeln!(
            out,
            "    the simulator with {}'s factors does not reproduce its marks (at {}): reasons cannot be verified",
            base.name,
            off.join(", ")
        );
        return None;
    }
    for change in changes {
        (change.apply)(&mut factors, &other.factors);
        let (next, error) = match simulate(experiment, &factors) {
            Ok(sim) => (sim.marks, sim.error),
            Err(e) => {
                let _ = writeln!(out, "    cannot rerun with {}: {e}", change.name);
                return None;
            }
        };
        let effect = describe_change(&marks, &next);
        if effect.is_empty() && mark_differences(&marks, &next).is_empty() {
            let _ = writeln!(out, "    differs, no effect on the marks: {}: {}", change.name, change.description);
        } else {
            let _ = writeln!(out, "    reason: {}: {}", change.name, change.description);
            for line in effect {
                let _ = writeln!(out, "      {line}");
            }
            if let Some(e) = error {
                let _ = writeln!(out, "      the simulated run stops: {e}");
            }
        }
        marks = next;
    }
    let left = mark_differences(&marks, &other.marks);
    if left.is_empty() {
        let _ = writeln!(
            out,
            "    verified: the simulator running {} with {}'s factors switched to {}'s gives {}'s marks exactly",
            experiment.name(),
            base.name,
            other.name,
            other.name
        );
    } else {
        let _ = writeln!(out, "    unexplained: the simulator with {}'s factors differs from it at:", other.name);
        for line in describe_change(&marks, &other.marks) {
            let _ = writeln!(out, "      {line}");
        }
        let missing: Vec<&String> = left.iter().filter(|l| !other.marks.iter().any(|m| &m.label == *l)).collect();
        if !missing.is_empty() {
            let _ = writeln!(out, "      marks only one has: {missing:?}");
        }
    }
    Some(left.len())
}

/// Reads one number of the stats.
type StatOf = fn(&MemoryStats) -> i64;

fn stats_section(columns: &[Column], out: &mut String) {
    let rows: [(&str, StatOf); 8] = [
        ("peak allocated", |s| s.allocated_bytes.all().peak),
        ("peak reserved", |s| s.reserved_bytes.all().peak),
        ("segments at end", |s| s.segment.all().current),
        ("peak segments", |s| s.segment.all().peak),
        ("device allocations", |s| s.num_device_alloc as i64),
        ("allocations", |s| s.allocation.all().allocated),
        ("alloc retries", |s| s.num_alloc_retries as i64),
        ("OOMs", |s| s.num_ooms as i64),
    ];
    if columns.iter().all(|c| c.stats.is_none()) {
        return;
    }
    let _ = writeln!(out, "\nstats at the end ('*': differs from A)");
    for (name, get) in rows {
        let base = columns.first().and_then(|c| c.stats.as_ref()).map(get);
        let mut row = format!("  {name:<22}");
        for (i, c) in columns.iter().enumerate() {
            let text = match c.stats.as_ref().map(get) {
                None => "—".to_owned(),
                Some(v) => group(v.max(0) as u64),
            };
            let star = if i > 0 && c.stats.as_ref().map(get) != base { "*" } else { "" };
            let _ = write!(row, " {:>20}", format!("{text}{star}"));
        }
        let _ = writeln!(out, "{row}");
    }
}

fn timing_section(columns: &[Column], out: &mut String) {
    let mut labels: Vec<&str> = Vec::new();
    for c in columns {
        for t in &c.timings {
            if !labels.contains(&t.label.as_str()) {
                labels.push(&t.label);
            }
        }
    }
    if labels.is_empty() {
        return;
    }
    let _ = writeln!(out, "\ntime (seconds; ratio to the first run that has it)");
    let seconds = |c: &Column, label: &str| c.timings.iter().find(|t| t.label == label).map(|t| t.seconds);
    let mut totals = vec![0.0f64; columns.len()];
    for label in &labels {
        let base = columns.iter().find_map(|c| seconds(c, label));
        let mut row = format!("  {label:<22}");
        for (i, c) in columns.iter().enumerate() {
            let text = match (seconds(c, label), base) {
                (Some(s), Some(b)) if b > 0.0 => {
                    totals[i] += s;
                    format!("{s:.4} ({:.2}x)", s / b)
                }
                (Some(s), _) => {
                    totals[i] += s;
                    format!("{s:.4}")
                }
                (None, _) => "—".into(),
            };
            let _ = write!(row, " {text:>20}");
        }
        let _ = writeln!(out, "{row}");
    }
    let mut row = format!("  {:<22}", "total");
    for t in &totals {
        let _ = write!(row, " {:>20}", format!("{t:.4}"));
    }
    let _ = writeln!(out, "{row}");
}

/// Writes the loss table; returns the steps over tolerance.
fn loss_section(columns: &[Column], tolerance: f64, out: &mut String) -> usize {
    let with: Vec<(usize, &Column)> = columns.iter().enumerate().filter(|(_, c)| !c.losses.is_empty()).collect();
    let Some(&(base_index, base)) = with.first() else { return 0 };
    if with.len() < 2 {
        return 0;
    }
    let letter = |i: usize| (b'A' + (i % 26) as u8) as char;
    let _ = writeln!(out, "\nloss per step (relative difference to {}, tolerance {tolerance:.0e})", letter(base_index));
    let steps = with.iter().map(|(_, c)| c.losses.len()).max().unwrap_or(0);
    let mut failures = 0;
    let mut worst = vec![0.0f64; columns.len()];
    let mut header = format!("  {:<10}", "step");
    for &(i, _) in &with {
        let _ = write!(header, " {:>24}", letter(i));
    }
    let _ = writeln!(out, "{header}");
    for s in 0..steps {
        let mut row = format!("  {s:<10}");
        let b = base.losses.get(s).copied();
        for &(i, c) in &with {
            let text = match (c.losses.get(s).copied(), b) {
                (Some(v), Some(b)) if i != base_index => {
                    let rel = (v as f64 - b as f64).abs() / (b as f64).abs().max(1e-12);
                    // NaN counts as a failure.
                    let bad = rel.is_nan() || rel > tolerance;
                    failures += usize::from(bad);
                    worst[i] = worst[i].max(if rel.is_nan() { f64::INFINITY } else { rel });
                    format!("{v:.6} ({rel:.1e}){}", if bad { " !" } else { "" })
                }
                (Some(v), _) => format!("{v:.6}"),
                (None, _) => {
                    failures += usize::from(i != base_index);
                    "—".into()
                }
            };
            let _ = write!(row, " {text:>24}");
        }
        let _ = writeln!(out, "{row}");
    }
    for &(i, _) in with.iter().skip(1) {
        let verdict = if worst[i] <= tolerance { "agree" } else { "DISAGREE" };
        let _ = writeln!(
            out,
            "  {} vs {}: largest relative difference {:.2e}: {verdict}",
            letter(i),
            letter(base_index),
            worst[i]
        );
    }
    failures
}

fn events_section(columns: &[Column], options: CompareOptions, out: &mut String) {
    let traced: Vec<(usize, &Column, &Vec<TraceEntry>)> =
        columns.iter().enumerate().filter_map(|(i, c)| c.trace.as_ref().map(|t| (i, c, t))).collect();
    if traced.is_empty() {
        return;
    }
    let letter = |i: usize| (b'A' + (i % 26) as u8) as char;
    let _ = writeln!(out, "\nallocator events (addresses as segment index + offset)");
    let mut reproduced = vec![false; columns.len()];
    for &(i, c, t) in &traced {
        let Some(experiment) = c.experiment.as_ref().filter(|_| options.verify) else { continue };
        let line = match simulate(experiment, &c.factors) {
            Ok(sim) => match trace::compare(t, &sim.trace) {
                TraceComparison::Identical { entries } => {
                    reproduced[i] = true;
                    format!("the same {entries} events as the simulator running {} with its factors", experiment.name())
                }
                other => format!("differs from the simulator with its factors: {}", describe_comparison(&other)),
            },
            Err(e) => format!("cannot rerun on the simulator: {e}"),
        };
        let _ = writeln!(out, "  {}: {line}", letter(i));
    }
    for (x, &(i, a, ta)) in traced.iter().enumerate() {
        for &(j, b, tb) in &traced[x + 1..] {
            let line = match trace::compare(ta, tb) {
                TraceComparison::Identical { entries } => format!("identical ({entries} events)"),
                TraceComparison::FreeCompletionOnly { entries, moved } => {
                    let queue = [a, b].into_iter().find(|c| c.factors.discipline == StreamDiscipline::QueueStream);
                    let why = match queue {
                        Some(q) => format!(
                            "{} records kernel operands on its queue stream (record_stream), so a freed block \
                             returns to the cache at the next allocator call after its submission",
                            q.name
                        ),
                        None => "free completions moved".into(),
                    };
                    format!("the same {entries} decisions; {moved} free_completed at another point: {why}")
                }
                other @ TraceComparison::Differ { .. } => {
                    let mut line = describe_comparison(&other);
                    if reproduced[i] && reproduced[j] {
                        line.push_str(
                            "; both are the simulator's events with their own factors, so the factors that differ \
                             (above) account for it",
                        );
                    }
                    line
                }
            };
            let _ = writeln!(out, "  {} vs {}: {line}", letter(j), letter(i));
        }
    }
}

fn describe_comparison(comparison: &TraceComparison) -> String {
    let show = |e: &Option<crate::trace::NormalizedEntry>| e.map_or("(end)".to_owned(), |e| e.to_string());
    match comparison {
        TraceComparison::Identical { entries } => format!("identical ({entries} events)"),
        TraceComparison::FreeCompletionOnly { entries, moved } => {
            format!("the same {entries} decisions, {moved} free_completed at another point")
        }
        TraceComparison::Differ { index, a, b } => format!("differ from event {index}: {} vs {}", show(a), show(b)),
    }
}

fn limits_section(columns: &[Column], out: &mut String) {
    let with: Vec<(usize, &Column, &DeviceFacts)> =
        columns.iter().enumerate().filter_map(|(i, c)| c.facts.as_ref().map(|f| (i, c, f))).collect();
    if with.is_empty() {
        return;
    }
    let letter = |i: usize| (b'A' + (i % 26) as u8) as char;
    let _ = writeln!(out, "\ndevice limits");
    for (i, c, facts) in with {
        let detail = |key: &str| facts.details.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let largest = c
            .trace
            .as_ref()
            .and_then(|t| t.iter().filter(|e| e.action == TraceAction::SegmentAlloc).map(|e| e.size).max())
            .unwrap_or(0);
        let mut parts = vec![format!("blocks {}-byte aligned", facts.alignment)];
        if let Some(align) = detail("min_storage_buffer_offset_alignment") {
            parts.push(format!(
                "storage offsets must be multiples of {align} (min_storage_buffer_offset_alignment), which {} \
                 satisfies: alignment changes nothing",
                facts.alignment
            ));
        }
        if let Some(max) = facts.max_segment_size {
            let fits = if largest <= max { "fits" } else { "DOES NOT FIT" };
            parts.push(format!(
                "segments up to {} B (max_buffer_size); largest in this run {} B: {fits}",
                group(max),
                group(largest)
            ));
        }
        if let Some(max) = facts.max_binding_size {
            parts.push(format!("kernel bindings up to {} B (max_storage_buffer_binding_size)", group(max)));
        }
        let _ = writeln!(out, "  {}: {}", letter(i), parts.join("; "));
        for note in &c.notes {
            let _ = writeln!(out, "     note: {note}");
        }
    }
}

/// `1234567` as `1,234,567`.
pub use cachalot_core::error::group_digits as group;

fn signed(n: i128) -> String {
    let sign = if n < 0 { "−" } else { "+" };
    format!("{sign}{} B", group(n.unsigned_abs() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_digits_and_names_architectures() {
        assert_eq!(group(34603008), "34,603,008");
        assert_eq!(group(512), "512");
        assert_eq!(group(0), "0");
        assert_eq!(major_of("NVIDIA H200"), Some(9));
        assert_eq!(major_of("NVIDIA A100-SXM4-80GB"), Some(8));
        assert_eq!(major_of("llvmpipe"), None);
    }
}
