//! Why two runs differ: `cachalot compare`'s analysis ([`cachalot_runtime::comparison`]) of the
//! side-by-side panel's two runs, or of a run against PyTorch's `expected.json`, shown as a
//! panel instead of text.
//!
//! The analysis reruns the runs' experiment on the simulator with one factor (workspaces, stream
//! discipline, settings, capacity, largest segment) switched at a time, which takes from a moment
//! to seconds. Natively it runs on a thread when asked for, and the panel shows its result when
//! it comes. The browser has no threads: there the panel polls the comparison's future
//! ([`compare_runs_paced`]) once per frame, and the future pauses before each rerun, so each
//! rerun is one frame's work, the page keeps drawing (with the rerun under way named), and Stop
//! drops the future.

use cachalot_core::error::group_digits as group;
use cachalot_runtime::comparison::{
    Column, CompareOptions, Comparison, Explanation, FactorDifference, FailedRerun, MarkRow, MarkShift,
    from_expected_json, from_snapshot,
};
use cachalot_trace::Snapshot;
use cachalot_trace::snapshot::file::{FORMAT, VERSION};

use crate::format;
use crate::model::Run;
use crate::tabs::RunTab;

/// PyTorch 2.11's `seeds.expected.json` (captured on an H200 by `shared/traces/capture.py`),
/// built in: what the `seeds` experiment is compared with when no other file is at hand.
pub const SEEDS_EXPECTED: (&str, &[u8]) =
    ("seeds.expected.json", include_bytes!("../../testdata/traces/pytorch-2.11-h200/seeds.expected.json"));

/// One side of an analysis: a run's snapshot (`None`: the run names no device), or a column
/// already read (PyTorch's `expected.json`).
pub enum Side {
    /// A run of the viewer, by name.
    Run(String, Option<Box<Snapshot>>),
    /// A column read from a file.
    Column(Box<Column>),
}

impl Side {
    /// The side of a run's tab: its snapshot, with the device facts of its end snapshot where
    /// it has one (a live run's record of `cachalot run`, which says what the experiment was,
    /// arrives with its end).
    pub fn of_tab(tab: &RunTab) -> Self {
        let mut snapshot = snapshot_of(&tab.run);
        if let (Some(snapshot), Some(end)) = (&mut snapshot, &tab.end_snapshot) {
            snapshot.device = end.device.clone();
        }
        Side::Run(tab.run.name.clone(), snapshot.map(Box::new))
    }

    fn name(&self) -> &str {
        match self {
            Side::Run(name, _) => name,
            Side::Column(column) => &column.name,
        }
    }

    fn into_column(self) -> Result<Column, String> {
        match self {
            Side::Column(column) => Ok(*column),
            Side::Run(name, None) => {
                Err(format!("{name} names no device: the reasons need runs of cachalot (snapshots of `cachalot run`)"))
            }
            Side::Run(name, Some(snapshot)) => {
                from_snapshot(name.clone(), *snapshot).map_err(|e| format!("{name}: {e}"))
            }
        }
    }
}

/// An analysis under way.
#[cfg(not(target_arch = "wasm32"))]
type Pending = std::sync::mpsc::Receiver<Result<Comparison, String>>;

/// An analysis under way: the comparison's future, polled once per frame, and the rerun it
/// is at.
#[cfg(target_arch = "wasm32")]
struct Pending {
    future: std::pin::Pin<Box<dyn std::future::Future<Output = Comparison>>>,
    step: std::rc::Rc<std::cell::RefCell<(usize, String)>>,
}

#[cfg(target_arch = "wasm32")]
impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("step", &self.step).finish()
    }
}

/// What the panel remembers: the pair it explained (or is explaining) and the answer.
#[derive(Debug, Default)]
pub struct ReasonsState {
    /// The runs (by name) of the analysis shown or under way.
    pair: Option<(String, String)>,
    /// The analysis under way.
    pending: Option<Pending>,
    /// Its answer.
    answer: Option<Result<Comparison, String>>,
}

impl ReasonsState {
    /// Whether an analysis is under way.
    pub fn is_running(&self) -> bool {
        self.pending.is_some()
    }

