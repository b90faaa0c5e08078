//! Losses per step of the runs that computed, against the first of them, within a relative
//! tolerance.

use super::columns::Column;

/// One run's loss at one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LossCell {
    /// The loss, with nothing to compare it to (the baseline's, or a step the baseline lacks).
    Value(f32),
    /// The loss and its relative difference to the baseline's.
    Compared {
        /// The loss.
        value: f32,
        /// `|value − baseline| / |baseline|` (NaN when either is NaN).
        relative: f64,
        /// Over the tolerance, or NaN.
        over_tolerance: bool,
    },
    /// The run has no loss at this step.
    Missing,
}

/// One run's agreement with the baseline over all steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossVerdict {
    /// The run (index into the compared runs).
    pub column: usize,
    /// The largest relative difference of a step both have (infinite for NaN).
    pub largest_relative: f64,
    /// Whether that is within the tolerance.
    pub agrees: bool,
}

/// The losses of the runs that have them, step by step.
#[derive(Clone, Debug, PartialEq)]
pub struct LossComparison {
    /// Largest relative difference accepted.
    pub tolerance: f64,
    /// The runs with losses (indices into the compared runs); the first is the baseline.
    pub columns: Vec<usize>,
    /// Per step, one cell per run of [`columns`](Self::columns).
    pub steps: Vec<Vec<LossCell>>,
    /// Per run of [`columns`](Self::columns) after the baseline.
    pub verdicts: Vec<LossVerdict>,
    /// Steps over the tolerance, NaN, or missing in a run other than the baseline.
    pub failures: usize,
}

impl LossComparison {
    /// The baseline run (index into the compared runs).
    pub fn baseline(&self) -> usize {
        self.columns.first().copied().unwrap_or(0)
    }
}

/// Compares the losses; `None` when fewer than two runs have any.
pub(super) fn compare_losses(columns: &[Column], tolerance: f64) -> Option<LossComparison> {
    let with: Vec<(usize, &Column)> = columns.iter().enumerate().filter(|(_, c)| !c.losses.is_empty()).collect();
    let &(base_index, base) = with.first()?;
    if with.len() < 2 {
        return None;
    }
    let step_count = with.iter().map(|(_, c)| c.losses.len()).max().unwrap_or(0);
    let mut failures = 0;
    let mut worst = vec![0.0f64; columns.len()];
    let mut steps = Vec::with_capacity(step_count);
    for s in 0..step_count {
        let b = base.losses.get(s).copied();
        let mut cells = Vec::with_capacity(with.len());
        for &(i, c) in &with {
            let cell = match (c.losses.get(s).copied(), b) {
                (Some(value), Some(b)) if i != base_index => {
                    let relative = (value as f64 - b as f64).abs() / (b as f64).abs().max(1e-12);
                    // NaN counts as a failure.
                    let over_tolerance = relative.is_nan() || relative > tolerance;
                    failures += usize::from(over_tolerance);
                    worst[i] = worst[i].max(if relative.is_nan() { f64::INFINITY } else { relative });
                    LossCell::Compared { value, relative, over_tolerance }
                }
                (Some(value), _) => LossCell::Value(value),
                (None, _) => {
                    failures += usize::from(i != base_index);
                    LossCell::Missing
                }
            };
            cells.push(cell);
        }
        steps.push(cells);
    }
    let verdicts = with
        .iter()
        .skip(1)
        .map(|&(i, _)| LossVerdict { column: i, largest_relative: worst[i], agrees: worst[i] <= tolerance })
        .collect();
    Some(LossComparison { tolerance, columns: with.iter().map(|&(i, _)| i).collect(), steps, verdicts, failures })
}
