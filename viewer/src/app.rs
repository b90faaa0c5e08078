//! The app: all state in [`ViewerApp`], one module per panel.
//!
//! Heavy work stays off the UI path: files are parsed and their runs built on a thread
//! (natively) or on the frame after they were picked (in the browser, which has no threads),
//! and moving the cursor only replays from the nearest checkpoint ([`crate::model`]).

use crate::compare::{self, CompareState};
use crate::events::{self, EventsState};
use crate::format;
use crate::live::{Experiment, LiveEvent, LiveRun, default_experiments};
use crate::load::{Progress, load_bytes};
use crate::model::{Rules, Run, RunKind, StateCache, Verification};
use crate::pools::{self, PoolsState};
use crate::segments::{self, SegmentMapState};
use crate::stats::{self, StatsState};
use crate::style;
use crate::timeline::{self, TimelineState};

/// The panel under the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// The segment map at the cursor.
    Segments,
    /// Pools, largest free block, free-block histogram.
    Pools,
    /// `memory_stats()` and `memory_summary()`.
    Stats,
    /// The trace as a list.
    Events,
    /// Two runs side by side.
    Compare,
}

impl View {
    /// Every view, in tab order.
    pub const ALL: [View; 5] = [View::Segments, View::Pools, View::Stats, View::Events, View::Compare];

    /// The tab's title.
    pub fn title(self) -> &'static str {
        match self {
            View::Segments => "Segments",
            View::Pools => "Pools",
            View::Stats => "Stats",
            View::Events => "Events",
            View::Compare => "Compare",
        }
    }

    /// Parses a title, case-insensitively.
    pub fn from_name(name: &str) -> Option<Self> {
        View::ALL.into_iter().find(|v| v.title().eq_ignore_ascii_case(name))
    }
}

/// One open run and everything the panels remember about it.
pub struct RunTab {
    /// The run.
    pub run: Run,
    /// Cursor position: the state after this many entries.
    pub cursor: usize,
    /// The state at the cursor.
    pub cache: StateCache,
    /// Timeline settings.
    pub timeline: TimelineState,
    /// Segment map settings and selection.
    pub segments: SegmentMapState,
    /// Pools panel settings.
    pub pools: PoolsState,
    /// Event list filter.
    pub events: EventsState,
    /// Stats panel settings.
    pub stats: StatsState,
    /// The experiment feeding a live run.
    pub live: Option<LiveRun>,
}

impl RunTab {
    /// A tab for `run` with the cursor at its end.
    pub fn new(run: Run) -> Self {
        let cursor = run.end();
        RunTab {
            run,
            cursor,
            cache: StateCache::default(),
            timeline: TimelineState::default(),
            segments: SegmentMapState::default(),
            pools: PoolsState::default(),
            events: EventsState::default(),
            stats: StatsState::default(),
            live: None,
        }
    }
}

/// A message shown at the bottom of the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The text.
    pub text: String,
    /// An error (red) rather than information.
    pub error: bool,
}

type LoadResult = Result<Vec<Run>, String>;

/// A load to run on a later frame (in the browser).
#[cfg(target_arch = "wasm32")]
type LoadJob = Box<dyn FnOnce(&Progress) -> LoadResult>;

/// A file being loaded.
struct Loading {
    name: String,
    progress: Progress,
    #[cfg(not(target_arch = "wasm32"))]
    receiver: std::sync::mpsc::Receiver<LoadResult>,
    /// In the browser: the bytes, parsed on a later frame (so "loading" is drawn first).
    #[cfg(target_arch = "wasm32")]
    job: Option<LoadJob>,
}

/// The "Run experiment" window.
#[derive(Debug, Default)]
struct RunDialog {
    open: bool,
    experiment: usize,
    backend: usize,
    error: Option<String>,
}

/// The viewer.
pub struct ViewerApp {
    /// Open runs.
    pub tabs: Vec<RunTab>,
    /// The run shown.
    pub active: usize,
    /// The panel under the timeline.
    pub view: View,
    /// The compare panel.
    pub compare: CompareState,
    /// Messages at the bottom (load errors, finished runs).
    pub notices: Vec<Notice>,
    loading: Vec<Loading>,
    experiments: Vec<Box<dyn Experiment>>,
    run_dialog: RunDialog,
    #[cfg(not(target_arch = "wasm32"))]
    open_dialog: crate::native::OpenDialog,
    #[cfg(target_arch = "wasm32")]
    inbox: crate::web::Inbox,
    /// Drawn by a software rasterizer (Mesa's llvmpipe or lavapipe on a machine without a GPU): the panels
    /// then paint no fill and the window is cleared to their colour instead (see
    /// [`style::panel_frame`]).
    pub software_rendering: bool,
}

