//! The app: [`ViewerApp`], the one owner of the viewer's state, and its frame loop. What each
//! part of the window does is its module's: [`crate::tabs`] (open runs, the tab strip, the view
//! picker), `loading` (files loaded off the UI path), `dialogs`, the panels
//! ([`crate::timeline`], [`crate::segments`], [`crate::pools`], [`crate::stats`],
//! [`crate::events`], [`crate::side_by_side`]), [`crate::notices`] and [`crate::style`]. None of
//! them imports this module: the app hands each the part of its state that it draws.
//!
//! Heavy work stays off the UI path: files are parsed and their runs built on a thread
//! (natively) or on the frame after they were picked (in the browser, which has no threads),
//! and moving the cursor only replays from the nearest checkpoint ([`crate::model`]).

use crate::dialogs::RunDialog;
use crate::events;
use crate::explain::{self, ExplainAction, ExplainState};
use crate::live::{Experiment, LiveRun};
use crate::loading::{self, Loaded, Loader};
use crate::memory_timeline::{self, MemoryAction};
use crate::model::{Run, RunKind, Verification};
use crate::notices::{self, Notice};
use crate::peak_analysis;
use crate::pools;
use crate::ranks::{self, RanksState};
use crate::segments;
use crate::side_by_side::{self, SideBySideState};
use crate::stats;
use crate::style;
use crate::tabs::{self, RunTab, View};
use crate::timeline::{self, TimelinePick};
use crate::tune::{self, TuneAction, TuneInput, TuneState};

/// The viewer.
pub struct ViewerApp {
    /// Open runs.
    pub tabs: Vec<RunTab>,
    /// The run shown.
    pub active: usize,
    /// The panel under the timeline.
    pub view: View,
    /// The side-by-side panel (the "Compare" tab).
    pub side_by_side: SideBySideState,
    /// Messages at the bottom (load errors, finished runs).
    pub notices: Vec<Notice>,
    /// The Tune tab.
    pub tune: TuneState,
    /// The Explain tab.
    pub explain: ExplainState,
    /// The Ranks tab.
    pub ranks: RanksState,
    /// A replay being made (a Tune candidate's, or the trace's under `policy:cachalot`), to show
    /// beside its trace in Compare once it is open: the trace's tab name and the replay's.
    replay_compare: Option<(String, String)>,
    /// Whether the first trace opened is to be replayed under cachalot's own policy and shown
    /// beside itself once the files are loaded (`cachalot view TRACE --compare-policy`).
    policy_comparison_queued: bool,
    /// The files opened by path, by the name their runs got: where the Tune tab finds a
    /// trace's `expected.json`.
    #[cfg(not(target_arch = "wasm32"))]
    opened_paths: Vec<(String, std::path::PathBuf)>,
    loader: Loader,
    experiments: Vec<Box<dyn Experiment>>,
    run_dialog: RunDialog,
    #[cfg(not(target_arch = "wasm32"))]
    open_dialog: crate::dialogs::OpenDialog,
    #[cfg(not(target_arch = "wasm32"))]
    save_dialog: crate::dialogs::SaveDialog,
    /// Drawn by a software rasterizer (Mesa's llvmpipe or lavapipe on a machine without a GPU): the panels
    /// then paint no fill and the window is cleared to their colour instead (see
    /// [`style::panel_frame`]).
    pub software_rendering: bool,
    /// A button of the program showing the viewer, beside "Run experiment…" (the web page's
    /// "Run on this GPU (WebGPU)…"), and whether it was clicked since the program last asked
    /// ([`ViewerApp::host_button_clicked`]).
    host_button: Option<(String, bool)>,
}

impl Default for ViewerApp {
    fn default() -> Self {
        Self::new()
    }
}

