//! The "Ranks" tab: the ranks of one distributed job (`cachalot view rank0.pickle rank1.pickle
//! ...`, one file per rank) side by side, aligned by step, and where they differ.
//!
//! # What a step is
//!
//! A trace does not say where a training step or a served request begins, so each rank's steps
//! are found from the rank's own trace ([`find_steps`]):
//!
//! - **marks**, where the run has them (cachalot runs of `cachalot run`, saved live runs): each
//!   mark ends a step, named after it;
//! - otherwise **the recurring low of allocated memory**: a step ends each time allocated memory
//!   falls back to the level it returns to between steps (the weights and optimizer state of a
//!   training job, nothing for a server between requests), after having risen well above it.
//!   That level is found among the valleys of allocated memory (a fall followed by a rise),
//!   each with the others within 1% of the peak around it (a rank's step-end level moves by a
//!   few blocks from step to step): the one that ends the most cycles, the lowest at a tie,
//!   where a cycle rises a quarter of the way from the level to the peak and comes back within
//!   1% of the peak of the level (so a dip between two layers of one step does not end it),
//!   and no cycle after the first falls below the level (a level the steps dip under within
//!   each step is not their low; the first step may, setting up what stays, such as the
//!   optimizer's state). What follows the last return to the low is one more range (the
//!   clean-up, or a last step that ends by freeing everything); a job with gradient
//!   accumulation counts its micro-batches.
//!
//! Steps are then aligned by their number, and for each the tab compares the ranks' peak
//! allocated, peak reserved and allocated memory at the step's end: a cell that differs from
//! the first rank's is drawn in the error colour, and a line names the first step where they
//! part. The plot draws each rank's allocated memory over steps (each step stretched to one
//! unit), so the ranks line up step by step however many entries each took.

use egui_plot::{Line, LineStyle, Plot, PlotPoints};

use crate::format;
use crate::model::Run;
use crate::style;
use crate::tabs::RunTab;

/// Valleys within this fraction of the peak of each other count as one level.
const LEVEL_TOLERANCE: f64 = 0.01;
/// The rise, as a fraction of the way from the level to the peak, that a cycle must make.
const CYCLE_RISE: f64 = 0.25;
/// Levels tried, the most populated first.
const LEVELS_TRIED: usize = 32;
/// Points per rank in the plot of steps.
const PLOT_POINTS: usize = 4000;

/// Where a run's steps came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepSource {
    /// The run's marks.
    Marks,
    /// The recurring low of allocated memory.
    RecurringLow {
        /// The level, bytes (its lowest valley; the steps end within 1% of the peak of it).
        level: u64,
    },
    /// Neither: the whole run is one step.
    Whole,
}

/// A run's steps: consecutive ranges of cursor positions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Steps {
    /// How they were found.
    pub source: StepSource,
    /// The cursor positions where steps end, ascending; the last step ends at the run's end.
    /// Step `k` covers `bounds[k - 1]..=bounds[k]` (from 0 for the first).
    pub bounds: Vec<usize>,
    /// Step names (the marks' labels; `step N` otherwise; `after ...` for what follows the
    /// last step).
    pub names: Vec<String>,
    /// Whether the last range is what follows the last step, not a step.
    pub tail: bool,
}

impl Steps {
    /// Number of ranges: the steps, and what follows the last one where [`Steps::tail`].
    pub fn len(&self) -> usize {
        self.bounds.len()
    }

    /// Number of steps, not counting what follows the last one.
    pub fn steps(&self) -> usize {
        self.bounds.len() - usize::from(self.tail)
    }

    /// Whether there is no step (an empty run).
    pub fn is_empty(&self) -> bool {
        self.bounds.is_empty()
    }

    /// The cursor range of step `k`.
    pub fn range(&self, k: usize) -> std::ops::RangeInclusive<usize> {
        let start = if k == 0 { 0 } else { self.bounds[k - 1] };
        start..=self.bounds[k]
    }
}