impl Default for ViewerApp {
    fn default() -> Self {
        Self::new()
    }
}

impl ViewerApp {
    /// An empty viewer offering the simulator experiments.
    pub fn new() -> Self {
        ViewerApp {
            tabs: Vec::new(),
            active: 0,
            view: View::Segments,
            compare: CompareState::default(),
            notices: Vec::new(),
            loading: Vec::new(),
            experiments: default_experiments(),
            run_dialog: RunDialog::default(),
            #[cfg(not(target_arch = "wasm32"))]
            open_dialog: crate::native::OpenDialog::default(),
            #[cfg(target_arch = "wasm32")]
            inbox: crate::web::Inbox::default(),
            software_rendering: false,
        }
    }

    /// Offers these experiments in "Run experiment" (after the simulator's).
    pub fn with_experiments(mut self, experiments: Vec<Box<dyn Experiment>>) -> Self {
        self.experiments.extend(experiments);
        self
    }

    /// Sets up fonts and style for an eframe creation context.
    pub fn setup(ctx: &egui::Context) {
        style::setup(ctx);
    }

    /// Adds already built runs as tabs (the last one becomes active).
    pub fn add_runs(&mut self, runs: Vec<Run>) {
        for run in runs {
            for anomaly in run.anomalies.iter().take(1) {
                self.notices.push(Notice {
                    text: format!(
                        "{}: {} entries did not fit, first at #{}: {}",
                        run.name, run.anomaly_count, anomaly.index, anomaly.message
                    ),
                    error: true,
                });
            }
            self.tabs.push(RunTab::new(run));
            self.active = self.tabs.len() - 1;
        }
    }

    /// Starts loading the bytes of a file called `name` (off the UI thread where there are
    /// threads).
    pub fn open_bytes(&mut self, name: impl Into<String>, bytes: Vec<u8>) {
        let name = name.into();
        let job_name = name.clone();
        self.spawn(name, move |progress| load_bytes(&job_name, &bytes, progress).map_err(|e| e.to_string()));
    }

