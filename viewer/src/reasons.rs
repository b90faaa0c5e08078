//! Why two runs differ: `cachalot compare`'s analysis ([`cachalot_runtime::comparison`]) of the
//! side-by-side panel's two runs, shown as a panel instead of text.
//!
//! The analysis reruns the runs' experiment on the simulator with one factor (workspaces, stream
//! discipline, settings, capacity, largest segment) switched at a time, which takes from a moment
//! to seconds: it runs on a thread when asked for, and the panel shows its result when it comes.
//! Natively only: the browser has neither the threads nor the runtime.

use std::sync::mpsc;

use cachalot_runtime::comparison::{
    CompareOptions, Comparison, Explanation, FactorDifference, FailedRerun, MarkShift, compare_runs, from_snapshot,
};
use cachalot_trace::Snapshot;
use cachalot_trace::snapshot::file::{FORMAT, VERSION};

use crate::format;
use crate::model::Run;

/// What the panel remembers: the pair it explained (or is explaining) and the answer.
#[derive(Debug, Default)]
pub struct ReasonsState {
    /// The runs (by name) of the analysis shown or under way.
    pair: Option<(String, String)>,
    /// The analysis under way.
    pending: Option<mpsc::Receiver<Result<Comparison, String>>>,
    /// Its answer.
    answer: Option<Result<Comparison, String>>,
}

impl ReasonsState {
    /// Whether an analysis is under way.
    pub fn is_running(&self) -> bool {
        self.pending.is_some()
    }

    /// Waits for the analysis under way (for tests and headless pictures).
    pub fn wait(&mut self) {
        if let Some(receiver) = self.pending.take() {
            self.answer = Some(receiver.recv().unwrap_or_else(|_| Err("the analysis stopped".into())));
        }
    }

    /// The answer, once there is one.
    pub fn answer(&self) -> Option<&Result<Comparison, String>> {
        self.answer.as_ref()
    }

    /// Starts the analysis of `a` against `b` (the baseline first).
    pub fn start(&mut self, a: &Run, b: &Run) {
        self.pair = Some((a.name.clone(), b.name.clone()));
        self.answer = None;
        let snapshots = [snapshot_of(a), snapshot_of(b)];
        let names = [a.name.clone(), b.name.clone()];
        let (send, receive) = mpsc::channel();
        self.pending = Some(receive);
        std::thread::spawn(move || {
            let result = explain(names, snapshots);
            // The panel may have moved on to another pair; then nobody listens.
            let _ = send.send(result);
        });
    }

    /// Takes the answer of the analysis under way, if it has come.
    fn poll(&mut self) {
        if let Some(receiver) = &self.pending {
            match receiver.try_recv() {
                Ok(result) => {
                    self.answer = Some(result);
                    self.pending = None;
                }
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.answer = Some(Err("the analysis stopped".into()));
                    self.pending = None;
                }
            }
        }
    }
}

/// The comparison of two runs' snapshots (the first the baseline), as `cachalot compare` makes it.
fn explain(names: [String; 2], snapshots: [Option<Snapshot>; 2]) -> Result<Comparison, String> {
    let mut columns = Vec::with_capacity(2);
    for (name, snapshot) in names.into_iter().zip(snapshots) {
        let snapshot = snapshot.ok_or_else(|| {
            format!("{name} names no device: the reasons need runs of cachalot (snapshots of `cachalot run`)")
        })?;
        columns.push(from_snapshot(name.clone(), snapshot).map_err(|e| format!("{name}: {e}"))?);
    }
    Ok(compare_runs(columns, CompareOptions::default()))
}

/// The snapshot a loaded run came from, as far as the analysis reads one: device (with the run
/// record `cachalot run` keeps in it), settings, marks, trace, end state and stats. `None` for a
/// run that names no device (a PyTorch pickle without its `expected.json`).
fn snapshot_of(run: &Run) -> Option<Snapshot> {
    Some(Snapshot {
        format: FORMAT.into(),
        version: VERSION,
        source: run.source.clone(),
        device: run.device.clone()?,
        settings: run.settings.clone(),
        memory_fraction: run.memory_fraction,
        segments: run.recorded_end.clone().unwrap_or_default(),
        trace: run.trace.clone(),
        stacks: run.contexts.stacks().iter().map(|s| s.to_vec()).collect(),
        annotations: run.contexts.annotations().to_vec(),
        stats: run.recorded_stats.clone().unwrap_or_default(),
        marks: run.marks.clone(),
        timings: Vec::new(),
        trace_complete: !run.initial_inferred,
    })
}

