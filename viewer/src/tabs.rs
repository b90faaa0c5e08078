//! The open runs as tabs: what each remembers ([`RunTab`]), which panel shows it ([`View`]),
//! the tab strip, the view picker with its line about the run, and how a tab takes in what its
//! live experiment sent since the last frame.

use crate::events::EventsState;
use crate::format;
use crate::live::ingest::{Backlog, CATCH_UP_BUDGET, RUNNING_BUDGET};
use crate::live::{LiveEvent, LiveRun};
use crate::memory_timeline::MemoryTimelineState;
use crate::model::{Rules, Run, RunKind, StateCache, Verification};
use crate::notices::Notice;
use crate::peak_analysis::PeakAnalysisState;
use crate::pools::PoolsState;
use crate::segments::SegmentMapState;
use crate::stats::StatsState;
use crate::style;
use crate::timeline::TimelineState;

/// The panel under the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// The segment map at the cursor.
    Segments,
    /// The Active Memory Timeline with the peak analysis at the cursor.
    Memory,
    /// Pools, largest free block, free-block histogram.
    Pools,
    /// `memory_stats()` and `memory_summary()`.
    Stats,
    /// The trace as a list.
    Events,
    /// Two runs side by side ([`crate::side_by_side`]); its tab is titled "Compare".
    SideBySide,
    /// The settings a PyTorch trace needs ([`crate::tune`]).
    Tune,
    /// Why the request at the cursor ran out of memory, and the fix ([`crate::explain`]).
    Explain,
    /// The open runs as the ranks of one job, aligned by step ([`crate::ranks`]).
    Ranks,
}

impl View {
    /// Every view, in tab order.
    pub const ALL: [View; 9] = [
        View::Segments,
        View::Memory,
        View::Pools,
        View::Stats,
        View::Events,
        View::SideBySide,
        View::Tune,
        View::Explain,
        View::Ranks,
    ];

    /// The tab's title.
    pub fn title(self) -> &'static str {
        match self {
            View::Segments => "Segments",
            View::Memory => "Memory",
            View::Pools => "Pools",
            View::Stats => "Stats",
            View::Events => "Events",
            View::SideBySide => "Compare",
            View::Tune => "Tune",
            View::Explain => "Explain",
            View::Ranks => "Ranks",
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
    /// Active Memory Timeline settings and its cached picture.
    pub memory: MemoryTimelineState,
    /// Peak analysis settings.
    pub peak: PeakAnalysisState,
    /// What a live experiment sent when it ended (its end state and facts; the trace came
    /// entry by entry): what [`crate::live::save`] writes with the received trace.
    pub end_snapshot: Option<Box<cachalot_trace::Snapshot>>,
    /// What the live experiment sent that the run has not taken in yet ([`Backlog`]).
    backlog: Backlog,
    /// Whether the live experiment ended (finished or failed); the tab stays live until its
    /// backlog is taken in.
    live_ended: bool,
}

impl RunTab {
    /// A tab for `run` with the cursor at its peak ([`peak_cursor`]).
    pub fn new(run: Run) -> Self {
        let cursor = peak_cursor(&run);
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
            memory: MemoryTimelineState::default(),
            peak: PeakAnalysisState::default(),
            end_snapshot: None,
            backlog: Backlog::default(),
            live_ended: false,
        }
    }

    /// A tab for a live run fed by `live`, empty until the experiment's `Start` arrives.
    pub fn live(live: LiveRun) -> Self {
        let mut run = Run::new("starting…", RunKind::Live, Rules::default());
        run.live = true;
        let mut tab = RunTab::new(run);
        tab.live = Some(live);
        tab
    }

    /// Whether the live experiment ended but the run is still taking in what it sent.
    pub fn catching_up(&self) -> bool {
        self.live.is_some() && self.live_ended
    }