    /// Waits for the analysis under way (for tests and headless pictures).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait(&mut self) {
        if let Some(receiver) = self.pending.take() {
            self.answer = Some(receiver.recv().unwrap_or_else(|_| Err("the analysis stopped".into())));
        }
    }

    /// The answer, once there is one.
    pub fn answer(&self) -> Option<&Result<Comparison, String>> {
        self.answer.as_ref()
    }

    /// The names of the runs of the analysis shown or under way (baseline first).
    pub fn pair(&self) -> Option<&(String, String)> {
        self.pair.as_ref()
    }

    /// Starts the analysis of `a` against `b` (the baseline first).
    pub fn start(&mut self, a: Side, b: Side) {
        self.pair = Some((a.name().to_owned(), b.name().to_owned()));
        self.answer = None;
        let columns = move || -> Result<Vec<Column>, String> { Ok(vec![a.into_column()?, b.into_column()?]) };
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (send, receive) = std::sync::mpsc::channel();
            self.pending = Some(receive);
            std::thread::spawn(move || {
                let result = columns()
                    .map(|columns| cachalot_runtime::comparison::compare_runs(columns, CompareOptions::default()));
                // The panel may have moved on to another pair; then nobody listens.
                let _ = send.send(result);
            });
        }
        #[cfg(target_arch = "wasm32")]
        match columns() {
            Err(error) => self.answer = Some(Err(error)),
            Ok(columns) => {
                let step = std::rc::Rc::new(std::cell::RefCell::new((0, "starting".to_owned())));
                let at = std::rc::Rc::clone(&step);
                let future =
                    cachalot_runtime::comparison::compare_runs_paced(columns, CompareOptions::default(), move |what| {
                        let mut at = at.borrow_mut();
                        at.0 += 1;
                        at.1 = what;
                        cachalot_runtime::runtime::yield_now()
                    });
                self.pending = Some(Pending { future: Box::pin(future), step });
            }
        }
    }

    /// Stops the analysis under way; its answer says so.
    pub fn stop(&mut self) {
        if self.pending.take().is_some() {
            self.answer = Some(Err("stopped".into()));
        }
    }

    /// What the analysis under way is doing, in words.
    fn doing(&self) -> String {
        #[cfg(target_arch = "wasm32")]
        if let Some(pending) = &self.pending {
            let (n, what) = &*pending.step.borrow();
            return format!("rerun {n} on the simulator: {what}…");
        }
        "rerunning on the simulator…".into()
    }

    /// Takes the answer of the analysis under way, if it has come (in the browser: runs it to
    /// its next pause, one rerun on the simulator).
    pub fn poll(&mut self, ctx: &egui::Context) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let _ = ctx;
            use std::sync::mpsc::TryRecvError;
            if let Some(receiver) = &self.pending {
                match receiver.try_recv() {
                    Ok(result) => {
                        self.answer = Some(result);
                        self.pending = None;
                    }
                    Err(TryRecvError::Empty) => {}
                    Err(TryRecvError::Disconnected) => {
                        self.answer = Some(Err("the analysis stopped".into()));
                        self.pending = None;
                    }
                }
            }
        }
        #[cfg(target_arch = "wasm32")]
        if let Some(pending) = &mut self.pending {
            let waker = std::task::Waker::from(std::sync::Arc::new(Repaint(ctx.clone())));
            if let std::task::Poll::Ready(comparison) =
                pending.future.as_mut().poll(&mut std::task::Context::from_waker(&waker))
            {
                self.answer = Some(Ok(comparison));
                self.pending = None;
            }
        }
    }
}

/// Wakes the page up for its next frame, where the analysis goes on.
#[cfg(target_arch = "wasm32")]
struct Repaint(egui::Context);

#[cfg(target_arch = "wasm32")]
impl std::task::Wake for Repaint {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.request_repaint();
    }
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