/// The steps of `run` (see the module's documentation).
pub fn find_steps(run: &Run) -> Steps {
    let end = run.end();
    let marked: Vec<&cachalot_core::Mark> =
        run.marks.iter().filter(|m| m.trace_index > 0 && (m.trace_index as usize) < end).collect();
    if !marked.is_empty() {
        let mut bounds: Vec<usize> = Vec::new();
        let mut names = Vec::new();
        for m in marked {
            if bounds.last().is_some_and(|&b| b >= m.trace_index as usize) {
                continue;
            }
            bounds.push(m.trace_index as usize);
            names.push(m.label.clone());
        }
        bounds.push(end);
        names.push(format!("after {}", names.last().map_or("", String::as_str)));
        return Steps { source: StepSource::Marks, bounds, names, tail: true };
    }
    let values = &run.allocated.values()[..(end + 1).min(run.allocated.len())];
    match recurring_low(values) {
        Some((level, mut bounds)) => {
            let mut names: Vec<String> = (1..=bounds.len()).map(|k| format!("step {k}")).collect();
            let tail = bounds.last() != Some(&end);
            if tail {
                bounds.push(end);
                names.push(format!("after step {}", names.len()));
            }
            Steps { source: StepSource::RecurringLow { level }, bounds, names, tail }
        }
        None => Steps { source: StepSource::Whole, bounds: vec![end], names: vec!["whole run".into()], tail: false },
    }
}

/// The recurring low of `values` (allocated bytes at every cursor position) and the positions
/// where it ends a cycle; `None` where no level ends two cycles.
pub fn recurring_low(values: &[u64]) -> Option<(u64, Vec<usize>)> {
    // The series as runs of one value: (first position, value).
    let mut runs: Vec<(usize, u64)> = Vec::new();
    for (i, &v) in values.iter().enumerate() {
        if runs.last().is_none_or(|&(_, last)| last != v) {
            runs.push((i, v));
        }
    }
    let peak = values.iter().copied().max()?;
    let tolerance = ((peak as f64 * LEVEL_TOLERANCE) as u64).max(512);
    // Valleys (a fall, then a rise); a level is tried at each valley with others within the
    // tolerance around it, the most such neighbours first, and not again within the tolerance
    // of one tried.
    let mut valleys: Vec<u64> =
        runs.windows(3).filter(|w| w[1].1 < w[0].1 && w[1].1 < w[2].1).map(|w| w[1].1).collect();
    valleys.sort_unstable();
    let neighbours = |v: u64| {
        let from = valleys.partition_point(|&x| x < v.saturating_sub(tolerance));
        let to = valleys.partition_point(|&x| x <= v + tolerance);
        to - from
    };
    let mut candidates: Vec<(u64, usize)> = valleys.iter().map(|&v| (v, neighbours(v))).collect();
    candidates.dedup();
    candidates.sort_by_key(|&(v, n)| (std::cmp::Reverse(n), v));
    let mut tried: Vec<u64> = Vec::new();
    for (v, n) in candidates {
        if n < 2 || tried.len() == LEVELS_TRIED {
            break;
        }
        if tried.iter().all(|&t| t.abs_diff(v) > tolerance) {
            tried.push(v);
        }
    }
    let mut best: Option<(u64, Vec<usize>)> = None;
    for low in tried {
        let Some(bounds) = cycles(&runs, low, tolerance, peak) else { continue };
        let better = best.as_ref().is_none_or(|(best_low, best_bounds)| {
            bounds.len() > best_bounds.len() || (bounds.len() == best_bounds.len() && low < *best_low)
        });
        if better {
            best = Some((low, bounds));
        }
    }
    best
}

/// The positions where the series (as runs of one value) comes back to the level `low` (within
/// `tolerance`) after having risen a [`CYCLE_RISE`] of the way to `peak` since the last such
/// position; `None` where that happens fewer than twice, or where the series falls below the
/// level within a cycle after the first (then it is not the low the steps return to, but a
/// dip within a step; the first cycle may: a job's first step sets up what stays, e.g. the
/// optimizer's state).
fn cycles(runs: &[(usize, u64)], low: u64, tolerance: u64, peak: u64) -> Option<Vec<usize>> {
    let band = low.saturating_sub(tolerance)..=low + tolerance;
    let high = low + (peak.saturating_sub(low) as f64 * CYCLE_RISE) as u64;
    let mut armed = false;
    let mut bounds = Vec::new();
    // The lowest value since the second position found, and as it was at the last one found.
    let (mut lowest, mut lowest_at_last) = (u64::MAX, u64::MAX);
    for &(position, value) in runs {
        if bounds.len() >= 2 {
            lowest = lowest.min(value);
        }
        if value >= high && value > *band.end() {
            armed = true;
        } else if armed && band.contains(&value) {
            bounds.push(position);
            armed = false;
            lowest_at_last = lowest;
        }
    }
    (bounds.len() >= 2 && lowest_at_last >= *band.start()).then_some(bounds)
}

/// One measure of a step, compared across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// The most allocated memory within the step.
    PeakAllocated,
    /// The most reserved memory within the step.
    PeakReserved,
    /// Allocated memory where the step ends.
    AllocatedAtEnd,
}

