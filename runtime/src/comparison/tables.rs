//! The side-by-side tables: marks, stats at the end and timings, one value per run.

use std::collections::HashMap;

use cachalot_core::MemoryStats;

use super::columns::{Column, MarkValue};

/// One mark across the runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkRow {
    /// The label.
    pub label: String,
    /// Each run's value (`None`: the run has no such mark).
    pub values: Vec<Option<MarkValue>>,
}

impl MarkRow {
    /// Whether run `column` has this mark and its value differs from the baseline's (the first
    /// run's).
    pub fn differs(&self, column: usize) -> bool {
        column > 0 && self.values.get(column).is_some_and(|v| v.is_some() && Some(v) != self.values.first())
    }
}

/// The marks of every run, labels in order of first appearance.
pub(super) fn mark_rows(columns: &[Column]) -> Vec<MarkRow> {
    let labels = first_appearances(columns, |c| c.marks.iter().map(|m| m.label.as_str()).collect());
    labels
        .into_iter()
        .map(|(label, at)| MarkRow {
            label: label.to_owned(),
            values: columns.iter().zip(&at).map(|(c, i)| i.map(|i| c.marks[i].clone())).collect(),
        })
        .collect()
}

/// The labels of every run, each once, in order of first appearance (a run may lack some),
/// each with the index of its first appearance in each run. Hashed, so that a run of many
/// thousands of marks costs time in proportion to them, not to their square.
fn first_appearances<'a>(
    columns: &'a [Column],
    labels_of: impl Fn(&'a Column) -> Vec<&'a str>,
) -> Vec<(&'a str, Vec<Option<usize>>)> {
    let mut rows: Vec<(&str, Vec<Option<usize>>)> = Vec::new();
    let mut row_of: HashMap<&str, usize> = HashMap::new();
    for (column, labels) in columns.iter().map(labels_of).enumerate() {
        for (index, label) in labels.into_iter().enumerate() {
            let row = *row_of.entry(label).or_insert_with(|| {
                rows.push((label, vec![None; columns.len()]));
                rows.len() - 1
            });
            rows[row].1[column].get_or_insert(index);
        }
    }
    rows
}

/// One number of `memory_stats()` at the end, across the runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatRow {
    /// What it counts.
    pub name: &'static str,
    /// Each run's value (`None`: the run has no stats).
    pub values: Vec<Option<i64>>,
}

impl StatRow {
    /// Whether run `column`'s value differs from the baseline's (the first run's).
    pub fn differs(&self, column: usize) -> bool {
        column > 0 && self.values.get(column) != self.values.first()
    }
}

/// Reads one number of the stats.
type StatOf = fn(&MemoryStats) -> i64;

/// The stats rows; none when no run has stats.
pub(super) fn stat_rows(columns: &[Column]) -> Vec<StatRow> {
    let rows: [(&str, StatOf); 8] = [
        ("peak allocated", |s| s.allocated_bytes.all().peak),
        ("peak reserved", |s| s.reserved_bytes.all().peak),
        ("segments at end", |s| s.segment.all().current),
        ("peak segments", |s| s.segment.all().peak),
        ("device allocations", |s| s.num_device_alloc as i64),
        ("allocations", |s| s.allocation.all().allocated),
        ("alloc retries", |s| s.num_alloc_retries as i64),
        ("OOMs", |s| s.num_ooms as i64),
    ];
    if columns.iter().all(|c| c.stats.is_none()) {
        return Vec::new();
    }
    let row = |(name, get): (&'static str, StatOf)| StatRow {
        name,
        values: columns.iter().map(|c| c.stats.as_ref().map(get)).collect(),
    };
    rows.into_iter().map(row).collect()
}

/// One named duration across the runs.
#[derive(Clone, Debug, PartialEq)]
pub struct TimingRow {
    /// The label (`step 0`).
    pub label: String,
    /// Each run's seconds (`None`: the run did not time it).
    pub seconds: Vec<Option<f64>>,
}

impl TimingRow {
    /// The seconds of the first run that has this duration: ratios are to it.
    pub fn baseline(&self) -> Option<f64> {
        self.seconds.iter().find_map(|s| *s)
    }
}

/// The timing rows, labels in order of first appearance.
pub(super) fn timing_rows(columns: &[Column]) -> Vec<TimingRow> {
    let labels = first_appearances(columns, |c| c.timings.iter().map(|t| t.label.as_str()).collect());
    labels
        .into_iter()
        .map(|(label, at)| TimingRow {
            label: label.to_owned(),
            seconds: columns.iter().zip(&at).map(|(c, i)| i.map(|i| c.timings[i].seconds)).collect(),
        })
        .collect()
}

/// Each run's seconds summed over the rows; `None` for a run that timed nothing.
pub(super) fn total_seconds(rows: &[TimingRow], columns: usize) -> Vec<Option<f64>> {
    let mut totals = vec![None; columns];
    for row in rows {
        for (total, s) in totals.iter_mut().zip(&row.seconds) {
            if let Some(s) = s {
                *total = Some(total.unwrap_or(0.0) + s);
            }
        }
    }
    totals
}