    /// Takes in what the live experiment sent since the last call, if one feeds this tab,
    /// within a time budget ([`crate::live::ingest`]), and lets go of it once it finished or
    /// failed and all it sent is in the run. Returns the messages for the bottom of the window.
    pub fn poll_live(&mut self) -> Vec<Notice> {
        let mut notices = Vec::new();
        let Some(live) = &mut self.live else { return notices };
        let (events, connected) = live.poll();
        if !connected {
            self.live_ended = true;
        }
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
                    self.run = run;
                    self.backlog.clear();
                    self.cache.clear();
                }
                LiveEvent::Stack { id, frames } => {
                    let got = self.run.contexts.intern(&frames);
                    if got != id {
                        notices.push(Notice::error(format!("{}: stack {} arrived as {}", self.run.name, id.0, got.0)));
                    }
                }
                LiveEvent::Entries(entries) => self.backlog.push_entries(entries),
                LiveEvent::Mark(mark) => self.backlog.push_mark(mark),
                LiveEvent::Finished(snapshot) => {
                    // A run that stopped early says why in its facts (`cachalot-runtime`'s record).
                    let stopped = snapshot.as_ref().and_then(|s| {
                        s.device.details.iter().find(|(k, _)| k == RUN_ERROR_DETAIL).map(|(_, v)| v.clone())
                    });
                    if let Some(snapshot) = snapshot {
                        self.run.recorded_end = Some(snapshot.segments.clone());
                        self.run.recorded_stats = Some(snapshot.stats.clone());
                        self.end_snapshot = Some(snapshot);
                    }
                    self.live_ended = true;
                    let entries = format::count((self.run.trace.len() + self.backlog.entries()) as u64);
                    notices.push(match stopped {
                        Some(why) => {
                            Notice::error(format!("{}: ended early after {entries} entries: {why}", self.run.name))
                        }
                        None => Notice::info(format!("{}: finished, {entries} entries", self.run.name)),
                    });
                }
                LiveEvent::Failed(message) => {
                    self.live_ended = true;
                    notices.push(Notice::error(format!("{}: {message}", self.run.name)));
                }
            }
        }
        let budget = if self.live_ended { CATCH_UP_BUDGET } else { RUNNING_BUDGET };
        self.backlog.ingest(&mut self.run, budget);
        let done = self.live_ended && self.backlog.is_empty();
        if done {
            self.live = None;
            self.live_ended = false;
            self.run.finish();
            self.cache.clear();
        }
        if self.timeline.follow && self.run.live {
            self.cursor = self.run.end();
        } else if self.timeline.follow && done {
            // The run is whole: it shows where a file of it would open, at its peak (at its end
            // a run has often freed everything, and the segment map would show nothing).
            self.cursor = peak_cursor(&self.run);
        }
        notices
    }
}

/// The fact of a run's snapshot that says why the run did not finish (written by
/// `cachalot-runtime`'s run record).
pub const RUN_ERROR_DETAIL: &str = "run: error";

/// Where a run opens: the first moment its allocated memory is at its peak, which is where a
/// reader of a memory picture looks first (at the end, a run has often freed everything, and the
/// segment map would show nothing). A run that never allocates opens at its end.
pub fn peak_cursor(run: &Run) -> usize {
    let values = run.allocated.values();
    let peak = values.iter().copied().max().unwrap_or(0);
    match values.iter().position(|&v| v == peak) {
        Some(cursor) if peak > 0 => cursor,
        _ => run.end(),
    }
}

/// The tab strip: a label per open run (⏺ while an experiment feeds it) to show it, and a
/// button to close it. Returns the tab whose close button was clicked.
pub fn tab_strip(ui: &mut egui::Ui, tabs: &[RunTab], active: &mut usize) -> Option<usize> {
    let mut close = None;
    for (i, tab) in tabs.iter().enumerate() {
        let live = if tab.live.is_some() { "⏺ " } else { "" };
        let title = format!("{live}{}", tab.run.name);
        if ui.selectable_label(i == *active, title).clicked() {
            *active = i;
        }
        if ui.small_button("×").on_hover_text(format!("close {}", tab.run.name)).clicked() {
            close = Some(i);
        }
    }
    close
}

/// Closes tab `i`, asking its experiment (if any) to stop, and keeps `active` on an open tab.
pub fn close_tab(tabs: &mut Vec<RunTab>, active: &mut usize, i: usize) {
    if let Some(live) = &tabs[i].live {
        live.request_stop();
    }
    tabs.remove(i);
    *active = (*active).min(tabs.len().saturating_sub(1));
}

/// The view picker and, after it, one line about the run shown.
pub fn view_bar(ui: &mut egui::Ui, view: &mut View, shown: Option<&RunTab>) {
    ui.horizontal(|ui| {
        for v in View::ALL {
            ui.selectable_value(view, v, v.title());
        }
        if let Some(tab) = shown {
            ui.separator();
            run_info(ui, tab);
        }
    });
}

/// One line about the run: where it came from and whether its rebuilt state checks out.
fn run_info(ui: &mut egui::Ui, tab: &RunTab) {
    let run = &tab.run;
    let device = match (&run.device, &run.kind) {
        (Some(d), _) if d.name.trim().is_empty() => format!("unnamed device ({})", d.backend),
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