impl Measure {
    /// Every measure, in the picker's order.
    pub const ALL: [Measure; 3] = [Measure::PeakAllocated, Measure::PeakReserved, Measure::AllocatedAtEnd];

    /// What the picker and the table call it.
    pub fn name(self) -> &'static str {
        match self {
            Measure::PeakAllocated => "peak allocated",
            Measure::PeakReserved => "peak reserved",
            Measure::AllocatedAtEnd => "allocated at the step's end",
        }
    }

    /// Its value over `range` of `run`.
    pub fn of(self, run: &Run, range: std::ops::RangeInclusive<usize>) -> u64 {
        let peak = |values: &[u64]| values.get(range.clone()).and_then(|v| v.iter().copied().max()).unwrap_or(0);
        match self {
            Measure::PeakAllocated => peak(run.allocated.values()),
            Measure::PeakReserved => peak(run.reserved.values()),
            Measure::AllocatedAtEnd => run.allocated.at(*range.end()),
        }
    }
}

/// One rank's steps and their measures.
#[derive(Clone, Debug)]
pub struct RankSteps {
    /// The run's name.
    pub run: String,
    /// Its trace length when the steps were found (a live run grows).
    entries: usize,
    /// The steps.
    pub steps: Steps,
    /// Each step's [`Measure::ALL`].
    pub measures: Vec<[u64; 3]>,
}

impl RankSteps {
    /// The steps of `run` and their measures.
    pub fn of(run: &Run) -> Self {
        let steps = find_steps(run);
        let measures = (0..steps.len()).map(|k| Measure::ALL.map(|m| m.of(run, steps.range(k)))).collect();
        RankSteps { run: run.name.clone(), entries: run.trace.len(), steps, measures }
    }
}

/// Where two ranks part: the first step whose measure differs from the first rank's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// The step (0-based).
    pub step: usize,
    /// The measure.
    pub measure: Measure,
    /// The other rank's index among those compared.
    pub rank: usize,
    /// The first rank's value and the other's.
    pub values: (u64, u64),
}

/// Every step and measure where a rank differs from the first, in step order, and the ranks
/// whose number of steps differs from the first's.
pub fn differences(ranks: &[RankSteps]) -> (Vec<Difference>, Vec<usize>) {
    let Some(first) = ranks.first() else { return (Vec::new(), Vec::new()) };
    let mut found = Vec::new();
    let steps = ranks.iter().map(|r| r.measures.len()).max().unwrap_or(0);
    for step in 0..steps {
        for (rank, other) in ranks.iter().enumerate().skip(1) {
            for (m, measure) in Measure::ALL.into_iter().enumerate() {
                let (Some(a), Some(b)) = (first.measures.get(step), other.measures.get(step)) else { continue };
                if a[m] != b[m] {
                    found.push(Difference { step, measure, rank, values: (a[m], b[m]) });
                }
            }
        }
    }
    let counts = ranks.iter().enumerate().skip(1).filter(|(_, r)| r.steps.len() != first.steps.len()).map(|(i, _)| i);
    (found, counts.collect())
}

/// What the Ranks tab remembers.
#[derive(Debug)]
pub struct RanksState {
    /// The measure the table shows.
    pub measure: Measure,
    /// Runs left out (by name): every open run is a rank unless left out.
    pub left_out: Vec<String>,
    /// The steps of each run, found once per run and trace length.
    found: Vec<RankSteps>,
}

impl Default for RanksState {
    fn default() -> Self {
        RanksState { measure: Measure::PeakAllocated, left_out: Vec::new(), found: Vec::new() }
    }
}

impl RanksState {
    /// The steps of `run`, found now if not yet for its current length.
    fn steps_of(&mut self, run: &Run) -> RankSteps {
        if let Some(found) = self.found.iter().find(|f| f.run == run.name && f.entries == run.trace.len()) {
            return found.clone();
        }
        let found = RankSteps::of(run);
        self.found.retain(|f| f.run != run.name);
        self.found.push(found.clone());
        found
    }
}