impl ViewerApp {
    /// An empty viewer that offers no experiments: a host hands it those it can run with
    /// [`ViewerApp::with_experiments`] (the `cachalot view` window and the web page give it the
    /// simulator's, [`crate::live::default_experiments`]). "Run experiment…" is always there;
    /// with none given, its dialog says so.
    pub fn new() -> Self {
        ViewerApp {
            tabs: Vec::new(),
            active: 0,
            view: View::Segments,
            side_by_side: SideBySideState::default(),
            notices: Vec::new(),
            tune: TuneState::default(),
            explain: ExplainState::default(),
            ranks: RanksState::default(),
            replay_compare: None,
            policy_comparison_queued: false,
            #[cfg(not(target_arch = "wasm32"))]
            opened_paths: Vec::new(),
            loader: Loader::default(),
            experiments: Vec::new(),
            run_dialog: RunDialog::default(),
            #[cfg(not(target_arch = "wasm32"))]
            open_dialog: crate::dialogs::OpenDialog::default(),
            #[cfg(not(target_arch = "wasm32"))]
            save_dialog: crate::dialogs::SaveDialog::default(),
            software_rendering: false,
            host_button: None,
        }
    }

    /// Adds a button labelled `label` beside "Run experiment…" (in the top bar and on the
    /// welcome screen) for the program showing the viewer, which asks
    /// [`ViewerApp::host_button_clicked`] each frame: what it opens stays closed until asked for.
    pub fn with_host_button(mut self, label: impl Into<String>) -> Self {
        self.host_button = Some((label.into(), false));
        self
    }

    /// Whether the host's button was clicked since the last call.
    pub fn host_button_clicked(&mut self) -> bool {
        self.host_button.as_mut().is_some_and(|(_, clicked)| std::mem::take(clicked))
    }

    /// The host's button, if there is one.
    fn host_button_ui(&mut self, ui: &mut egui::Ui) {
        if let Some((label, clicked)) = &mut self.host_button
            && ui.button(label.as_str()).clicked()
        {
            *clicked = true;
        }
    }

    /// Offers these experiments in "Run experiment", after those given before: the one way
    /// experiments reach the viewer.
    pub fn with_experiments(mut self, experiments: Vec<Box<dyn Experiment>>) -> Self {
        self.experiments.extend(experiments);
        self
    }

    /// Starts the `index`th experiment offered (in the order given to
    /// [`ViewerApp::with_experiments`]) on `backend` at the next frame, as the "Run experiment"
    /// dialog would (`cachalot view --run`). If it cannot start, the dialog opens and says why.
    pub fn start_experiment(&mut self, index: usize, backend: impl Into<String>) {
        self.run_dialog.queue(index, backend);
    }

    /// Sets up fonts and style for an eframe creation context.
    pub fn setup(ctx: &egui::Context) {
        style::setup(ctx);
    }

    /// Adds already built runs as tabs (the last one becomes active).
    pub fn add_runs(&mut self, runs: Vec<Run>) {
        for run in runs {
            for anomaly in run.anomalies.iter().take(1) {
                self.notices.push(Notice::error(format!(
                    "{}: {} entries did not fit, first at #{}: {}",
                    run.name, run.anomaly_count, anomaly.index, anomaly.message
                )));
            }
            self.tabs.push(RunTab::new(run));
            self.active = self.tabs.len() - 1;
        }
    }

    /// Starts loading the bytes of a file called `name` (off the UI thread where there are
    /// threads).
    pub fn open_bytes(&mut self, name: impl Into<String>, bytes: Vec<u8>) {
        let started = self.loader.open_bytes(name.into(), bytes);
        self.notice_failure(started);
    }

