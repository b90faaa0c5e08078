//! The "Explain" tab: `cachalot explain` ([`cachalot_trace::explain`]) for the request at the
//! cursor — the last `alloc` or `oom` entry before it. The request, where the device's memory
//! was, why the cached bytes could not serve it (bytes and blocks per cause, when it came and
//! after the retry chain), the main cause, and the fix once searched for.
//!
//! The tab opens on a run's first out-of-memory error (the cursor moves there), and clicking an
//! OOM marker of the timeline shows it here too. The explanation replays the trace up to the
//! request (natively on a worker thread, in the browser on the frame after it was asked for).
//! The fix search replays the whole job under some sixty changes in parallel, which takes
//! seconds on a long trace: it runs only when asked (**Find the fix**), on a thread, and the tab
//! says it is running. The browser has no threads for it and its timings would read
//! `std::time::Instant`, which panics there: the tab leaves the button out and names the command.

use std::sync::Arc;

use cachalot_core::size::PoolKind;
use cachalot_core::trace::TraceAction;
use cachalot_trace::explain::{At, Cause, ClassBytes, ExplainOptions, Explanation, explain};

use crate::format;
use crate::model::Run;
use crate::style;
use crate::tune::TuneInput;

/// Answers kept, so that going back to a request shows it at once.
const ANSWERS_KEPT: usize = 16;

/// What the tab asks of the app.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExplainAction {
    /// Move the cursor here (to just after a request).
    MoveCursor(usize),
}

/// One explanation asked for: the run (its name and trace length: a live run that ended is
/// explained anew), the request's entry, and whether with the fix search.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    run: String,
    entries: usize,
    entry: usize,
    fix: bool,
}

impl Key {
    fn new(run: &Run, entry: usize, fix: bool) -> Self {
        Key { run: run.name.clone(), entries: run.trace.len(), entry, fix }
    }
}

/// An explanation being made.
struct Job {
    key: Key,
    started: web_time::Instant,
    #[cfg(not(target_arch = "wasm32"))]
    receiver: std::sync::mpsc::Receiver<Result<Explanation, String>>,
    /// In the browser: the input, explained at the next frame (this one says it is coming).
    #[cfg(target_arch = "wasm32")]
    input: Arc<TuneInput>,
}

/// What the Explain tab remembers.
#[derive(Default)]
pub struct ExplainState {
    /// The run whose tab was shown last: a run shown for the first time opens on its first
    /// out-of-memory error.
    shown: Option<String>,
    /// The trace and replay options of the last run explained, by name and trace length.
    input: Option<(String, usize, Result<Arc<TuneInput>, String>)>,
    /// The latest answers, newest last.
    answers: Vec<(Key, Result<Explanation, String>)>,
    job: Option<Job>,
}

impl std::fmt::Debug for ExplainState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExplainState")
            .field("shown", &self.shown)
            .field("answers", &self.answers.len())
            .field("running", &self.job.as_ref().map(|j| &j.key))
            .finish()
    }
}

impl ExplainState {
    /// Shows `run` without moving its cursor to its first out-of-memory error (the user picked
    /// a request, e.g. an OOM marker).
    pub fn focus(&mut self, run: &str) {
        self.shown = Some(run.to_owned());
    }

    /// Whether an explanation or a fix search is being made.
    pub fn is_running(&self) -> bool {
        self.job.is_some()
    }

    /// Whether the running job is a fix search.
    pub fn searching_fix(&self) -> bool {
        self.job.as_ref().is_some_and(|j| j.key.fix)
    }

    /// The answer for request `entry` of `run`, with the fix search where one was made.
    pub fn answer(&self, run: &Run, entry: usize) -> Option<&Result<Explanation, String>> {
        let of = |fix: bool| {
            let key = Key::new(run, entry, fix);
            self.answers.iter().rev().find(|(k, _)| *k == key).map(|(_, a)| a)
        };
        of(true).or_else(|| of(false))
    }

    /// Takes in a finished job's answer; in the browser, makes the job asked for last frame.
    pub fn poll(&mut self) {
        let Some(job) = &self.job else { return };
        #[cfg(not(target_arch = "wasm32"))]
        let answer = match job.receiver.try_recv() {
            Ok(answer) => answer,
            Err(std::sync::mpsc::TryRecvError::Empty) => return,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => Err(NO_RESULT.into()),
        };
        #[cfg(target_arch = "wasm32")]
        let answer = explained(&job.input, &job.key);
        self.finish(answer);
    }

