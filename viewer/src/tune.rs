//! The "Tune" tab: which `PYTORCH_CUDA_ALLOC_CONF` the shown PyTorch trace needs, from the
//! search of `cachalot tune` ([`cachalot_trace::tune`]), run on a worker thread. The candidates
//! as a chart (peak reserved per setting, in the objective's order, the trace's own settings and
//! the lower bound marked), the ranked table under it, the winning line to copy, and for any
//! candidate its replay beside the original in the Compare tab ([`TuneAction::Compare`]).
//!
//! The search needs what `cachalot tune` reads: the trace, its settings, and where the
//! `NAME.expected.json` of `shared/traces/capture.py` lies beside the pickle, the calls the trace
//! does not show (`empty_cache`), the memory fraction and the device's size. The app hands that
//! file over when it opened the pickle by path ([`TuneInput::of`]).
//!
//! In the browser there is no Tune tab's search: it replays a few hundred candidates in
//! parallel on threads, which a page does not have, and its timings read `std::time::Instant`,
//! which panics there; the tab says so and names the command that does it.

use cachalot_trace::replay::{ExpectedRun, ReplayOptions};
use cachalot_trace::snapshot::torch::{TorchAllocatorSettings, TorchSnapshot};
#[cfg(not(target_arch = "wasm32"))]
use cachalot_trace::tune::Candidate;
use cachalot_trace::tune::{Objective, Tuning};

#[cfg(not(target_arch = "wasm32"))]
use crate::format;
use crate::model::{Run, RunKind};
#[cfg(not(target_arch = "wasm32"))]
use crate::style;

/// What the search of one trace needs: the trace as PyTorch's snapshot and the replay's options.
#[derive(Clone, Debug)]
pub struct TuneInput {
    /// The trace.
    pub snapshot: TorchSnapshot,
    /// Its settings, calls, memory fraction and device.
    pub options: ReplayOptions,
}

impl TuneInput {
    /// The input of a PyTorch run, with the `expected.json` of its file if there is one.
    pub fn of(run: &Run, expected: Option<&ExpectedRun>) -> Result<Self, String> {
        if !matches!(run.kind, RunKind::Torch { .. }) {
            return Err(format!("{} is not a PyTorch trace: tune replays PyTorch snapshot pickles", run.name));
        }
        Self::of_trace(run, expected)
    }

    /// The input of any run with a whole recorded trace (a PyTorch pickle, a cachalot snapshot,
    /// a replay): what `cachalot explain` replays, which reads cachalot snapshots too.
    pub fn of_trace(run: &Run, expected: Option<&ExpectedRun>) -> Result<Self, String> {
        if run.live {
            return Err(format!("{} is still running: its trace is not whole yet", run.name));
        }
        if run.trace.is_empty() {
            return Err(format!("{} has no trace to replay (record it with _record_memory_history)", run.name));
        }
        let mut snapshot = TorchSnapshot {
            device_traces: vec![run.trace.clone()],
            contexts: run.contexts.clone(),
            ..TorchSnapshot::default()
        };
        let config = cachalot_core::AllocatorConfig::parse(&run.settings)
            .map_err(|e| format!("{}: its settings '{}': {e}", run.name, run.settings))?;
        snapshot.allocator_settings = Some(TorchAllocatorSettings::from_config(&config));
        let mut options = ReplayOptions::for_snapshot(&snapshot, expected)
            .map_err(|e| format!("{}: the settings of its expected.json: {e}", run.name))?;
        if expected.is_none() {
            options.memory_fraction = run.memory_fraction;
            if let Some(device) = &run.device {
                options.device_total = device.total_memory;
            }
        }
        Ok(TuneInput { snapshot, options })
    }

    /// Replays the trace under `settings` on a device of `device_total` bytes, as `cachalot stats
    /// TRACE --config SETTINGS --device-total B` does: the replay as a run named after the setting.
    pub fn replay(
        &self,
        name: &str,
        settings: &str,
        device_total: u64,
        progress: &crate::load::Progress,
    ) -> Result<Run, String> {
        let config = cachalot_core::AllocatorConfig::parse(settings).map_err(|e| format!("'{settings}': {e}"))?;
        let options = ReplayOptions { config, device_total, ..self.options.clone() };
        let outcome = cachalot_trace::replay::replay(&self.snapshot, &options, |done, total| progress.set(done, total))
            .map_err(|e| e.to_string())?;
        let source = format!("cachalot replay of {name} under {}", shown(settings));
        let snapshot = cachalot_trace::Snapshot::capture(&outcome.allocator, source);
        Ok(crate::load::snapshot_run(&replay_name(name, settings), snapshot, RunKind::Replay, progress))
    }
}

