//! The comparison of runs: snapshots written by `cachalot run` and PyTorch's `expected.json`
//! side by side, with the differences and, where it can be known, why. [`compare_runs`]
//! returns data ([`Comparison`]), not text: the command line renders it as a report, a viewer
//! panel can show the same reasons.
//!
//! The first run is the baseline. For each other run whose marks differ, the reasons are
//! tested, not guessed: each run's snapshot says what it was (the experiment and parameters)
//! and the factors that shape its allocator sequence ([`Factors`]: the matrix-product
//! workspaces, the stream discipline, the allocator settings, the capacity, the largest
//! segment). The experiment is rerun on the simulator, without computing, with the baseline's
//! factors (which must give the baseline's marks) and then with the other run's factors
//! switched in one at a time: a factor that changes the simulated marks is a reason, with the
//! marks and bytes it accounts for, and when the last simulation gives the other run's marks
//! exactly, every difference is explained. What is left is unexplained ([`Explanation`]).
//!
//! Besides marks: stats (peaks, segment counts, device allocations), time per step, losses
//! per step (checked against a relative tolerance), the normalised event sequences of every
//! pair of runs with traces ([`cachalot_trace::normalized`]), and the device limits
//! (alignment, buffer and binding sizes).
//!
//! - [`columns`](Column): the runs, read from their files ([`load`]);
//! - `explain`: the factors that differ and their test on the simulator;
//! - `tables`: marks, stats and timings side by side; `losses`; `events`; `limits`.

mod columns;
mod events;
mod explain;
mod limits;
mod losses;
mod tables;

use std::future::Future;

use cachalot_trace::normalized::EventDiff;

pub use columns::{Column, Factors, MarkValue, from_expected_json, from_snapshot, load};
pub use events::{EventComparisons, EventPair, Reproduction};
pub use explain::{
    Explanation, FactorDifference, FactorKind, FactorTest, FailedRerun, MarkShift, Simulated, TestedFactor, simulate,
};
pub use limits::DeviceLimits;
pub use losses::{LossCell, LossComparison, LossVerdict};
pub use tables::{MarkRow, StatRow, TimingRow};

/// Options of [`compare_runs`].
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

/// How one run's marks differ from the baseline's, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct RunDifference {
    /// The run (index into [`Comparison::columns`]; never 0, the baseline).
    pub column: usize,
    /// Labels whose values differ, with labels only one of the two has.
    pub marks: Vec<String>,
    /// The reasons found, and what stays unexplained.
    pub explanation: Explanation,
}

/// The counts the verdict is made of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Mark differences no reason accounts for.
    pub unexplained: usize,
    /// Runs (indices into [`Comparison::columns`]) whose stats at the end or allocator events
    /// differ from the baseline's while no reason accounts for them: their events were not
    /// both reproduced by the simulator with the runs' own factors, and their marks were not
    /// explained factor by factor (a PyTorch pickle, say, names no experiment to rerun).
    pub unexplained_runs: Vec<usize>,
    /// Loss steps over the tolerance.
    pub loss_failures: usize,
    /// Runs that stopped with an error, plus runs with failed checks.
    pub failed_runs: usize,
}

impl Verdict {
    /// Whether nothing is unexplained, losses agree and every run finished with its checks.
    pub fn ok(&self) -> bool {
        self.unexplained == 0 && self.unexplained_runs.is_empty() && self.loss_failures == 0 && self.failed_runs == 0
    }
}

/// Whether run `column`'s differences beyond its marks (stats at the end, allocator events) from
/// the baseline's are unexplained: they differ, and neither a reason for the events (the same
/// decisions with free completions moved, or both runs reproduced by the simulator with their
/// own factors) nor a verified explanation of every mark accounts for them.
fn differs_without_reason(
    column: usize,
    stats: &[StatRow],
    events: Option<&EventComparisons>,
    differences: &[RunDifference],
) -> bool {
    let stats_differ = stats
        .iter()
        .any(|row| matches!((row.values.first(), row.values.get(column)), (Some(Some(a)), Some(Some(b))) if a != b));
    let pair = events.and_then(|e| e.pairs.iter().find(|p| p.first == 0 && p.second == column));
    let events_accounted = pair.map(|p| match p.diff {
        EventDiff::Identical { .. } | EventDiff::FreeCompletionOnly { .. } => true,
        EventDiff::Differ { .. } => p.both_reproduced,
    });
    let marks_verified = differences
        .iter()
        .find(|d| d.column == column)
        .is_some_and(|d| matches!(&d.explanation, Explanation::Tested(test) if test.unexplained.is_empty()));
    match events_accounted {
        Some(false) => true,
        Some(true) => false,
        None => stats_differ && !marks_verified,
    }
}