    /// Runs `job` on a thread (natively) or on the next frame (in the browser).
    fn spawn(&mut self, name: String, job: impl FnOnce(&Progress) -> LoadResult + Send + 'static) {
        let progress = Progress::default();
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (sender, receiver) = std::sync::mpsc::channel();
            let p = progress.clone();
            let spawned = std::thread::Builder::new().name(format!("load {name}")).spawn(move || {
                let _ = sender.send(job(&p));
            });
            if let Err(e) = spawned {
                self.notices.push(Notice { text: format!("{name}: cannot start a thread: {e}"), error: true });
                return;
            }
            self.loading.push(Loading { name, progress, receiver });
        }
        #[cfg(target_arch = "wasm32")]
        self.loading.push(Loading { name, progress, job: Some(Box::new(job)) });
    }

    /// Opens a file by path (natively).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_path(&mut self, path: impl Into<std::path::PathBuf>) {
        let path = path.into();
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let job_name = name.clone();
        self.spawn(name, move |progress| {
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
            load_bytes(&job_name, &bytes, progress).map_err(|e| e.to_string())
        });
    }

    /// Waits until every load has finished (for the command line and tests).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait_for_loads(&mut self) {
        for loading in std::mem::take(&mut self.loading) {
            let result = loading.receiver.recv().unwrap_or_else(|_| Err(format!("{}: the load failed", loading.name)));
            self.finish_load(&loading.name, result);
        }
    }

    /// Where browser callbacks leave files.
    #[cfg(target_arch = "wasm32")]
    pub(crate) fn inbox(&self) -> &crate::web::Inbox {
        &self.inbox
    }

    /// Whether files are still loading.
    pub fn is_loading(&self) -> bool {
        !self.loading.is_empty()
    }

    fn finish_load(&mut self, name: &str, result: LoadResult) {
        match result {
            Ok(runs) => self.add_runs(runs),
            Err(message) => {
                let text = if message.starts_with(name) { message } else { format!("{name}: {message}") };
                self.notices.push(Notice { text, error: true });
            }
        }
    }

    /// Adds a live run fed by `live`.
    pub fn add_live(&mut self, live: LiveRun) {
        let mut run = Run::new("starting…", RunKind::Live, Rules::default());
        run.live = true;
        let mut tab = RunTab::new(run);
        tab.live = Some(live);
        self.tabs.push(tab);
        self.active = self.tabs.len() - 1;
    }

    /// The tab shown, if any.
    pub fn active_tab(&self) -> Option<&RunTab> {
        self.tabs.get(self.active)
    }

    /// The tab shown, mutably.
    pub fn active_tab_mut(&mut self) -> Option<&mut RunTab> {
        self.tabs.get_mut(self.active)
    }

    /// Moves the active run's cursor.
    pub fn set_cursor(&mut self, cursor: usize) {
        if let Some(tab) = self.active_tab_mut() {
            tab.cursor = cursor.min(tab.run.end());
        }
    }

    /// Whether a live run is still going.
    pub fn has_live_runs(&self) -> bool {
        self.tabs.iter().any(|t| t.live.is_some())
    }

    /// Polls loads and live runs (called every frame).
    pub fn poll(&mut self, ctx: &egui::Context) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let mut finished = Vec::new();
            self.loading.retain(|l| match l.receiver.try_recv() {
                Ok(result) => {
                    finished.push((l.name.clone(), result));
                    false
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => true,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    finished.push((l.name.clone(), Err("the load failed".into())));
                    false
                }
            });
            for (name, result) in finished {
                self.finish_load(&name, result);
            }
        }
        #[cfg(target_arch = "wasm32")]
        {
            for (name, bytes) in self.inbox.take() {
                match bytes {
                    Ok(bytes) => self.open_bytes(name, bytes),
                    Err(e) => self.notices.push(Notice { text: format!("{name}: {e}"), error: true }),
                }
            }
            // One job per frame, so the page stays responsive between files.
            if let Some(mut loading) = self.loading.pop()
                && let Some(job) = loading.job.take()
            {
                let result = job(&loading.progress);
                self.finish_load(&loading.name, result);
            }
        }
        self.poll_live();
        self.take_dropped_files(ctx);
        if !self.loading.is_empty() || self.has_live_runs() {
            ctx.request_repaint_after(std::time::Duration::from_millis(50));
        }
    }

    fn poll_live(&mut self) {
        let mut notices = Vec::new();
        for tab in &mut self.tabs {
            let Some(live) = &mut tab.live else { continue };
            let (events, connected) = live.poll();
            let mut done = !connected;
            for event in events {
                match event {
                    LiveEvent::Start { name, device, settings } => {
                        let rules = cachalot_core::AllocatorConfig::parse(&settings)
                            .map(|c| Rules::from_config(&c))
                            .unwrap_or_default();
                        let mut run = Run::new(name, RunKind::Live, rules);
                        run.live = true;
                        run.source = "live experiment".into();
                        run.device = Some(device);
                        run.settings = settings;
                        tab.run = run;
                        tab.cache.clear();
                    }
                    LiveEvent::Stack { id, frames } => {
                        let got = tab.run.contexts.intern(&frames);
                        if got != id {
                            notices.push(Notice {
                                text: format!("{}: stack {} arrived as {}", tab.run.name, id.0, got.0),
                                error: true,
                            });
                        }
                    }
                    LiveEvent::Entries(entries) => tab.run.extend(entries),
                    LiveEvent::Mark(mark) => tab.run.marks.push(mark),
                    LiveEvent::Finished(snapshot) => {
                        if let Some(snapshot) = snapshot {
                            tab.run.recorded_end = Some(snapshot.segments);
                            tab.run.recorded_stats = Some(snapshot.stats);
                        }
                        done = true;
                        notices.push(Notice {
                            text: format!(
                                "{}: finished, {} entries",
                                tab.run.name,
                                format::count(tab.run.trace.len() as u64)
                            ),
                            error: false,
                        });
                    }
                    LiveEvent::Failed(message) => {
                        done = true;
                        notices.push(Notice { text: format!("{}: {message}", tab.run.name), error: true });
                    }
                }
            }
            if done {
                tab.live = None;
                tab.run.finish();
                tab.cache.clear();
            }
            if tab.timeline.follow && (tab.run.live || done) {
                tab.cursor = tab.run.end();
            }
        }
        self.notices.extend(notices);
    }

    fn take_dropped_files(&mut self, ctx: &egui::Context) {
        let dropped = ctx.input(|i| i.raw.dropped_files.clone());
        for file in dropped {
            #[cfg(not(target_arch = "wasm32"))]
            {
                let path = file.path().to_path_buf();
                if path.as_os_str().is_empty() {
                    match file.bytes() {
                        Ok(bytes) => self.open_bytes("dropped file", bytes),
                        Err(e) => self.notices.push(Notice { text: format!("dropped file: {e}"), error: true }),
                    }
                } else {
                    self.open_path(path);
                }
            }
            #[cfg(target_arch = "wasm32")]
            self.inbox.read_dropped(file, ctx.clone());
        }
    }

    /// The whole UI (eframe's `App::ui` calls this; tests and the benchmark call it directly).
    pub fn show(&mut self, ui: &mut egui::Ui) {
        let ctx = ui.ctx().clone();
        style::set_software_rendering(&ctx, self.software_rendering);
        self.poll(&ctx);
        self.top_bar(ui);
        self.bottom_bar(ui);
        self.dialogs(&ctx);
        if self.tabs.is_empty() {
            egui::CentralPanel::default()
                .frame(style::panel_frame(ui, egui::Frame::central_panel(ui.style())))
                .show(ui, |ui| self.welcome(ui));
        } else {
            self.active = self.active.min(self.tabs.len() - 1);
            if self.view == View::Compare {
                egui::CentralPanel::default()
                    .frame(style::panel_frame(ui, egui::Frame::central_panel(ui.style())))
                    .show(ui, |ui| compare::ui(ui, &mut self.tabs, &mut self.compare));
            } else {
                self.run_panels(ui);
            }
        }
        let hovering = ctx.input(|i| !i.raw.hovered_files.is_empty());
        if hovering {
            let painter = ctx.layer_painter(egui::LayerId::new(egui::Order::Foreground, egui::Id::unique("drop")));
            let rect = ctx.content_rect();
            painter.rect_filled(rect, 0, egui::Color32::from_black_alpha(180));
            painter.text(
                rect.center(),
                egui::Align2::CENTER_CENTER,
                "Drop to open",
                egui::FontId::proportional(28.0),
                egui::Color32::WHITE,
            );
        }
    }

    fn top_bar(&mut self, ui: &mut egui::Ui) {
        egui::Panel::top("top_bar").frame(style::panel_frame(ui, egui::Frame::side_top_panel(ui.style()))).show(
            ui,
            |ui| {
                ui.horizontal_wrapped(|ui| {
                    ui.strong("cachalot");
                    if ui.button("Open…").clicked() {
                        self.open_files(ui.ctx());
                    }
                    if ui.button("Run experiment…").clicked() {
                        self.run_dialog.open = true;
                    }
                    let replayable =
                        self.active_tab().is_some_and(|t| matches!(t.run.kind, RunKind::Torch { .. }) && !t.run.live);
                    if ui
                        .add_enabled(replayable, egui::Button::new("Replay through cachalot"))
                        .on_hover_text(
                            "replay this PyTorch trace through cachalot's allocator on the simulator, to compare",
                        )
                        .clicked()
                    {
                        self.replay_active();
                    }
                    ui.separator();
                    let mut close = None;
                    for (i, tab) in self.tabs.iter().enumerate() {
                        let live = if tab.live.is_some() { "⏺ " } else { "" };
                        let title = format!("{live}{}", tab.run.name);
                        if ui.selectable_label(i == self.active, title).clicked() {
                            self.active = i;
                        }
                        if ui.small_button("×").on_hover_text(format!("close {}", tab.run.name)).clicked() {
                            close = Some(i);
                        }
                    }
                    for l in &self.loading {
                        ui.add(
                            egui::ProgressBar::new(l.progress.fraction())
                                .desired_width(140.0)
                                .text(format!("loading {}", l.name)),
                        );
                    }
                    if let Some(i) = close {
                        if let Some(live) = &self.tabs[i].live {
                            live.request_stop();
                        }
                        self.tabs.remove(i);
                        self.active = self.active.min(self.tabs.len().saturating_sub(1));
                    }
                });
                if !self.tabs.is_empty() {
                    ui.horizontal(|ui| {
                        for v in View::ALL {
                            ui.selectable_value(&mut self.view, v, v.title());
                        }
                        if let Some(tab) = self.tabs.get(self.active) {
                            ui.separator();
                            run_info(ui, tab);
                        }
                    });
                }
            },
        );
    }

    fn bottom_bar(&mut self, ui: &mut egui::Ui) {
        if self.notices.is_empty() {
            return;
        }
        egui::Panel::bottom("notices").frame(style::panel_frame(ui, egui::Frame::side_top_panel(ui.style()))).show(
            ui,
            |ui| {
                let mut dismiss = None;
                let first = self.notices.len().saturating_sub(4);
                for (i, notice) in self.notices.iter().enumerate().skip(first) {
                    ui.horizontal(|ui| {
                        if ui.small_button("dismiss").clicked() {
                            dismiss = Some(i);
                        }
                        let color = if notice.error { style::series::OOM } else { ui.visuals().text_color() };
                        ui.colored_label(color, notice.text.as_str());
                    });
                }
                if let Some(i) = dismiss {
                    self.notices.remove(i);
                }
            },
        );
    }

    fn welcome(&mut self, ui: &mut egui::Ui) {
        ui.vertical_centered(|ui| {
            ui.add_space(60.0);
            ui.heading("cachalot — see the pools of PyTorch's caching allocator");
            ui.add_space(12.0);
            ui.label("Drop a file here or use Open…: cachalot snapshots (.json), PyTorch snapshot pickles");
            ui.label("(torch.cuda.memory._dump_snapshot), op files (a ID SIZE / f ID).");
            ui.add_space(8.0);
            if ui.button("Run experiment…").clicked() {
                self.run_dialog.open = true;
            }
        });
    }

    fn open_files(&mut self, ctx: &egui::Context) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let _ = ctx;
            self.open_dialog.open = true;
        }
        #[cfg(target_arch = "wasm32")]
        self.inbox.pick_files(ctx.clone());
    }

    fn replay_active(&mut self) {
        let Some(tab) = self.active_tab() else { return };
        let run = tab.run.clone();
        let name = format!("{} (cachalot replay)", run.name);
        self.spawn(name, move |progress| crate::load::replay_run(&run, progress).map(|r| vec![r]));
    }

    fn dialogs(&mut self, ctx: &egui::Context) {
        #[cfg(not(target_arch = "wasm32"))]
        for path in self.open_dialog.show(ctx) {
            self.open_path(path);
        }
        if self.run_dialog.open {
            let mut open = true;
            let mut start = None;
            egui::Window::new("Run experiment").open(&mut open).collapsible(false).show(ctx, |ui| {
                let dialog = &mut self.run_dialog;
                dialog.experiment = dialog.experiment.min(self.experiments.len().saturating_sub(1));
                for (i, e) in self.experiments.iter().enumerate() {
                    ui.radio_value(&mut dialog.experiment, i, e.name()).on_hover_text(e.description());
                }
                if let Some(e) = self.experiments.get(dialog.experiment) {
                    ui.weak(e.description());
                    let backends = e.backends();
                    dialog.backend = dialog.backend.min(backends.len().saturating_sub(1));
                    ui.horizontal(|ui| {
                        egui::ComboBox::new("backend", "backend")
                            .selected_text(backends.get(dialog.backend).cloned().unwrap_or_default())
                            .show_ui(ui, |ui| {
                                for (i, b) in backends.iter().enumerate() {
                                    ui.selectable_value(&mut dialog.backend, i, b);
                                }
                            });
                    });
                    if ui.button("Start").clicked() {
                        start = backends.get(dialog.backend).cloned();
                    }
                }
                if let Some(error) = &dialog.error {
                    ui.colored_label(style::series::OOM, error);
                }
            });
            if let Some(backend) = start {
                let started = self.experiments.get(self.run_dialog.experiment).map(|e| e.start(&backend, ctx));
                match started {
                    Some(Ok(live)) => {
                        self.add_live(live);
                        self.run_dialog.error = None;
                        open = false;
                    }
                    Some(Err(e)) => self.run_dialog.error = Some(e),
                    None => {}
                }
            }
            self.run_dialog.open = open;
        }
    }

    /// The timeline and the selected view of the active run.
    fn run_panels(&mut self, ui: &mut egui::Ui) {
        let Some(tab) = self.tabs.get_mut(self.active) else { return };
        let mut moved = None;
        egui::Panel::top("timeline_panel")
            .frame(style::panel_frame(ui, egui::Frame::side_top_panel(ui.style())))
            .resizable(true)
            .default_size(230.0)
            .min_size(120.0)
            .show(ui, |ui| {
                moved = timeline::ui(ui, &mut tab.run, tab.cursor, &mut tab.timeline);
            });
        if let Some(m) = moved {
            tab.cursor = m;
            if tab.run.live {
                tab.timeline.follow = m == tab.run.end();
            }
        }
        tab.cursor = tab.cursor.min(tab.run.end());
        let RunTab {
            run,
            cursor,
            cache,
            segments: map,
            pools: pools_state,
            events: events_state,
            stats: stats_state,
            ..
        } = tab;
        let state = run.seek(cache, *cursor);
        let mut go = None;
        egui::CentralPanel::default().frame(style::panel_frame(ui, egui::Frame::central_panel(ui.style()))).show(
            ui,
            |ui| match self.view {
                View::Segments => go = segments::ui(ui, run, state, map),
                View::Pools => pools::ui(ui, state, pools_state),
                View::Stats => stats::ui(ui, run, &state.stats, *cursor, stats_state),
                View::Events => go = events::ui(ui, run, *cursor, events_state),
                View::Compare => {}
            },
        );
        if let Some(g) = go {
            *cursor = g.min(run.end());
        }
    }
}