/// The name of the replay of `trace` under `settings`: the tab the Compare tab shows on the right.
pub fn replay_name(trace: &str, settings: &str) -> String {
    format!("{trace} · {}", shown(settings))
}

/// A setting as the tab shows it: the empty one is PyTorch's defaults.
pub fn shown(settings: &str) -> &str {
    if settings.is_empty() { "(PyTorch's defaults)" } else { settings }
}

/// The line that sets `settings` in a shell.
pub fn paste_line(settings: &str) -> String {
    if settings.is_empty() {
        "unset PYTORCH_CUDA_ALLOC_CONF".to_owned()
    } else {
        format!("PYTORCH_CUDA_ALLOC_CONF={settings}")
    }
}

/// The least a device must hold for the trace: its peak allocated, rounded up to the 512 B
/// PyTorch rounds every request to.
pub fn lower_bound(peak_allocated: u64) -> u64 {
    peak_allocated.div_ceil(512) * 512
}

/// A search running on its thread.
#[cfg(not(target_arch = "wasm32"))]
#[derive(Debug)]
struct Job {
    run: String,
    receiver: std::sync::mpsc::Receiver<Result<Tuning, String>>,
    started: std::time::Instant,
}

/// A search's result, for the run it was made for.
#[derive(Clone, Debug)]
pub struct TuneResult {
    /// The run's name.
    pub run: String,
    /// The search.
    pub tuning: Tuning,
    /// Seconds it took.
    pub seconds: f64,
}

/// What the tab asks of the app.
#[derive(Clone, Debug, PartialEq)]
pub enum TuneAction {
    /// Replay the trace under this setting on this device and open the replay beside the
    /// trace in the Compare tab.
    Compare {
        /// The setting.
        settings: String,
        /// The device's size, bytes.
        device_total: u64,
    },
}

/// What the Tune tab remembers.
#[derive(Debug)]
pub struct TuneState {
    /// What the ranking minimises first.
    pub objective: Objective,
    /// `--device-total` as typed (empty: the trace's device).
    pub device_total: String,
    /// The last search's result (or why it failed).
    pub result: Option<Result<TuneResult, String>>,
    /// The candidate picked in the chart or the table (an index in the ranking).
    pub selected: Option<usize>,
    /// Where the chart was last drawn: bar `i` stands at x = `i`, its height the candidate's
    /// peak reserved (for tests that click a bar).
    pub chart_transform: Option<egui_plot::PlotTransform>,
    #[cfg(not(target_arch = "wasm32"))]
    job: Option<Job>,
}

impl Default for TuneState {
    fn default() -> Self {
        TuneState {
            objective: Objective::PeakReserved,
            device_total: String::new(),
            result: None,
            selected: None,
            chart_transform: None,
            #[cfg(not(target_arch = "wasm32"))]
            job: None,
        }
    }
}

impl TuneState {
    /// Whether a search is running.
    pub fn is_running(&self) -> bool {
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.job.is_some()
        }
        #[cfg(target_arch = "wasm32")]
        {
            false
        }
    }

    /// Starts the search of `input` (the run called `run`) on a worker thread, with the tab's
    /// objective and device.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn start(&mut self, run: &str, mut input: TuneInput, ctx: &egui::Context) {
        if !self.device_total.trim().is_empty() {
            match format::parse_bytes(&self.device_total) {
                Some(total) if total > 0 => input.options.device_total = total,
                _ => {
                    self.result = Some(Err(format!(
                        "device total '{}': not a size (bytes, or with KiB/MiB/GiB)",
                        self.device_total.trim()
                    )));
                    return;
                }
            }
        }
        let (sender, receiver) = std::sync::mpsc::channel();
        let objective = self.objective;
        let ctx = ctx.clone();
        let spawned = std::thread::Builder::new().name("cachalot-tune".into()).spawn(move || {
            let result = cachalot_trace::tune::tune(&input.snapshot, &input.options, objective);
            let _ = sender.send(result.map_err(|e| e.to_string()));
            ctx.request_repaint();
        });
        match spawned {
            Ok(_) => {
                self.job = Some(Job { run: run.to_owned(), receiver, started: std::time::Instant::now() });
                self.result = None;
                self.selected = None;
            }
            Err(e) => self.result = Some(Err(format!("cannot start a thread: {e}"))),
        }
    }

    /// Takes in the search's result once it is there.
    pub fn poll(&mut self) {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(job) = &self.job {
            match job.receiver.try_recv() {
                Ok(result) => self.finish(result),
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
                Err(std::sync::mpsc::TryRecvError::Disconnected) => self.finish(Err(NO_RESULT.into())),
            }
        }
    }

    /// Waits for a running search (for tests and headless pictures).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait(&mut self) {
        if let Some(job) = &self.job {
            let result = job.receiver.recv().unwrap_or_else(|_| Err(NO_RESULT.into()));
            self.finish(result);
        }
    }

    /// Keeps the running search's result, ranked by the tab's objective (which may have changed
    /// while it ran).
    #[cfg(not(target_arch = "wasm32"))]
    fn finish(&mut self, result: Result<Tuning, String>) {
        let Some(job) = self.job.take() else { return };
        let seconds = job.started.elapsed().as_secs_f64();
        self.result = Some(result.map(|mut tuning| {
            tuning.objective = self.objective;
            cachalot_trace::tune::rank(&mut tuning.ranked, self.objective);
            TuneResult { run: job.run, tuning, seconds }
        }));
    }
}