    /// Opens a file by path (natively).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_path(&mut self, path: impl Into<std::path::PathBuf>) {
        let path = path.into();
        if let Some(name) = path.file_name() {
            self.opened_paths.push((name.to_string_lossy().into_owned(), path.clone()));
        }
        let started = self.loader.open_path(path);
        self.notice_failure(started);
    }

    /// Fetches a file from the page's server and opens it (in the browser).
    #[cfg(target_arch = "wasm32")]
    pub fn fetch(&self, url: String, ctx: egui::Context) {
        self.loader.fetch(url, &ctx);
    }

    /// Waits until every load has finished (for the command line and tests).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait_for_loads(&mut self) {
        loop {
            for loaded in self.loader.wait() {
                self.finish_load(loaded);
            }
            if !self.start_queued_comparison() {
                break;
            }
        }
        self.show_replay_comparison();
    }

    /// What a replay of `run` under other settings needs ([`tune_input`]).
    #[cfg(not(target_arch = "wasm32"))]
    fn tune_input_of(&self, run: &crate::model::Run) -> Result<TuneInput, String> {
        tune_input(run, &self.opened_paths)
    }

    /// What a replay of `run` under other settings needs: a page opens no file by path, so no
    /// `expected.json` comes with it.
    #[cfg(target_arch = "wasm32")]
    fn tune_input_of(&self, run: &crate::model::Run) -> Result<TuneInput, String> {
        TuneInput::of(run, None)
    }

    /// Replays the shown PyTorch trace under cachalot's own policy (`policy:cachalot`, with the
    /// trace's other settings, memory fraction and device) off the UI path, and shows the replay
    /// beside the trace in Compare, with both peaks and their ratio. A replay made before is
    /// shown at once.
    pub fn compare_policies(&mut self) {
        let Some(tab) = self.active_tab() else { return };
        let input = self.tune_input_of(&tab.run);
        match input {
            Ok(input) => {
                let settings = cachalot_trace::tune::own_policy_settings(input.options.config.settings());
                self.tune_action(TuneAction::Compare { settings, device_total: input.options.device_total });
            }
            Err(e) => self.notices.push(Notice::error(e)),
        }
    }

    /// Asks for [`ViewerApp::compare_policies`] of the first run once the files given are
    /// loaded (`cachalot view TRACE --compare-policy`).
    pub fn compare_policies_when_loaded(&mut self) {
        self.policy_comparison_queued = true;
    }

    /// Starts the queued comparison of policies once nothing loads; returns whether it did.
    fn start_queued_comparison(&mut self) -> bool {
        if !self.policy_comparison_queued || self.is_loading() {
            return false;
        }
        self.policy_comparison_queued = false;
        if self.tabs.is_empty() {
            return false;
        }
        self.active = 0;
        self.compare_policies();
        self.is_loading()
    }

    /// Whether files are still loading.
    pub fn is_loading(&self) -> bool {
        !self.loader.is_empty()
    }

    /// Shows why something could not be started, if it could not.
    fn notice_failure(&mut self, started: Result<(), String>) {
        if let Err(message) = started {
            self.notices.push(Notice::error(message));
        }
    }

    fn finish_load(&mut self, loaded: Loaded) {
        match loaded {
            Ok(runs) => self.add_runs(runs),
            Err(message) => self.notices.push(Notice::error(message)),
        }
    }

    /// Adds a live run fed by `live`.
    pub fn add_live(&mut self, live: LiveRun) {
        self.tabs.push(RunTab::live(live));
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
        for loaded in self.loader.poll() {
            self.finish_load(loaded);
        }
        for tab in &mut self.tabs {
            let notices = tab.poll_live();
            self.notices.extend(notices);
        }
        for message in self.loader.open_dropped(ctx) {
            self.notices.push(Notice::error(message));
        }
        self.start_queued_comparison();
        self.show_replay_comparison();
        if !self.loader.is_empty() || self.has_live_runs() {
            ctx.request_repaint_after(std::time::Duration::from_millis(50));
        }
        if self.tabs.iter().any(|t| t.catching_up()) {
            // The experiment sends nothing more: the frames that take in its backlog are asked
            // for here.
            ctx.request_repaint();
        }
    }

    /// The whole UI (eframe's `App::ui` calls this; tests and the benchmark call it directly).
    pub fn show(&mut self, ui: &mut egui::Ui) {
        let ctx = ui.ctx().clone();
        style::set_software_rendering(&ctx, self.software_rendering);
        self.poll(&ctx);
        self.top_bar(ui);
        notices::bottom_bar(ui, &mut self.notices);
        self.dialogs(&ctx);
        if self.tabs.is_empty() {
            egui::CentralPanel::default()
                .frame(style::panel_frame(ui, egui::Frame::central_panel(ui.style())))
                .show(ui, |ui| self.welcome(ui));
        } else {
            self.active = self.active.min(self.tabs.len() - 1);
            if self.view == View::SideBySide {
                egui::CentralPanel::default()
                    .frame(style::panel_frame(ui, egui::Frame::central_panel(ui.style())))
                    .show(ui, |ui| side_by_side::ui(ui, &mut self.tabs, &mut self.side_by_side));
            } else if self.view == View::Ranks {
                egui::CentralPanel::default()
                    .frame(style::panel_frame(ui, egui::Frame::central_panel(ui.style())))
                    .show(ui, |ui| ranks::ui(ui, &self.tabs, &mut self.ranks));
            } else {
                self.run_panels(ui);
            }
        }
        loading::drop_hint(&ctx);
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
                    self.host_button_ui(ui);
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
                    if ui
                        .add_enabled(replayable, egui::Button::new("Replay under policy:cachalot"))
                        .on_hover_text(
                            "replay this PyTorch trace under cachalot's own policy (policy:cachalot) and show it \
                             beside the trace in Compare, with the peak reserved of each",
                        )
                        .clicked()
                    {
                        self.compare_policies();
                    }
                    self.live_buttons(ui);
                    ui.separator();
                    let close = tabs::tab_strip(ui, &self.tabs, &mut self.active);
                    self.loader.progress_bars(ui);
                    if let Some(i) = close {
                        tabs::close_tab(&mut self.tabs, &mut self.active, i);
                    }
                });
                if !self.tabs.is_empty() {
                    tabs::view_bar(ui, &mut self.view, self.tabs.get(self.active));
                }
            },
        );
    }

    /// For a live run: Stop (its experiment) while it runs and, natively, Save… (the run as a
    /// file) once it ended. Shown only for live runs, so that the bar of a file stays as it was.
    fn live_buttons(&mut self, ui: &mut egui::Ui) {
        let Some(tab) = self.tabs.get(self.active) else { return };
        if let Some(live) = &tab.live {
            if ui
                .add_enabled(!live.stop_requested(), egui::Button::new("⏹ Stop"))
                .on_hover_text("stop the shown run's experiment at its next operation")
                .clicked()
            {
                live.request_stop();
            }
        } else if tab.end_snapshot.is_some() {
            #[cfg(not(target_arch = "wasm32"))]
            if ui
                .button("Save…")
                .on_hover_text("save the shown run as a cachalot snapshot or a PyTorch snapshot pickle")
                .clicked()
            {
                self.save_dialog.open = true;
            }
        }
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
            self.host_button_ui(ui);
        });
    }

    fn open_files(&mut self, ctx: &egui::Context) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let _ = ctx;
            self.open_dialog.open = true;
        }
        #[cfg(target_arch = "wasm32")]
        self.loader.pick_files(ctx);
    }

    fn replay_active(&mut self) {
        let Some(tab) = self.active_tab() else { return };
        let run = tab.run.clone();
        let name = format!("{} (cachalot replay)", run.name);
        let started = self.loader.spawn(name, move |progress| crate::load::replay_run(&run, progress).map(|r| vec![r]));
        self.notice_failure(started);
    }

    fn dialogs(&mut self, ctx: &egui::Context) {
        #[cfg(not(target_arch = "wasm32"))]
        for path in self.open_dialog.show(ctx) {
            self.open_path(path);
        }
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(path) = self.save_dialog.show(ctx, self.tabs.get(self.active)) {
            self.notices.push(Notice::info(format!("wrote {}", path.display())));
        }
        if let Some(live) = self.run_dialog.show(ctx, &self.experiments) {
            self.add_live(live);
        }
    }

    /// The timeline and the selected view of the active run.
    fn run_panels(&mut self, ui: &mut egui::Ui) {
        let Some(tab) = self.tabs.get_mut(self.active) else { return };
        let mut moved = None;
        // The timeline is the picture a run is read by: two fifths of the window at first, at
        // least as tall as its rows of mark labels and a plot need.
        let timeline_height = (ui.available_height() * 0.4).max(230.0);
        egui::Panel::top("timeline_panel")
            .frame(style::panel_frame(ui, egui::Frame::side_top_panel(ui.style())))
            .resizable(true)
            .default_size(timeline_height)
            .min_size(120.0)
            .show(ui, |ui| {
                moved = timeline::ui(ui, &mut tab.run, tab.cursor, &mut tab.timeline);
            });
        if let Some(TimelinePick::Oom(_)) = moved {
            // An OOM marker opens its answer.
            self.view = View::Explain;
            self.explain.focus(&tab.run.name);
        }
        if let Some(m) = moved.map(TimelinePick::cursor) {
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
            memory,
            peak,
            ..
        } = tab;
        let state = run.seek(cache, *cursor);
        let mut go = None;
        let mut memory_action = None;
        let mut tune_action = None;
        let mut explain_action = None;
        #[cfg(not(target_arch = "wasm32"))]
        let opened_paths = &self.opened_paths;
        let tune_state = &mut self.tune;
        let explain_state = &mut self.explain;
        egui::CentralPanel::default().frame(style::panel_frame(ui, egui::Frame::central_panel(ui.style()))).show(
            ui,
            |ui| match self.view {
                View::Segments => go = segments::ui(ui, run, state, map),
                View::Memory => {
                    // The picture over the upper part, the peak analysis at the cursor under it.
                    let height = (ui.available_height() * 0.55).max(160.0);
                    ui.allocate_ui(egui::vec2(ui.available_width(), height), |ui| {
                        memory_action = memory_timeline::ui(ui, run, *cursor, memory);
                    });
                    ui.separator();
                    go = peak_analysis::ui(ui, run, state, *cursor, peak);
                }
                View::Pools => pools::ui(ui, state, run.recorded_end.as_deref(), pools_state),
                View::Stats => stats::ui(ui, run, &state.stats, *cursor, stats_state),
                View::Events => go = events::ui(ui, run, *cursor, events_state),
                View::SideBySide | View::Ranks => {}
                View::Tune => {
                    #[cfg(not(target_arch = "wasm32"))]
                    let input = || tune_input(run, opened_paths);
                    #[cfg(target_arch = "wasm32")]
                    let input = || TuneInput::of(run, None);
                    tune_action = tune::ui(ui, run, input, tune_state);
                }
                View::Explain => {
                    #[cfg(not(target_arch = "wasm32"))]
                    let input = || explain_input(run, opened_paths);
                    #[cfg(target_arch = "wasm32")]
                    let input = || TuneInput::of_trace(run, None);
                    explain_action = explain::ui(ui, run, *cursor, input, explain_state);
                }
            },
        );
        if let Some(g) = go {
            *cursor = g.min(run.end());
        }
        match memory_action {
            Some(MemoryAction::MoveCursor(c)) => *cursor = c.min(run.end()),
            Some(MemoryAction::Select { address, cursor: at }) => {
                *cursor = at.min(run.end());
                map.selected = Some(address);
                self.view = View::Segments;
            }
            None => {}
        }
        if let Some(ExplainAction::MoveCursor(c)) = explain_action {
            *cursor = c.min(run.end());
            ui.ctx().request_repaint();
        }
        if let Some(action) = tune_action {
            self.tune_action(action);
        }
    }

    /// Explains the request at the shown run's cursor, with the fix search, and waits for the
    /// answer (headless pictures: `cachalot view TRACE --view explain --screenshot`). With
    /// `at_first_oom`, the cursor first moves to the run's first out-of-memory error, if any.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn explain_shown_run(&mut self, at_first_oom: bool) {
        let Some(tab) = self.tabs.get_mut(self.active) else { return };
        if let Some(&first) = tab.run.markers.ooms.first()
            && at_first_oom
        {
            tab.cursor = first as usize + 1;
        }
        let input = explain_input(&tab.run, &self.opened_paths);
        self.explain.explain_now(&tab.run, tab.cursor, input, true);
    }

    /// Runs the Tune tab's search of the shown run to its end, on a worker thread waited for
    /// (headless pictures: `cachalot view TRACE --view tune --screenshot`).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn tune_shown_run(&mut self) {
        let Some(tab) = self.tabs.get(self.active) else { return };
        match tune_input(&tab.run, &self.opened_paths) {
            Ok(input) => {
                self.tune.start(&tab.run.name, input, &egui::Context::default());
                self.tune.wait();
            }
            Err(e) => self.tune.result = Some(Err(e)),
        }
    }

    /// Replays the shown trace under a candidate's setting (off the UI path) and shows it beside
    /// the trace in Compare once it is there; a replay made before is shown at once.
    fn tune_action(&mut self, action: TuneAction) {
        let TuneAction::Compare { settings, device_total } = action;
        let Some(tab) = self.tabs.get(self.active) else { return };
        let trace = tab.run.name.clone();
        let name = tune::replay_name(&trace, &settings);
        self.replay_compare = Some((trace.clone(), name.clone()));
        if self.tabs.iter().any(|t| t.run.name == name) {
            self.show_replay_comparison();
            return;
        }
        let input = self.tune_input_of(&tab.run);
        match input {
            Ok(input) => {
                let started = self.loader.spawn(name, move |progress| {
                    input.replay(&trace, &settings, device_total, progress).map(|r| vec![r])
                });
                self.notice_failure(started);
            }
            Err(e) => self.notices.push(Notice::error(e)),
        }
    }

    /// Shows the replay asked for (in the Tune tab, or of the trace under `policy:cachalot`)
    /// beside its trace, once it is open.
    fn show_replay_comparison(&mut self) {
        let Some((trace, replay)) = &self.replay_compare else { return };
        let find = |name: &str| self.tabs.iter().position(|t| t.run.name == *name);
        if let (Some(a), Some(b)) = (find(trace), find(replay)) {
            self.side_by_side.a = a;
            self.side_by_side.b = b;
            self.active = a;
            self.view = View::SideBySide;
            self.replay_compare = None;
        } else if !self.is_loading() {
            // The replay failed (its notice says why) or a tab was closed.
            self.replay_compare = None;
        }
    }

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
                    // Where the plot was drawn (points: left, top, right, bottom) and the
                    // entries at its left and right edges.
                    "timeline_area": t.timeline.plot_area.map(|(r, _, _)| [r.left(), r.top(), r.right(), r.bottom()]),
                    "timeline_entries": t.timeline.plot_area.map(|(_, left, right)| [left, right]),
                    "segments_at_cursor": t.cache.state().map(|s| s.segments.len()),
                })
            })
            .collect();
        let notices: Vec<&str> = self.notices.iter().map(|n| n.text.as_str()).collect();
        serde_json::json!({
            "tabs": tabs,
            "active": self.active,
            "view": self.view.title(),
            "loading": self.loader.len(),
            "notices": notices,
        })
        .to_string()
    }
}