/// Runs side by side (see the module docs). Every per-run vector is in the order of
/// [`columns`](Self::columns); the first run is the baseline.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// The runs.
    pub columns: Vec<Column>,
    /// Every mark of any run, in order of first appearance.
    pub marks: Vec<MarkRow>,
    /// The runs whose marks differ from the baseline's, with the reasons.
    pub differences: Vec<RunDifference>,
    /// `memory_stats()` at the end; empty when no run has stats.
    pub stats: Vec<StatRow>,
    /// Named durations, in order of first appearance.
    pub timings: Vec<TimingRow>,
    /// Losses per step, when at least two runs computed.
    pub losses: Option<LossComparison>,
    /// Normalised event sequences, when a run has a trace.
    pub events: Option<EventComparisons>,
    /// Device limits of the runs that know their device.
    pub limits: Vec<DeviceLimits>,
    /// The counts of the verdict.
    pub verdict: Verdict,
}

impl Comparison {
    /// Each run's seconds summed over [`timings`](Self::timings); `None` for a run without any.
    pub fn total_seconds(&self) -> Vec<Option<f64>> {
        tables::total_seconds(&self.timings, self.columns.len())
    }
}

/// Compares runs: the first is the baseline (see the module docs). With
/// [`CompareOptions::verify`], experiments are rerun on the simulator, which takes a moment
/// for large ones; [`compare_runs_paced`] is the same comparison with a pause before each
/// rerun, for a caller that must not be held up that long (the browser's page, which cannot
/// block: this one exists natively only).
#[cfg(not(target_arch = "wasm32"))]
pub fn compare_runs(columns: Vec<Column>, options: CompareOptions) -> Comparison {
    pollster::block_on(compare_runs_paced(columns, options, |_| std::future::ready(())))
}

/// [`compare_runs`], awaiting `pause(what)` before each rerun on the simulator (`what` says
/// which, e.g. "seeds with B's allocator settings"). A page passes a pause that lets a frame be
/// drawn, so the reruns run as tasks between frames and can be stopped by dropping the future;
/// the comparison is the same.
pub async fn compare_runs_paced<P, F>(columns: Vec<Column>, options: CompareOptions, mut pause: P) -> Comparison
where
    P: FnMut(String) -> F,
    F: Future<Output = ()>,
{
    let mut differences = Vec::new();
    if let Some((base, others)) = columns.split_first() {
        for (i, other) in others.iter().enumerate() {
            let marks = explain::mark_differences(&base.marks, &other.marks);
            if marks.is_empty() {
                continue;
            }
            let explanation = explain::explain(base, other, options.verify, &mut pause).await;
            differences.push(RunDifference { column: i + 1, marks, explanation });
        }
    }
    let losses = losses::compare_losses(&columns, options.loss_tolerance);
    let events = events::compare_events(&columns, options.verify, &mut pause).await;
    let stats = tables::stat_rows(&columns);
    let verdict = Verdict {
        unexplained: differences.iter().map(|d: &RunDifference| d.explanation.unexplained().len()).sum(),
        unexplained_runs: (1..columns.len())
            .filter(|&i| differs_without_reason(i, &stats, events.as_ref(), &differences))
            .collect(),
        loss_failures: losses.as_ref().map_or(0, |l| l.failures),
        failed_runs: columns
            .iter()
            .map(|c| usize::from(c.error.is_some()) + usize::from(c.failed_checks().next().is_some()))
            .sum(),
    };
    Comparison {
        marks: tables::mark_rows(&columns),
        differences,
        stats,
        timings: tables::timing_rows(&columns),
        losses,
        events,
        limits: limits::device_limits(&columns),
        verdict,
        columns,
    }
}