/// Why a search has no result: its thread ended without sending one (it panicked).
#[cfg(not(target_arch = "wasm32"))]
const NO_RESULT: &str = "the search's thread ended without a result";

/// The Tune tab in the browser: why it has no search, and where to get one.
#[cfg(target_arch = "wasm32")]
pub fn ui(
    ui: &mut egui::Ui,
    run: &Run,
    input: impl FnOnce() -> Result<TuneInput, String>,
    state: &mut TuneState,
) -> Option<TuneAction> {
    let _ = (run, input, state);
    ui.add_space(20.0);
    ui.label(
        "Tune is not in the web page: its search replays a few hundred candidate settings in parallel \
         on threads, which a page does not have. Run `cachalot tune TRACE.pickle`, or open the trace in \
         `cachalot view`, for the ranking and each candidate's replay beside the trace.",
    );
    None
}

/// The Tune tab for `run`. `input` is what the search needs, or why the run cannot be tuned.
#[cfg(not(target_arch = "wasm32"))]
pub fn ui(
    ui: &mut egui::Ui,
    run: &Run,
    input: impl FnOnce() -> Result<TuneInput, String>,
    state: &mut TuneState,
) -> Option<TuneAction> {
    state.poll();
    {
        let mut action = None;
        ui.horizontal(|ui| {
            ui.label("objective");
            let mut objective = state.objective;
            for o in Objective::ALL {
                ui.selectable_value(&mut objective, o, o.name());
            }
            if objective != state.objective {
                // Re-ranking needs no replay: every candidate's measures are there.
                state.objective = objective;
                if let Some(Ok(result)) = &mut state.result {
                    result.tuning.objective = objective;
                    cachalot_trace::tune::rank(&mut result.tuning.ranked, objective);
                    state.selected = None;
                }
            }
            ui.separator();
            let label = ui.label("device total");
            ui.add(
                egui::TextEdit::singleline(&mut state.device_total)
                    .hint_text("the trace's device, e.g. 24GiB")
                    .desired_width(150.0),
            )
            .labelled_by(label.id);
            ui.separator();
            if state.is_running() {
                ui.spinner();
                ui.label("replaying the candidates…");
            } else if ui
                .button("Run tune")
                .on_hover_text("cachalot tune TRACE --objective O --device-total B")
                .clicked()
            {
                match input() {
                    Ok(input) => state.start(&run.name, input, ui.ctx()),
                    Err(e) => state.result = Some(Err(e)),
                }
            }
        });
        // A search of another open run is not shown here (it stays for when that run is shown).
        let shown_result = state.result.clone().filter(|r| r.as_ref().map_or(true, |t| t.run == run.name));
        match shown_result {
            None if !state.is_running() => {
                ui.add_space(12.0);
                ui.label(
                    "Replays this trace under the settings PyTorch 2.11 has (expandable_segments, max_split_size_mb, \
                     roundup_power2_divisions, garbage_collection_threshold, the memory fraction), each exactly, \
                     and ranks them: Run tune.",
                );
            }
            None => {}
            Some(Err(e)) => {
                ui.colored_label(style::series::OOM, e);
            }
            Some(Ok(result)) => action = results(ui, &result, state),
        }
        action
    }
}