/// The "Why they differ" section for runs `a` (baseline) and `b`.
pub fn ui(ui: &mut egui::Ui, a: &Run, b: &Run, state: &mut ReasonsState) {
    state.poll();
    let current = state.pair.as_ref().is_some_and(|(x, y)| *x == a.name && *y == b.name);
    egui::CollapsingHeader::new("Why they differ").id_salt("why_they_differ").show(ui, |ui| {
        ui.horizontal(|ui| {
            let label = if current && state.answer.is_some() { "explain again" } else { "explain" };
            let button = ui.add_enabled(!state.is_running(), egui::Button::new(label)).on_hover_text(
                "rerun the experiment on the simulator with one factor switched at a time, as `cachalot compare` does",
            );
            if button.clicked() {
                state.start(a, b);
            }
            if state.is_running() {
                ui.spinner();
                ui.label("rerunning on the simulator…");
                ui.ctx().request_repaint();
            }
        });
        match (current, &state.answer) {
            (true, Some(Ok(comparison))) => show(ui, comparison),
            (true, Some(Err(error))) => {
                ui.colored_label(ui.visuals().error_fg_color, error);
            }
            _ => {}
        }
    });
}

/// One comparison's verdict, reasons and event comparison.
fn show(ui: &mut egui::Ui, comparison: &Comparison) {
    let verdict = &comparison.verdict;
    if verdict.ok() {
        ui.label("✔ every difference has a known reason");
    } else {
        ui.colored_label(
            ui.visuals().warn_fg_color,
            format!(
                "{} mark difference(s) without a known reason, {} loss step(s) over tolerance, {} run(s) stopped or failed checks",
                verdict.unexplained, verdict.loss_failures, verdict.failed_runs
            ),
        );
    }
    if comparison.differences.is_empty() {
        ui.label("the marks agree");
    }
    for difference in &comparison.differences {
        match &difference.explanation {
            Explanation::DifferentExperiments { base, other } => {
                ui.label(format!("different experiments or parameters ({base} vs {other})"));
            }
            Explanation::Tested(test) => {
                ui.label(format!("{} reran on the simulator, one factor switched at a time:", test.experiment));
                for tested in &test.factors {
                    let mark = if tested.is_reason() { "✔ a reason" } else { "✖ no effect" };
                    factor(ui, mark, &tested.factor, &tested.shifts);
                    if let Some(error) = &tested.simulation_error {
                        ui.label(format!("    the simulation stopped: {error}"));
                    }
                }
                unexplained(ui, &test.unexplained, &test.remaining);
            }
            Explanation::Untested { failed_rerun, factors, unexplained: labels } => {
                if let Some(failed) = failed_rerun {
                    ui.label(format!("not verified: {}", failed_rerun_text(failed)));
                }
                for difference in factors {
                    factor(ui, "possible reason (not verified)", difference, &[]);
                }
                unexplained(ui, labels, &[]);
            }
        }
    }
    if let Some(events) = &comparison.events {
        for pair in &events.pairs {
            ui.label(format!("allocator events, {} vs {}: {}", letter(pair.second), letter(pair.first), pair.diff));
        }
    }
}

fn factor(ui: &mut egui::Ui, verdict: &str, factor: &FactorDifference, shifts: &[MarkShift]) {
    ui.label(format!("  {verdict}: {} — {}", factor.kind.name(), factor.description));
    for shift in shifts {
        ui.label(format!("      {}: {}", shift.labels.join(", "), shift_text(shift)));
    }
}

fn unexplained(ui: &mut egui::Ui, labels: &[String], remaining: &[MarkShift]) {
    if labels.is_empty() {
        return;
    }
    ui.colored_label(ui.visuals().warn_fg_color, format!("  unexplained: {}", labels.join(", ")));
    for shift in remaining {
        ui.label(format!("      {}: {}", shift.labels.join(", "), shift_text(shift)));
    }
}

fn shift_text(shift: &MarkShift) -> String {
    let signed = |n: i128| match n.cmp(&0) {
        std::cmp::Ordering::Less => format!("−{}", format::bytes(n.unsigned_abs() as u64)),
        _ => format!("+{}", format::bytes(n as u64)),
    };
    format!("allocated {}, reserved {}", signed(shift.allocated), signed(shift.reserved))
}

fn failed_rerun_text(failed: &FailedRerun) -> String {
    match failed {
        FailedRerun::Baseline { experiment, error } => format!("{experiment} did not run on the simulator: {error}"),
        FailedRerun::BaselineNotReproduced { marks } => {
            format!("the simulator does not reproduce the baseline's marks {}", marks.join(", "))
        }
        FailedRerun::Factor { kind, error, .. } => format!("switching {} failed: {error}", kind.name()),
    }
}

/// A run's letter: A for the baseline, B for the other.
fn letter(column: usize) -> char {
    if column == 0 { 'A' } else { 'B' }
}