    /// Waits for the running job (for tests and headless pictures).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait(&mut self) {
        if let Some(job) = &self.job {
            let answer = job.receiver.recv().unwrap_or_else(|_| Err(NO_RESULT.into()));
            self.finish(answer);
        }
    }

    fn finish(&mut self, answer: Result<Explanation, String>) {
        let Some(job) = self.job.take() else { return };
        self.answers.retain(|(k, _)| *k != job.key);
        self.answers.push((job.key, answer));
        let over = self.answers.len().saturating_sub(ANSWERS_KEPT);
        self.answers.drain(..over);
    }

    /// The trace and replay options of `run`, made once per run (a copy of its trace).
    fn input(&mut self, run: &Run, make: impl FnOnce() -> Result<TuneInput, String>) -> Result<Arc<TuneInput>, String> {
        let fresh = self.input.as_ref().is_some_and(|(name, len, _)| *name == run.name && *len == run.trace.len());
        if !fresh {
            self.input = Some((run.name.clone(), run.trace.len(), make().map(Arc::new)));
        }
        self.input.as_ref().map_or_else(|| Err(NO_RESULT.into()), |(_, _, input)| input.clone())
    }

    /// Starts explaining request `entry` of `run` (with the fix search if `fix`).
    pub fn start(&mut self, run: &Run, entry: usize, fix: bool, input: Arc<TuneInput>, ctx: &egui::Context) {
        let key = Key::new(run, entry, fix);
        let started = web_time::Instant::now();
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (sender, receiver) = std::sync::mpsc::channel();
            let ctx = ctx.clone();
            let asked = key.clone();
            let spawned = std::thread::Builder::new().name("cachalot-explain".into()).spawn(move || {
                let _ = sender.send(explained(&input, &asked));
                ctx.request_repaint();
            });
            match spawned {
                Ok(_) => self.job = Some(Job { key, started, receiver }),
                Err(e) => {
                    self.answers.push((key, Err(format!("cannot start a thread: {e}"))));
                }
            }
        }
        #[cfg(target_arch = "wasm32")]
        {
            ctx.request_repaint();
            self.job = Some(Job { key, started, input });
        }
    }

    /// Explains the request at the cursor of `run` and waits for it, with the fix search if
    /// `fix` (headless pictures: `cachalot view TRACE --view explain --screenshot`).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn explain_now(&mut self, run: &Run, cursor: usize, input: Result<TuneInput, String>, fix: bool) {
        let Some(entry) = request_before(run, cursor) else { return };
        match self.input(run, || input) {
            Ok(input) => {
                self.start(run, entry, fix, input, &egui::Context::default());
                self.wait();
            }
            Err(e) => self.answers.push((Key::new(run, entry, fix), Err(e))),
        }
        self.shown = Some(run.name.clone());
    }
}

/// Why a job has no answer: its thread ended without sending one (it panicked).
const NO_RESULT: &str = "the explanation's thread ended without an answer";

/// `cachalot explain`'s answer for the request `key` of `input`'s trace.
fn explained(input: &TuneInput, key: &Key) -> Result<Explanation, String> {
    let how = ExplainOptions { at: At::Entry(key.entry), search_fix: key.fix, ..ExplainOptions::default() };
    explain(&input.snapshot, &input.options, &how).map_err(|e| e.to_string())
}

/// The request at the cursor: the last `alloc` or `oom` entry before it.
pub fn request_before(run: &Run, cursor: usize) -> Option<usize> {
    let end = cursor.min(run.trace.len());
    run.trace[..end].iter().rposition(|e| matches!(e.action, TraceAction::Alloc | TraceAction::Oom))
}