/// The Ranks tab over the open runs.
pub fn ui(ui: &mut egui::Ui, tabs: &[RunTab], state: &mut RanksState) {
    ui.horizontal_wrapped(|ui| {
        ui.label("ranks:");
        for tab in tabs {
            let mut shown = !state.left_out.contains(&tab.run.name);
            if ui.checkbox(&mut shown, tab.run.name.as_str()).changed() {
                state.left_out.retain(|n| *n != tab.run.name);
                if !shown {
                    state.left_out.push(tab.run.name.clone());
                }
            }
        }
    });
    let shown: Vec<&RunTab> = tabs.iter().filter(|t| !state.left_out.contains(&t.run.name)).collect();
    if shown.len() < 2 {
        ui.add_space(12.0);
        ui.label(
            "Open the ranks of one job, one file each (cachalot view rank0.pickle rank1.pickle ...), to see them \
             side by side, aligned by step.",
        );
        return;
    }
    let ranks: Vec<RankSteps> = shown.iter().map(|t| state.steps_of(&t.run)).collect();
    let (found, counts) = differences(&ranks);
    ui.horizontal_wrapped(|ui| {
        for r in &ranks {
            let how = match &r.steps.source {
                StepSource::Marks => "from its marks".to_owned(),
                StepSource::RecurringLow { level } => {
                    format!("where allocated memory falls back to {}", format::bytes(*level))
                }
                StepSource::Whole => "no recurring low: one step".to_owned(),
            };
            let after = if r.steps.tail { " and what follows" } else { "" };
            ui.label(format!("{}: {} steps{after}, {how}", r.run, r.steps.steps()));
            ui.separator();
        }
    });
    summary(ui, &ranks, &found, &counts);
    let height = (ui.available_height() * 0.4).max(140.0);
    ui.allocate_ui(egui::vec2(ui.available_width(), height), |ui| plot(ui, &shown, &ranks));
    ui.horizontal(|ui| {
        ui.label("compare");
        for m in Measure::ALL {
            ui.selectable_value(&mut state.measure, m, m.name());
        }
    });
    table(ui, &ranks, state.measure);
}

/// One line: do the ranks agree, and where do they first part.
fn summary(ui: &mut egui::Ui, ranks: &[RankSteps], found: &[Difference], counts: &[usize]) {
    for &i in counts {
        ui.colored_label(
            style::series::OOM,
            format!(
                "{} has {} steps, {} has {}: steps past the shorter are compared with nothing",
                ranks[i].run,
                ranks[i].steps.steps(),
                ranks[0].run,
                ranks[0].steps.steps()
            ),
        );
    }
    match found.first() {
        None => {
            ui.colored_label(
                style::series::RESERVED,
                "✔ every step's peak allocated, peak reserved and allocated at its end are equal on every rank",
            );
        }
        Some(d) => {
            let steps: std::collections::BTreeSet<usize> = found.iter().map(|d| d.step).collect();
            ui.colored_label(
                style::series::OOM,
                format!(
                    "the ranks differ at {} of {} ranges; first at {}: {} {} on {}, {} on {} ({})",
                    steps.len(),
                    ranks[0].steps.len(),
                    ranks[0].steps.names.get(d.step).map_or("?", String::as_str),
                    d.measure.name(),
                    format::bytes(d.values.0),
                    ranks[0].run,
                    format::bytes(d.values.1),
                    ranks[d.rank].run,
                    signed(d.values.1, d.values.0)
                ),
            );
        }
    }
}

/// `b - a` in bytes, with its sign.
fn signed(b: u64, a: u64) -> String {
    if b >= a { format!("+{}", format::bytes(b - a)) } else { format!("-{}", format::bytes(a - b)) }
}

/// Each rank's allocated memory over steps: step `k` drawn over `k..k + 1`, the most allocated
/// of each slice of it, so that the ranks line up step by step.
fn plot(ui: &mut egui::Ui, shown: &[&RunTab], ranks: &[RankSteps]) {
    let colors = [
        style::series::ALLOCATED,
        style::series::ACTIVE,
        style::series::RESERVED,
        style::series::EMPTY_CACHE,
        style::series::OOM,
        egui::Color32::from_rgb(0, 188, 212),
        egui::Color32::from_rgb(205, 220, 57),
        egui::Color32::from_gray(200),
    ];
    Plot::new("ranks_plot")
        .legend(egui_plot::Legend::default().position(egui_plot::Corner::LeftTop))
        .allow_scroll(false)
        .x_axis_label("steps done")
        .y_axis_formatter(crate::timeline::bytes_axis)
        .y_grid_spacer(egui_plot::log_grid_spacer(4))
        .show(ui, |plot_ui| {
            for (i, (tab, rank)) in shown.iter().zip(ranks).enumerate() {
                let points = step_points(&tab.run, &rank.steps);
                let style = if i == 0 { LineStyle::Solid } else { LineStyle::dashed_dense() };
                plot_ui.line(
                    Line::new(format!("allocated — {}", tab.run.name), PlotPoints::new(points))
                        .color(colors[i % colors.len()])
                        .style(style),
                );
            }
        });
}

