//! The allocator event sequences of the runs with traces, normalised (addresses as segment
//! index + offset): each against the simulator running its experiment with its own factors, and
//! every pair against each other.

use std::future::Future;

use cachalot_core::TraceEntry;
use cachalot_trace::normalized::{EventDiff, first_difference};

use super::columns::Column;
use super::explain::simulate;
use crate::device::StreamDiscipline;

/// A run's events against the simulator's with the run's factors.
#[derive(Clone, Debug, PartialEq)]
pub struct Reproduction {
    /// The run (index into the compared runs).
    pub column: usize,
    /// The experiment rerun.
    pub experiment: String,
    /// Where the run's events and the simulator's part; `Err`: the simulator could not run it.
    pub outcome: Result<EventDiff, String>,
}

impl Reproduction {
    /// Whether the simulator gave the run's events exactly.
    pub fn reproduced(&self) -> bool {
        matches!(self.outcome, Ok(EventDiff::Identical { .. }))
    }
}

/// Two runs' events against each other.
#[derive(Clone, Debug, PartialEq)]
pub struct EventPair {
    /// The earlier run (index into the compared runs).
    pub first: usize,
    /// The later run.
    pub second: usize,
    /// Where their events part.
    pub diff: EventDiff,
    /// Of the two, the first that records operands on a queue stream: why free completions
    /// move.
    pub queue_stream_run: Option<usize>,
    /// Whether the simulator reproduced both runs' events with their own factors, so the
    /// factors that differ account for a difference.
    pub both_reproduced: bool,
}

/// The event comparisons of the runs with traces.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventComparisons {
    /// Each traced run of a known experiment against the simulator (when verifying).
    pub reproductions: Vec<Reproduction>,
    /// Every pair of traced runs.
    pub pairs: Vec<EventPair>,
}

/// Compares the event sequences; `None` when no run has a trace. `pause` is awaited before
/// each rerun on the simulator.
pub(super) async fn compare_events<P, F>(columns: &[Column], verify: bool, pause: &mut P) -> Option<EventComparisons>
where
    P: FnMut(String) -> F,
    F: Future<Output = ()>,
{
    let traced: Vec<(usize, &Column, &Vec<TraceEntry>)> =
        columns.iter().enumerate().filter_map(|(i, c)| c.trace.as_ref().map(|t| (i, c, t))).collect();
    if traced.is_empty() {
        return None;
    }
    let mut reproductions = Vec::new();
    for &(i, c, t) in &traced {
        let Some(experiment) = c.experiment.as_ref().filter(|_| verify) else { continue };
        pause(format!("{} with {}'s factors, for its allocator events", experiment.name(), c.name)).await;
        let outcome =
            simulate(experiment, &c.factors).map(|sim| first_difference(t, &sim.trace)).map_err(|e| e.to_string());
        reproductions.push(Reproduction { column: i, experiment: experiment.name().to_owned(), outcome });
    }
    let reproduced = |i: usize| reproductions.iter().any(|r| r.column == i && r.reproduced());
    let mut pairs = Vec::new();
    for (x, &(i, a, ta)) in traced.iter().enumerate() {
        for &(j, b, tb) in &traced[x + 1..] {
            let queue_stream_run =
                [(i, a), (j, b)].into_iter().find(|(_, c)| c.factors.discipline == StreamDiscipline::QueueStream);
            pairs.push(EventPair {
                first: i,
                second: j,
                diff: first_difference(ta, tb),
                queue_stream_run: queue_stream_run.map(|(k, _)| k),
                both_reproduced: reproduced(i) && reproduced(j),
            });
        }
    }
    Some(EventComparisons { reproductions, pairs })
}