/// The winner, the chart and the table of a finished search.
#[cfg(not(target_arch = "wasm32"))]
fn results(ui: &mut egui::Ui, result: &TuneResult, state: &mut TuneState) -> Option<TuneAction> {
    let tuning = &result.tuning;
    let mut action = None;
    let winner = tuning.winner();
    let baseline = &tuning.baseline;
    ui.label(format!(
        "{} candidates replayed in {:.2} s on a device of {}, ranked by {}",
        tuning.ranked.len(),
        result.seconds,
        format::bytes(tuning.device_total),
        tuning.objective.name()
    ));
    ui.horizontal_wrapped(|ui| {
        let line = paste_line(&winner.settings);
        ui.label("best:");
        ui.monospace(&line);
        if ui.button("📋 Copy").on_hover_text("copy the line to the clipboard").clicked() {
            ui.ctx().copy_text(line);
        }
        let saved = baseline.peak_reserved as i64 - winner.peak_reserved as i64;
        ui.label(format!(
            "peak reserved {} instead of {} with the trace's own settings ({} saved)",
            format::bytes(winner.peak_reserved),
            format::bytes(baseline.peak_reserved),
            format::bytes_signed(saved)
        ));
    });
    if !winner.fits() {
        let oom = winner.first_new_oom.as_ref().map_or(String::new(), |o| format!(": first at entry #{}", o.index));
        ui.colored_label(style::series::OOM, format!("no setting runs through on this device{oom}"));
    }
    ui.horizontal_wrapped(|ui| {
        // The chart's key: which bar is which, and the lines.
        ui.colored_label(style::series::RESERVED, "■ peak reserved per setting, best first");
        ui.colored_label(
            style::series::ACTIVE,
            format!("■ - - the trace's own settings (#{})", tuning.baseline_rank()),
        );
        ui.colored_label(style::series::OOM, "■ runs out of memory where PyTorch did not");
        ui.colored_label(
            style::series::ALLOCATED,
            format!("— lower bound: peak allocated {}", format::bytes(lower_bound(baseline.peak_allocated))),
        );
        let highest = tuning.ranked.iter().map(|c| c.peak_reserved).max().unwrap_or(0);
        if tuning.device_total <= highest.saturating_mul(2) {
            ui.colored_label(style::series::OOM, format!("— device total {}", format::bytes(tuning.device_total)));
        }
    });
    let chart_height = (ui.available_height() * 0.45).max(160.0);
    ui.allocate_ui(egui::vec2(ui.available_width(), chart_height), |ui| {
        // Clicking a bar opens its candidate beside the trace, as its row's button does.
        if let Some(i) = chart(ui, tuning, state) {
            state.selected = Some(i);
            action = Some(TuneAction::Compare {
                settings: tuning.ranked[i].settings.clone(),
                device_total: tuning.device_total,
            });
        }
    });
    if let Some(c) = state.selected.and_then(|i| tuning.ranked.get(i)) {
        ui.horizontal(|ui| {
            ui.label(format!("#{} {}", state.selected.unwrap_or(0) + 1, shown(&c.settings)));
            if ui.button("Compare with the trace").clicked() {
                action = Some(TuneAction::Compare { settings: c.settings.clone(), device_total: tuning.device_total });
            }
        });
    }
    ui.separator();
    if let Some(a) = table(ui, tuning, &mut state.selected) {
        action = Some(a);
    }
    action
}