/// The run / stop buttons and the answer of `state` for the pair `(a, b)`.
fn controls(ui: &mut egui::Ui, pair: (&str, &str), state: &mut ReasonsState, start: impl FnOnce(&mut ReasonsState)) {
    let current = state.pair.as_ref().is_some_and(|(x, y)| x == pair.0 && y == pair.1);
    ui.horizontal(|ui| {
        let label = if current && state.answer.is_some() { "explain again" } else { "explain" };
        let button = ui.add_enabled(!state.is_running(), egui::Button::new(label)).on_hover_text(
            "rerun the experiment on the simulator with one factor switched at a time, as `cachalot compare` does",
        );
        if button.clicked() {
            start(state);
        }
        if state.is_running() {
            ui.spinner();
            ui.label(state.doing());
            if ui.button("Stop").clicked() {
                state.stop();
            }
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
}

/// The "Why they differ" section for runs `a` (baseline) and `b`.
pub fn ui(ui: &mut egui::Ui, a: &RunTab, b: &RunTab, state: &mut ReasonsState) {
    state.poll(ui.ctx());
    egui::CollapsingHeader::new("Why they differ").id_salt("why_they_differ").show(ui, |ui| {
        controls(ui, (&a.run.name, &b.run.name), state, |state| state.start(Side::of_tab(a), Side::of_tab(b)));
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
                "{} mark difference(s) without a known reason, {} run(s) whose stats or events differ without one, \
                 {} loss step(s) over tolerance, {} run(s) stopped or failed checks",
                verdict.unexplained,
                verdict.unexplained_runs.len(),
                verdict.loss_failures,
                verdict.failed_runs
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

/// A run against PyTorch's `expected.json` (the Compare tab's first section): the file read,
/// the run picked, and the analysis with PyTorch's run as the baseline, as
/// `cachalot compare NAME.expected.json RUN.json` makes it.
#[derive(Debug, Default)]
pub struct ExpectedState {
    /// The `expected.json` read, or why it could not be.
    pub expected: Option<Result<Column, String>>,
    /// The run compared with it (an index into the open runs).
    pub run: usize,
    /// The analysis.
    pub reasons: ReasonsState,
    /// Files chosen in the browser's picker, on their way.
    #[cfg(target_arch = "wasm32")]
    uploads: crate::loading::Inbox,
}

impl ExpectedState {
    /// Reads `bytes`, PyTorch's `NAME.expected.json`, as the side to compare runs with.
    pub fn open(&mut self, name: &str, bytes: &[u8]) {
        self.expected = Some(from_expected_json(name.to_owned(), bytes).map_err(|e| format!("{name}: {e}")));
        self.reasons = ReasonsState::default();
    }

    /// Starts the analysis of `tab` against the `expected.json` read.
    pub fn start(&mut self, tab: &RunTab) -> Result<(), String> {
        if tab.live.is_some() {
            return Err(format!("{} is still arriving: compare it when it has finished", tab.run.name));
        }
        match &self.expected {
            Some(Ok(expected)) => {
                self.reasons.start(Side::Column(Box::new(expected.clone())), Side::of_tab(tab));
                Ok(())
            }
            Some(Err(error)) => Err(error.clone()),
            None => Err("no expected.json is open".into()),
        }
    }

    /// The section's state as JSON, for scripts that drive the page: the file, the analysis
    /// under way, and its answer — the marks as `cachalot compare`'s table shows them and its
    /// `reason:` lines.
    pub fn status_json(&self) -> serde_json::Value {
        let expected = match &self.expected {
            Some(Ok(column)) => serde_json::json!({ "name": column.name, "title": column.title }),
            Some(Err(error)) => serde_json::json!({ "error": error }),
            None => serde_json::Value::Null,
        };
        let answer = match self.reasons.answer() {
            None => serde_json::Value::Null,
            Some(Err(error)) => serde_json::json!({ "error": error }),
            Some(Ok(comparison)) => serde_json::json!({
                "runs": comparison.columns.iter().map(|c| &c.name).collect::<Vec<_>>(),
                "marks": comparison.marks.iter().map(|row| {
                    let mut cells = vec![row.label.clone()];
                    cells.extend((0..row.values.len()).map(|i| mark_cell(row, i)));
                    cells
                }).collect::<Vec<_>>(),
                "differing": comparison.differences.iter().map(|d| d.marks.len()).sum::<usize>(),
                "reasons": reason_lines(comparison),
                "verdict_ok": comparison.verdict.ok(),
                "unexplained": comparison.verdict.unexplained,
            }),
        };
        serde_json::json!({
            "expected": expected,
            "pair": self.reasons.pair(),
            "running": self.reasons.is_running(),
            "answer": answer,
        })
    }
}

/// Run `column`'s cell of a mark row as `cachalot compare` writes it: `allocated / reserved`
/// in grouped bytes, `=` where it equals the baseline's, `*` after a value that differs, `—`
/// where the run lacks the mark.
fn mark_cell(row: &MarkRow, column: usize) -> String {
    match row.values.get(column).and_then(Option::as_ref) {
        None => "—".to_owned(),
        Some(_) if column > 0 && !row.differs(column) => "=".to_owned(),
        Some(m) => {
            let star = if column > 0 { "*" } else { "" };
            format!("{} / {}{star}", group(m.allocated), group(m.reserved))
        }
    }
}

/// The factors the simulator confirmed as reasons, as `cachalot compare`'s `reason:` lines.
pub fn reason_lines(comparison: &Comparison) -> Vec<String> {
    let mut lines = Vec::new();
    for difference in &comparison.differences {
        match &difference.explanation {
            Explanation::DifferentExperiments { base, other } => {
                lines.push(format!("reason: different experiments or parameters ({base} vs {other})"));
            }
            Explanation::Tested(test) => lines.extend(
                test.factors
                    .iter()
                    .filter(|t| t.is_reason())
                    .map(|t| format!("reason: {}: {}", t.factor.kind.name(), t.factor.description)),
            ),
            Explanation::Untested { failed_rerun: Some(FailedRerun::Factor { tested, .. }), .. } => lines.extend(
                tested
                    .iter()
                    .filter(|t| t.is_reason())
                    .map(|t| format!("reason: {}: {}", t.factor.kind.name(), t.factor.description)),
            ),
            Explanation::Untested { .. } => {}
        }
    }
    lines
}

/// The marks of a comparison side by side, as `cachalot compare`'s table.
fn marks_grid(ui: &mut egui::Ui, comparison: &Comparison) {
    let columns = comparison.columns.len();
    egui::ScrollArea::vertical().id_salt("expected_marks").max_height(220.0).show(ui, |ui| {
        egui::Grid::new("expected_marks_grid").striped(true).num_columns(columns + 1).show(ui, |ui| {
            ui.strong("mark");
            for (i, column) in comparison.columns.iter().enumerate() {
                ui.strong(format!("{} {}", letter(i), column.name));
            }
            ui.end_row();
            for row in &comparison.marks {
                ui.monospace(&row.label);
                for i in 0..columns {
                    let cell = mark_cell(row, i);
                    if row.differs(i) {
                        ui.colored_label(ui.visuals().warn_fg_color, cell);
                    } else {
                        ui.label(cell);
                    }
                }
                ui.end_row();
            }
        });
    });
    ui.weak("allocated / reserved bytes; '=': as A; '*': differs from A");
}

/// The Compare tab's section "Against PyTorch's expected.json": open the file (or take the
/// built-in `seeds.expected.json`), pick a run, explain.
pub fn expected_ui(ui: &mut egui::Ui, tabs: &[RunTab], state: &mut ExpectedState) {
    #[cfg(target_arch = "wasm32")]
    for (name, bytes) in state.uploads.take() {
        match bytes {
            Ok(bytes) => state.open(&name, &bytes),
            Err(error) => state.expected = Some(Err(format!("{name}: {error}"))),
        }
    }
    state.reasons.poll(ui.ctx());
    let header = egui::CollapsingHeader::new("Against PyTorch's expected.json").id_salt("against_expected");
    // Open at once where the file came with the page's first look at the tab (a script).
    header.default_open(state.expected.is_some()).show(ui, |ui| {
        ui.horizontal_wrapped(|ui| {
            if ui
                .button("seeds.expected.json (built in)")
                .on_hover_text("PyTorch 2.11's seeds on an H200, as shared/traces/capture.py recorded it")
                .clicked()
            {
                state.open(SEEDS_EXPECTED.0, SEEDS_EXPECTED.1);
            }
            #[cfg(target_arch = "wasm32")]
            if ui.button("open expected.json…").clicked() {
                state.uploads.pick_files(ui.ctx().clone());
            }
            match &state.expected {
                Some(Ok(column)) => {
                    ui.label(format!("A: {} — {}", column.name, column.title));
                }
                Some(Err(error)) => {
                    ui.colored_label(ui.visuals().error_fg_color, error);
                }
                None => {
                    ui.weak("no expected.json open");
                }
            }
        });
        let Some(Ok(expected)) = &state.expected else { return };
        if tabs.is_empty() {
            ui.label("Run an experiment (or open a run of `cachalot run`) to compare it with PyTorch's run.");
            return;
        }
        state.run = state.run.min(tabs.len() - 1);
        let expected_name = expected.name.clone();
        run_picker(ui, tabs, &mut state.run);
        let tab = &tabs[state.run];
        let reasons = &mut state.reasons;
        controls(ui, (&expected_name, &tab.run.name), reasons, |reasons| {
            if tab.live.is_some() {
                reasons.pair = Some((expected_name.clone(), tab.run.name.clone()));
                reasons.answer =
                    Some(Err(format!("{} is still arriving: compare it when it has finished", tab.run.name)));
            } else if let Some(Ok(expected)) = &state.expected {
                reasons.start(Side::Column(Box::new(expected.clone())), Side::of_tab(tab));
            }
        });
        if let Some(Ok(comparison)) = state.reasons.answer()
            && state.reasons.pair().is_some_and(|(x, y)| *x == expected_name && *y == tab.run.name)
        {
            marks_grid(ui, comparison);
        }
    });
}

fn run_picker(ui: &mut egui::Ui, tabs: &[RunTab], index: &mut usize) {
    egui::ComboBox::new("expected_run", "B: the run")
        .selected_text(tabs.get(*index).map_or("—".to_owned(), |t| t.run.name.clone()))
        .width(260.0)
        .show_ui(ui, |ui| {
            for (i, tab) in tabs.iter().enumerate() {
                ui.selectable_value(index, i, tab.run.name.as_str());
            }
        });
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use cachalot_core::AllocatorConfig;
    use cachalot_runtime::{BackendKind, Experiment, Selection, SimDevice, SimProfile, execute_on};

    use super::*;
    use crate::load::{Progress, snapshot_run};
    use crate::model::RunKind;

    /// `seeds` on the simulator's wgpu profile against the built-in `seeds.expected.json`: the
    /// marks side by side as `cachalot compare` writes them, the workspaces named as the reason
    /// (as `cachalot compare seeds.expected.json seeds.wgpu.json` names them), and a run that
    /// is still arriving is refused with a message.
    #[test]
    fn a_run_compares_with_pytorchs_expected_json() {
        let device = Box::new(SimDevice::new(SimProfile::wgpu(), AllocatorConfig::default(), false).unwrap());
        let selection = Selection { backend: BackendKind::Sim, lines: Vec::new() };
        let snapshot = execute_on(&Experiment::Seeds, device, selection).snapshot;
        let tab = RunTab::new(snapshot_run("seeds.sim.json", snapshot, RunKind::Cachalot, &Progress::default()));

        let mut state = ExpectedState::default();
        assert!(state.start(&tab).unwrap_err().contains("no expected.json"));
        state.open("broken.expected.json", b"{\"marks\": 3}");
        assert!(state.start(&tab).unwrap_err().starts_with("broken.expected.json: "));
        state.open(SEEDS_EXPECTED.0, SEEDS_EXPECTED.1);
        state.start(&tab).unwrap();
        state.reasons.wait();
        let status = state.status_json();
        let answer = &status["answer"];
        assert_eq!(answer["runs"], serde_json::json!(["seeds.expected.json", "seeds.sim.json"]), "{status}");
        let marks = answer["marks"].as_array().unwrap();
        assert_eq!(marks.len(), 12, "{status}");
        // PyTorch's first mark (nothing allocated yet) is the run's; `linear_output` differs by
        // the 32 MiB + 1 MiB of cuBLAS workspaces the wgpu device does not allocate.
        assert_eq!(marks[0][2], "=", "{status}");
        let linear = marks.iter().find(|row| row[0] == "linear_output").unwrap();
        assert_eq!(linear[1], "76,997,120 / 77,594,624", "{status}");
        assert!(linear[2].as_str().unwrap().ends_with('*'), "{status}");
        let reasons = answer["reasons"].as_array().unwrap();
        assert_eq!(reasons.len(), 1, "{status}");
        assert!(reasons[0].as_str().unwrap().starts_with("reason: cuBLAS/cuBLASLt workspaces: "), "{status}");
        assert_eq!(answer["verdict_ok"], true, "{status}");

        let mut live = RunTab::new(crate::model::Run::new("arriving", RunKind::Live, Default::default()));
        live.live = Some(crate::live::channel().1);
        assert!(state.start(&live).unwrap_err().contains("still arriving"));
    }
}