/// The Explain tab for `run` at `cursor`. `input` is the trace as `cachalot explain` replays it
/// (with the `expected.json` beside its file), or why it cannot be.
pub fn ui(
    ui: &mut egui::Ui,
    run: &Run,
    cursor: usize,
    input: impl FnOnce() -> Result<TuneInput, String>,
    state: &mut ExplainState,
) -> Option<ExplainAction> {
    state.poll();
    if state.shown.as_deref() != Some(run.name.as_str()) {
        state.shown = Some(run.name.clone());
        // A run opens on its first out-of-memory error: the question the tab answers first.
        if let Some(&first) = run.markers.ooms.first() {
            let at = first as usize + 1;
            if at != cursor {
                return Some(ExplainAction::MoveCursor(at));
            }
        }
    }
    let mut action = None;
    let entry = request_before(run, cursor);
    ui.horizontal_wrapped(|ui| {
        action = navigation(ui, run, cursor);
        ui.separator();
        match entry {
            Some(entry) => ui.label(format!("the request at the cursor: entry #{}", format::count(entry as u64))),
            None => ui.label("no request before the cursor"),
        };
        if state.is_running() {
            ui.spinner();
            let seconds = state.job.as_ref().map_or(0.0, |j| j.started.elapsed().as_secs_f64());
            if state.searching_fix() {
                ui.label(format!(
                    "searching for the fix: replaying the whole job under candidate changes… {seconds:.1} s"
                ));
            } else {
                ui.label("replaying the trace up to the request…");
            }
            ui.ctx().request_repaint_after(std::time::Duration::from_millis(100));
        }
    });
    ui.separator();
    let Some(entry) = entry else {
        ui.label(
            "Explain answers for an allocation or an out-of-memory error: move the cursor just past one \
             (click an OOM marker of the timeline, or use the buttons above).",
        );
        return action;
    };
    let answer = state.answer(run, entry).cloned();
    if answer.is_none() && !state.is_running() {
        match state.input(run, input) {
            Ok(input) => state.start(run, entry, false, input, ui.ctx()),
            Err(e) => state.answers.push((Key::new(run, entry, false), Err(e))),
        }
    }
    match answer {
        None => {
            ui.label("explaining…");
        }
        Some(Err(e)) => {
            ui.colored_label(style::series::OOM, e);
        }
        Some(Ok(x)) => {
            egui::ScrollArea::vertical().auto_shrink([false, false]).show(ui, |ui| {
                if let Some(fix) = answer_ui(ui, &run.name, &x, state) {
                    match state.input(run, || Err(NO_RESULT.into())) {
                        Ok(input) => state.start(run, fix, true, input, ui.ctx()),
                        Err(e) => state.answers.push((Key::new(run, entry, true), Err(e))),
                    }
                }
            });
        }
    }
    action
}

/// Buttons that move the cursor to the run's out-of-memory errors.
fn navigation(ui: &mut egui::Ui, run: &Run, cursor: usize) -> Option<ExplainAction> {
    let ooms = &run.markers.ooms;
    // The cursor just past an error is at its marker.
    let at = |i: usize| ooms[i] as usize + 1;
    let before = ooms.partition_point(|&m| (m as usize + 1) < cursor);
    let after = ooms.partition_point(|&m| (m as usize + 1) <= cursor);
    let mut action = None;
    let mut go = |ui: &mut egui::Ui, label: &str, hover: &str, to: Option<usize>| {
        if ui.add_enabled(to.is_some(), egui::Button::new(label)).on_hover_text(hover).clicked() {
            action = to.map(ExplainAction::MoveCursor);
        }
    };
    go(ui, "first OOM", "the first out-of-memory error", (!ooms.is_empty()).then(|| at(0)));
    go(ui, "◀ OOM", "the previous out-of-memory error", before.checked_sub(1).map(at));
    go(ui, "OOM ▶", "the next out-of-memory error", (after < ooms.len()).then(|| at(after)));
    ui.label(match ooms.len() {
        0 => "no out-of-memory error recorded".to_owned(),
        1 => "1 out-of-memory error".to_owned(),
        n => format!("{} out-of-memory errors", format::count(n as u64)),
    });
    action
}