/// One line about the run: where it came from and whether its rebuilt state checks out.
fn run_info(ui: &mut egui::Ui, tab: &RunTab) {
    let run = &tab.run;
    let device = match (&run.device, &run.kind) {
        (Some(d), _) => format!("{} ({})", d.name, d.backend),
        (None, RunKind::Torch { device }) => format!("recorded by PyTorch, device {device}"),
        (None, _) => "device unknown".into(),
    };
    ui.label(format!("{} entries · {device}", format::count(run.trace.len() as u64)));
    if !run.settings.is_empty() {
        ui.monospace(run.settings.as_str());
    }
    match &run.verification {
        Verification::Matches { segments, blocks } => {
            ui.colored_label(style::series::RESERVED, "✔ end state matches the file").on_hover_text(format!(
                "rebuilt {segments} segments and {blocks} blocks, all equal to the recorded ones"
            ));
        }
        Verification::Differs(message) => {
            ui.colored_label(style::series::OOM, "⚠ end state differs").on_hover_text(message.as_str());
        }
        Verification::Unavailable => {}
    }
    if run.initial_inferred {
        ui.colored_label(style::series::ACTIVE, "⚠ trace starts mid-run: initial state inferred")
            .on_hover_text("earlier entries were dropped (ring buffer); the state before the first entry was rebuilt backwards from the end state");
    }
    if run.anomaly_count > 0 {
        let list: Vec<String> = run.anomalies.iter().take(10).map(|a| format!("#{}: {}", a.index, a.message)).collect();
        ui.colored_label(style::series::OOM, format!("{} entries did not fit", run.anomaly_count))
            .on_hover_text(list.join("\n"));
    }
}