impl eframe::App for ViewerApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.show(ui);
    }

    /// The panels' colour, which shows where they paint no fill of their own (see
    /// [`style::panel_frame`]).
    fn clear_color(&self, visuals: &egui::Visuals) -> [f32; 4] {
        visuals.panel_fill.to_normalized_gamma_f32()
    }

    #[cfg(target_arch = "wasm32")]
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(&mut *self)
    }
}

/// What the Tune tab needs for `run`: its trace and, when it came from a file opened by path,
/// the `expected.json` beside that file (as `cachalot tune` reads it).
#[cfg(not(target_arch = "wasm32"))]
fn tune_input(run: &crate::model::Run, opened: &[(String, std::path::PathBuf)]) -> Result<TuneInput, String> {
    TuneInput::of(run, expected_beside(run, opened)?.as_ref())
}

/// What the Explain tab needs for `run`: as [`tune_input`], for any run with a whole trace.
#[cfg(not(target_arch = "wasm32"))]
fn explain_input(run: &crate::model::Run, opened: &[(String, std::path::PathBuf)]) -> Result<TuneInput, String> {
    TuneInput::of_trace(run, expected_beside(run, opened)?.as_ref())
}

/// The `expected.json` beside the file `run` came from, where it was opened by path.
#[cfg(not(target_arch = "wasm32"))]
fn expected_beside(
    run: &crate::model::Run,
    opened: &[(String, std::path::PathBuf)],
) -> Result<Option<cachalot_trace::replay::ExpectedRun>, String> {
    // A pickle with several devices names its runs "NAME [device D]".
    let file = run.name.split(" [device ").next().unwrap_or(&run.name);
    match opened.iter().rev().find(|(name, _)| name == file) {
        Some((_, path)) => cachalot_trace::replay::ExpectedRun::beside(path),
        None => Ok(None),
    }
}