/// The answer: the request, the cause and the fix first, then the detail. Returns the request
/// whose fix search was asked for.
fn answer_ui(ui: &mut egui::Ui, run: &str, x: &Explanation, state: &ExplainState) -> Option<usize> {
    let (r, m) = (&x.request, &x.memory);
    let mut search = None;
    let what = if x.failed { "ran out of memory" } else { "was served" };
    let headline = format!(
        "entry #{} {what}: {} asked (rounded to {}, {} pool, stream {})",
        format::count(x.entry as u64),
        format::bytes(r.size),
        format::bytes(r.rounded),
        r.pool,
        format::stream(cachalot_core::StreamId(r.stream))
    );
    if x.failed {
        ui.heading(egui::RichText::new(headline).color(style::series::OOM));
    } else {
        ui.heading(headline);
    }
    if !x.matches_recording {
        ui.colored_label(
            style::series::ACTIVE,
            "⚠ the replay does not do here what the recording shows: the answer is the replay's",
        );
    }
    match x.main_cause_line(format::bytes) {
        Some(text) => {
            ui.label(egui::RichText::new(text).strong());
        }
        None => {
            let from = if r.segment_size == 0 {
                "from the cache".to_owned()
            } else {
                format!("with {} of new memory", format::bytes(r.segment_size))
            };
            ui.label(format!("served {from}"));
        }
    }
    if x.failed {
        fix_ui(ui, x, state, &mut search);
    }
    if let Some(message) = &x.message {
        egui::CollapsingHeader::new("PyTorch's message").id_salt(("oom message", run)).show(ui, |ui| {
            ui.label(egui::RichText::new(message).monospace());
        });
    }
    ui.add_space(6.0);
    ui.strong(format!("Memory (device of {})", format::bytes(m.device_total)));
    egui::Grid::new("explain_memory").num_columns(3).striped(true).show(ui, |ui| {
        let row = |ui: &mut egui::Ui, name: &str, bytes: u64, note: String| {
            ui.label(name);
            ui.monospace(format::bytes(bytes));
            ui.label(note);
            ui.end_row();
        };
        if m.outside > 0 {
            row(ui, "outside this allocator", m.outside, "CUDA context, NCCL, other processes".into());
        }
        if let Some(allowed) = m.allowed {
            row(ui, "allowance (memory fraction)", allowed, String::new());
        }
        row(ui, "reserved", m.reserved, format!("{} after the retry chain", format::bytes(m.reserved_after)));
        row(
            ui,
            "  allocated (live)",
            m.allocated,
            format!("requested {}, rounding waste {}", format::bytes(m.requested), format::bytes(m.rounding_waste)),
        );
        row(ui, "  cached, unallocated", m.reserved.saturating_sub(m.allocated), String::new());
        row(ui, "device free after", m.device_free_after, String::new());
    });
    if x.failed {
        let t = &x.retry;
        let gc = if t.garbage_collection { "garbage collection, " } else { "" };
        ui.label(format!(
            "Retry chain ({gc}oversize and full release): released {} in {} segments, completed {} deferred frees; \
             room left {}, needed a segment of {}",
            format::bytes(t.released_bytes),
            t.released_segments,
            t.completed_frees,
            format::bytes(t.room_after),
            format::bytes(r.segment_size)
        ));
    }
    ui.add_space(6.0);
    let pool = r.pool_kind();
    if x.failed {
        ui.strong("Why the cached bytes could not serve it, after the retry chain");
        classes(ui, "explain_after", &x.after_retry, pool, "nothing is cached: the chain gave everything back");
        ui.add_space(4.0);
    }
    ui.strong("When the request came, the cached bytes were");
    classes(ui, "explain_when", &x.when_asked, pool, "none that could not serve it");
    ui.add_space(6.0);
    ui.strong("The stack that asked");
    if r.frames.is_empty() {
        ui.label("not recorded");
    }
    for frame in &r.frames {
        ui.monospace(frame);
    }
    ui.add_space(6.0);
    ui.strong("Stacks holding the most live memory");
    egui::Grid::new("explain_stacks").num_columns(3).striped(true).show(ui, |ui| {
        for s in &x.live_stacks {
            ui.monospace(format::bytes(s.bytes));
            ui.label(format!("{} blocks", format::count(s.blocks)));
            ui.monospace(s.frames.first().map_or("(no stack recorded)", String::as_str))
                .on_hover_text(if s.frames.is_empty() { "no stack recorded".to_owned() } else { s.frames.join("\n") });
            ui.end_row();
        }
    });
    search
}