impl ViewerApp {
    /// What the viewer shows, as JSON: open runs (name, entries, cursor, whether the end state
    /// verified, whether the timeline was drawn), files loading and notices. For scripts that
    /// drive the web build, and for logs.
    pub fn status_json(&self) -> String {
        let tabs: Vec<serde_json::Value> = self
            .tabs
            .iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.run.name,
                    "entries": t.run.trace.len(),
                    "cursor": t.cursor,
                    "live": t.live.is_some(),
                    "verified": matches!(t.run.verification, Verification::Matches { .. }),
                    "timeline_drawn": t.timeline.plot_area.is_some(),
                })
            })
            .collect();
        let notices: Vec<&str> = self.notices.iter().map(|n| n.text.as_str()).collect();
        serde_json::json!({
            "tabs": tabs,
            "active": self.active,
            "view": self.view.title(),
            "loading": self.loading.len(),
            "notices": notices,
        })
        .to_string()
    }
}

impl eframe::App for ViewerApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.show(ui);
    }

    /// The panels' colour, which shows where they paint no fill of their own (see [`style::panel_frame`]).
    fn clear_color(&self, visuals: &egui::Visuals) -> [f32; 4] {
        visuals.panel_fill.to_normalized_gamma_f32()
    }

    #[cfg(target_arch = "wasm32")]
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(&mut *self)
    }
}