/// The plot's points of `run`: each step in [`PLOT_POINTS`] / steps slices, the most allocated
/// of each.
fn step_points(run: &Run, steps: &Steps) -> Vec<[f64; 2]> {
    let values = run.allocated.values();
    let per_step = (PLOT_POINTS / steps.len().max(1)).max(2);
    let mut points = Vec::new();
    for k in 0..steps.len() {
        let range = steps.range(k);
        let (start, end) = (*range.start(), (*range.end()).min(values.len().saturating_sub(1)));
        if end < start {
            continue;
        }
        let len = end - start + 1;
        let slices = per_step.min(len);
        for s in 0..slices {
            let (a, b) = (start + s * len / slices, start + (s + 1) * len / slices);
            let most = values[a..b.max(a + 1).min(end + 1)].iter().copied().max().unwrap_or(0);
            points.push([k as f64 + s as f64 / slices as f64, most as f64]);
        }
    }
    if let Some(&last) = points.last() {
        points.push([steps.len() as f64, last[1]]);
    }
    points
}

/// The steps as rows, the ranks as columns, of one measure; a value that differs from the first
/// rank's in the error colour, with the difference.
fn table(ui: &mut egui::Ui, ranks: &[RankSteps], measure: Measure) {
    let m = Measure::ALL.iter().position(|&x| x == measure).unwrap_or(0);
    let steps = ranks.iter().map(|r| r.measures.len()).max().unwrap_or(0);
    egui::ScrollArea::both().auto_shrink([false, false]).show(ui, |ui| {
        egui::Grid::new("ranks_table").striped(true).num_columns(ranks.len() + 1).show(ui, |ui| {
            ui.strong("step");
            for r in ranks {
                ui.strong(r.run.as_str());
            }
            ui.end_row();
            for k in 0..steps {
                ui.label(ranks[0].steps.names.get(k).map_or_else(|| format!("step {}", k + 1), Clone::clone));
                let first = ranks[0].measures.get(k).map(|v| v[m]);
                for r in ranks {
                    match (r.measures.get(k).map(|v| v[m]), first) {
                        (None, _) => {
                            ui.label("—");
                        }
                        (Some(v), Some(f)) if v != f => {
                            ui.colored_label(style::series::OOM, format!("{} ({})", format::bytes(v), signed(v, f)))
                                .on_hover_text(format!("{v} B against {f} B"));
                        }
                        (Some(v), _) => {
                            ui.label(format::bytes(v)).on_hover_text(format!("{v} B"));
                        }
                    }
                }
                ui.end_row();
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Allocated bytes of a job: weights (100 MiB), then steps that rise to about 1000 MiB and
    /// fall back to the weights and optimizer state (300 MiB), with a dip inside each step.
    fn job(steps: usize) -> Vec<u64> {
        let mut values = vec![0, 100, 100, 300];
        for _ in 0..steps {
            values.extend([500, 800, 700, 1000, 900, 600, 300]);
        }
        values.extend([100, 0]);
        values.into_iter().map(|v| v * MIB).collect()
    }

    #[test]
    fn steps_end_where_allocated_memory_falls_back_to_its_recurring_low() {
        let values = job(5);
        let (level, bounds) = recurring_low(&values).unwrap();
        assert_eq!(level, 300 * MIB);
        // Each step's return to 300 MiB, after its rise: five of them.
        assert_eq!(bounds.len(), 5, "{bounds:?}");
        assert!(bounds.iter().all(|&b| values[b] == 300 * MIB));
        // The dip from 800 to 700 MiB inside each step recurs as often, but the series falls
        // below it between those dips: not the low the steps return to.
        assert_eq!(recurring_low(&[0, 10, 0]), None, "one cycle is no recurrence");
        assert_eq!(recurring_low(&[]), None);
        assert_eq!(recurring_low(&[5, 5, 5]), None);
    }

    #[test]
    fn levels_a_few_blocks_apart_are_one_level() {
        // A rank's level moves by a few blocks from step to step.
        let mut values = vec![0, 100_000];
        for k in 0..4u64 {
            values.extend([500_000, 1_000_000, 100_000 + k * 512]);
        }
        values.push(0);
        let (level, bounds) = recurring_low(&values).unwrap();
        assert_eq!(level, 100_000);
        assert_eq!(bounds.len(), 4, "{bounds:?}");
    }
}