/// The fix: found, not found, not possible, or a button to search for it.
fn fix_ui(ui: &mut egui::Ui, x: &Explanation, state: &ExplainState, search: &mut Option<usize>) {
    if x.main_cause == Some(Cause::LiveExceedsDevice) {
        ui.label(
            "fix: no allocator setting helps: live memory alone exceeds the device; free or shrink what the \
             stacks below hold",
        );
        return;
    }
    match &x.fix {
        Some(found) => match &found.fix {
            Some(fix) => {
                ui.horizontal_wrapped(|ui| {
                    ui.label(format!(
                        "fix (proven by replaying the whole job, {} replays in {:.2} s):",
                        found.replays, found.seconds
                    ));
                    let line = fix.change.to_string();
                    ui.label(egui::RichText::new(&line).monospace().color(style::series::RESERVED));
                    if ui.small_button("📋 Copy").on_hover_text("copy the change to the clipboard").clicked() {
                        ui.ctx().copy_text(line);
                    }
                });
                ui.label(format!(
                    "the job then runs through, peak reserved {} (allocated {})",
                    format::bytes(fix.peak_reserved),
                    format::bytes(fix.peak_allocated)
                ));
                for alt in &found.alternatives {
                    ui.label(format!("  or {} (peak reserved {})", alt.change, format::bytes(alt.peak_reserved)));
                }
            }
            None if !found.own_settings_fail => {
                ui.label(
                    "fix: not proven: the replay of the whole job serves this request under its own settings, \
                     so no change can be shown to help",
                );
            }
            None => {
                ui.label(format!(
                    "fix: none of {} replayed changes lets the job through (settings, policy:cachalot, empty_cache \
                     before the request{})",
                    found.replays,
                    if x.memory.allowed.is_some() { ", a larger fraction" } else { "" }
                ));
            }
        },
        None => fix_button(ui, x, state, search),
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn fix_button(ui: &mut egui::Ui, x: &Explanation, state: &ExplainState, search: &mut Option<usize>) {
    ui.horizontal(|ui| {
        let enabled = !state.is_running();
        if ui
            .add_enabled(enabled, egui::Button::new("Find the fix"))
            .on_hover_text(
                "replay the whole job under candidate changes (settings, policy:cachalot, empty_cache before the \
                 request, a larger fraction) and name the smallest that lets it through: cachalot explain TRACE",
            )
            .clicked()
        {
            *search = Some(x.entry);
        }
        if state.searching_fix() {
            ui.label("searching…");
        } else {
            ui.label("replays the whole job: seconds on a long trace");
        }
    });
}

#[cfg(target_arch = "wasm32")]
fn fix_button(ui: &mut egui::Ui, x: &Explanation, state: &ExplainState, search: &mut Option<usize>) {
    let _ = (x, state, search);
    ui.label(
        "fix: the search is not in the web page (it replays the whole job under some sixty changes in parallel, \
         on threads a page does not have): run `cachalot explain TRACE`, or open the trace in `cachalot view`.",
    );
}

/// The cached bytes by why they could not serve the request, largest first.
fn classes(ui: &mut egui::Ui, id: &str, list: &[ClassBytes], pool: PoolKind, empty: &str) {
    if list.is_empty() {
        ui.label(empty);
        return;
    }
    egui::Grid::new(id).num_columns(4).striped(true).show(ui, |ui| {
        for h in ["bytes", "blocks", "largest", "why"] {
            ui.label(egui::RichText::new(h).small());
        }
        ui.end_row();
        for c in list {
            ui.monospace(format::bytes(c.bytes));
            ui.monospace(format::count(c.blocks));
            ui.monospace(format::bytes(c.largest_block));
            ui.label(c.cause.describe(pool));
            ui.end_row();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Rules, RunKind};
    use cachalot_core::trace::TraceEntry;

    #[test]
    fn the_request_at_the_cursor_is_the_last_alloc_or_oom_before_it() {
        let mut run = Run::new("t", RunKind::Cachalot, Rules::default());
        let entry = |action, addr| TraceEntry {
            action,
            addr,
            size: 512,
            stream: cachalot_core::StreamId::DEFAULT,
            time_us: 0,
            context: None,
            annotation: None,
        };
        run.trace = vec![
            entry(TraceAction::SegmentAlloc, 0),
            entry(TraceAction::Alloc, 0),
            entry(TraceAction::FreeRequested, 0),
            entry(TraceAction::Oom, 0),
            entry(TraceAction::FreeCompleted, 0),
        ];
        assert_eq!(request_before(&run, 0), None);
        assert_eq!(request_before(&run, 1), None);
        assert_eq!(request_before(&run, 2), Some(1));
        assert_eq!(request_before(&run, 3), Some(1));
        assert_eq!(request_before(&run, 4), Some(3));
        assert_eq!(request_before(&run, 5), Some(3));
        assert_eq!(request_before(&run, 99), Some(3));
    }
}