/// The bars: peak reserved per candidate in ranking order, the trace's own settings in the
/// active colour, those that run out of memory where PyTorch did not in the OOM colour; the lower
/// bound as a line. Returns the bar clicked.
#[cfg(not(target_arch = "wasm32"))]
fn chart(ui: &mut egui::Ui, tuning: &Tuning, state: &mut TuneState) -> Option<usize> {
    let selected = state.selected;
    use egui_plot::{Bar, BarChart, HLine, Plot};
    let baseline_rank = tuning.baseline_rank();
    let bars: Vec<Bar> = tuning
        .ranked
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let color = if i + 1 == baseline_rank {
                style::series::ACTIVE
            } else if !c.fits() {
                style::series::OOM
            } else {
                style::series::RESERVED
            };
            let color = if selected == Some(i) { style::series::CURSOR } else { color };
            Bar::new(i as f64, c.peak_reserved as f64).width(0.8).fill(color).name(format!(
                "#{} {}\npeak reserved {}",
                i + 1,
                shown(&c.settings),
                format::bytes(c.peak_reserved)
            ))
        })
        .collect();
    let bound = lower_bound(tuning.baseline.peak_allocated);
    let response = Plot::new("tune_chart")
        .allow_scroll(false)
        .y_axis_formatter(|mark, _| format::bytes_axis(mark.value.max(0.0) as u64))
        .x_axis_formatter(|mark, _| {
            let rank = mark.value.round();
            if rank >= 0.0 && (mark.value - rank).abs() < 1e-6 {
                format!("#{}", rank as u64 + 1)
            } else {
                String::new()
            }
        })
        .show(ui, |plot| {
            plot.bar_chart(BarChart::new("peak reserved", bars));
            plot.hline(
                HLine::new(format!("lower bound (peak allocated) {}", format::bytes(bound)), bound as f64)
                    .color(style::series::ALLOCATED),
            );
            plot.hline(
                HLine::new(
                    format!(
                        "the trace's own settings (#{baseline_rank}) {}",
                        format::bytes(tuning.baseline.peak_reserved)
                    ),
                    tuning.baseline.peak_reserved as f64,
                )
                .color(style::series::ACTIVE)
                .style(egui_plot::LineStyle::dashed_loose()),
            );
            // A device the candidates come near (`--device-total`): where they stop fitting.
            let highest = tuning.ranked.iter().map(|c| c.peak_reserved).max().unwrap_or(0);
            if tuning.device_total <= highest.saturating_mul(2) {
                plot.hline(
                    HLine::new(
                        format!("device total {}", format::bytes(tuning.device_total)),
                        tuning.device_total as f64,
                    )
                    .color(style::series::OOM),
                );
            }
            if plot.response().clicked() { plot.pointer_coordinate() } else { None }
        });
    state.chart_transform = Some(response.transform);
    let point = response.inner?;
    let i = point.x.round();
    (i >= 0.0 && (i as usize) < tuning.ranked.len() && point.y >= 0.0).then_some(i as usize)
}

/// The ranked table, the trace's own settings marked; each row's button opens its comparison.
#[cfg(not(target_arch = "wasm32"))]
fn table(ui: &mut egui::Ui, tuning: &Tuning, selected: &mut Option<usize>) -> Option<TuneAction> {
    let baseline_rank = tuning.baseline_rank();
    let mut action = None;
    egui::ScrollArea::both().auto_shrink([false, false]).show(ui, |ui| {
        egui::Grid::new("tune_table").striped(true).num_columns(10).show(ui, |ui| {
            for h in [
                "rank",
                "",
                "peak reserved",
                "reserved / allocated",
                "OOMs",
                "first OOM",
                "device allocs",
                "device frees",
                "allocator time",
                "setting",
            ] {
                ui.strong(h);
            }
            ui.end_row();
            for (i, c) in tuning.ranked.iter().enumerate() {
                let rank = i + 1;
                if ui.selectable_label(*selected == Some(i), format!("#{rank}")).clicked() {
                    *selected = Some(i);
                }
                if ui.small_button(format!("compare #{rank}")).on_hover_text("its replay beside the trace").clicked() {
                    *selected = Some(i);
                    action =
                        Some(TuneAction::Compare { settings: c.settings.clone(), device_total: tuning.device_total });
                }
                row(ui, c);
                let own = if rank == baseline_rank { "  ← the trace's own" } else { "" };
                ui.monospace(format!("{}{own}", shown(&c.settings)));
                ui.end_row();
            }
        });
    });
    action
}

#[cfg(not(target_arch = "wasm32"))]
fn row(ui: &mut egui::Ui, c: &Candidate) {
    ui.label(format::count(c.peak_reserved));
    ui.label(format!("{:.2}", c.reserved_per_allocated()));
    if c.new_ooms > 0 {
        ui.colored_label(style::series::OOM, format!("{} ({} new)", c.ooms, c.new_ooms));
    } else {
        ui.label(c.ooms.to_string());
    }
    ui.label(c.first_oom.as_ref().map_or("-".to_owned(), |o| format!("#{}", o.index)));
    ui.label(c.device_allocs.to_string());
    ui.label(c.device_frees.to_string());
    ui.label(format!("{:.4} s", c.allocator_seconds));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lower_bound_is_peak_allocated_in_whole_512_byte_blocks() {
        assert_eq!(lower_bound(0), 0);
        assert_eq!(lower_bound(1), 512);
        assert_eq!(lower_bound(1024), 1024);
        assert_eq!(paste_line(""), "unset PYTORCH_CUDA_ALLOC_CONF");
        assert_eq!(paste_line("expandable_segments:True"), "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
    }
}
