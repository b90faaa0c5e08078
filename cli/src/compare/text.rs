//! The text report of a [`Comparison`]: `cachalot compare`'s output. Runs are lettered `A`,
//! `B`, ... in the order given; the first is the baseline.

use std::fmt::Write as _;

use cachalot_core::error::group_digits as group;
use cachalot_runtime::StreamDiscipline;
use cachalot_runtime::comparison::{
    Column, Comparison, EventComparisons, Explanation, FactorTest, FailedRerun, LossCell, LossComparison, MarkShift,
    MarkValue, TestedFactor,
};
use cachalot_trace::normalized::EventDiff;

/// The report, one section after another.
pub fn render(comparison: &Comparison) -> String {
    let mut out = String::new();
    runs_section(&comparison.columns, &mut out);
    marks_section(comparison, &mut out);
    differences_section(comparison, &mut out);
    stats_section(comparison, &mut out);
    timing_section(comparison, &mut out);
    if let Some(losses) = &comparison.losses {
        loss_section(losses, &mut out);
    }
    if let Some(events) = &comparison.events {
        events_section(&comparison.columns, events, &mut out);
    }
    limits_section(comparison, &mut out);
    let _ = writeln!(out, "\nverdict: {}", verdict(comparison));
    out
}

/// What the verdict counts, in words: only differences listed above with their reasons are
/// "known".
fn verdict(comparison: &Comparison) -> String {
    let verdict = &comparison.verdict;
    if verdict.ok() {
        return "every difference has a known reason".to_owned();
    }
    let counts = [
        (verdict.unexplained, "unexplained mark difference(s)"),
        (verdict.loss_failures, "loss step(s) over tolerance"),
        (verdict.failed_runs, "run(s) stopped or failed checks"),
    ];
    let mut parts: Vec<String> = counts.iter().filter(|(n, _)| *n > 0).map(|(n, what)| format!("{n} {what}")).collect();
    for &run in &verdict.unexplained_runs {
        let why = match comparison.columns.get(run).and_then(|c| c.experiment.as_ref()) {
            None => "it names no experiment the simulator could rerun to test why",
            Some(_) => "the simulator did not reproduce both runs' events with their own factors",
        };
        parts.push(format!(
            "{}'s stats at the end or allocator events differ from {}'s with no reason found ({why})",
            letter(run),
            letter(0)
        ));
    }
    parts.join("; ")
}

/// The letter of run `i`.
fn letter(i: usize) -> char {
    (b'A' + (i % 26) as u8) as char
}

/// The name of run `i`.
fn name(columns: &[Column], i: usize) -> &str {
    columns.get(i).map_or("", |c| c.name.as_str())
}

fn runs_section(columns: &[Column], out: &mut String) {
    let _ = writeln!(out, "runs");
    for (i, c) in columns.iter().enumerate() {
        let ws = match c.factors.workspaces {
            Some(ws) => format!("workspaces {} + {} B", group(ws.cublas), group(ws.cublaslt)),
            None => "no workspaces".into(),
        };
        let streams = match c.factors.discipline {
            StreamDiscipline::DefaultStream => "default stream",
            StreamDiscipline::QueueStream => "queue stream",
        };
        let settings =
            if c.factors.settings.is_empty() { "default settings".into() } else { c.factors.settings.clone() };
        let _ = writeln!(out, "  {}  {}  {}", letter(i), c.name, c.title);
        let _ = writeln!(out, "     {streams}; {ws}; {settings}");
        if let Some(e) = &c.error {
            let _ = writeln!(out, "     STOPPED: {e}");
        }
        for k in c.failed_checks() {
            let _ = writeln!(out, "     CHECK FAILED: {}: {}", k.name, k.detail);
        }
    }
}

fn marks_section(comparison: &Comparison, out: &mut String) {
    if comparison.marks.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nmarks: memory_allocated / memory_reserved in bytes ('=': as {}; '*': differs)", letter(0));
    let width = comparison.marks.iter().map(|r| r.label.len()).max().unwrap_or(5).max(5);
    let cell = 27;
    let mut header = format!("  {:<width$}", "mark");
    for i in 0..comparison.columns.len() {
        let _ = write!(header, " {:>cell$}", letter(i));
    }
    let _ = writeln!(out, "{header}");
    for row in &comparison.marks {
        let mut line = format!("  {:<width$}", row.label);
        for (i, value) in row.values.iter().enumerate() {
            let text = match value {
                None => "—".to_owned(),
                Some(_) if i > 0 && !row.differs(i) => "=".to_owned(),
                Some(m) => {
                    let star = if i > 0 { "*" } else { "" };
                    format!("{} / {}{star}", group(m.allocated), group(m.reserved))
                }
            };
            let _ = write!(line, " {text:>cell$}");
        }
        let _ = writeln!(out, "{line}");
    }
}

/// How many marks differ, counted over the marks both runs have, and how many only one has:
/// "3 of 12 marks differ", "no marks in common (12 only in A, 6 only in B)".
fn mark_count(base: &[MarkValue], other: &[MarkValue], differing: &[String], other_column: usize) -> String {
    let in_base = |label: &str| base.iter().any(|m| m.label == label);
    let in_other = |label: &str| other.iter().any(|m| m.label == label);
    let shared = base.iter().filter(|m| in_other(&m.label)).count();
    let differ = differing.iter().filter(|label| in_base(label) && in_other(label)).count();
    let only_base = base.len() - shared;
    let only_other = other.len() - shared;
    let mut text = match shared {
        0 => "no marks in common".to_owned(),
        _ => format!("{differ} of {shared} marks differ"),
    };
    if only_base + only_other > 0 {
        let mut parts = Vec::new();
        if only_base > 0 {
            parts.push(format!("{only_base} only in {}", letter(0)));
        }
        if only_other > 0 {
            parts.push(format!("{only_other} only in {}", letter(other_column)));
        }
        text.push_str(&format!(" ({})", parts.join(", ")));
    }
    text
}

fn differences_section(comparison: &Comparison, out: &mut String) {
    let columns = &comparison.columns;
    let Some(base) = columns.first() else { return };
    if !comparison.differences.is_empty() {
        let _ = writeln!(out, "\ndifferences");
    }
    for difference in &comparison.differences {
        let other = difference.column;
        let other_marks = columns.get(other).map_or(&[][..], |c| c.marks.as_slice());
        let _ = writeln!(
            out,
            "  {} vs {}: {}",
            letter(other),
            letter(0),
            mark_count(&base.marks, other_marks, &difference.marks, other)
        );
        match &difference.explanation {
            Explanation::DifferentExperiments { base, other } => {
                let _ = writeln!(out, "    reason: different experiments or parameters ({base} vs {other})");
            }
            Explanation::Tested(test) => tested(test, &base.name, name(columns, other), out),
            Explanation::Untested { failed_rerun, factors, unexplained } => {
                match failed_rerun {
                    Some(FailedRerun::Baseline { experiment, error }) => {
                        let _ = writeln!(out, "    cannot rerun {experiment} on the simulator: {error}");
                    }
                    Some(FailedRerun::BaselineNotReproduced { marks }) => {
                        let _ = writeln!(
                            out,
                            "    the simulator with {}'s factors does not reproduce its marks (at {}): reasons \
                             cannot be verified",
                            base.name,
                            marks.join(", ")
                        );
                    }
                    Some(FailedRerun::Factor { tested, kind, error }) => {
                        tested.iter().for_each(|factor| tested_factor(factor, out));
                        let _ = writeln!(out, "    cannot rerun with {}: {error}", kind.name());
                    }
                    None => {}
                }
                // Not verifiable: name the factors that differ as possible causes.
                if factors.is_empty() {
                    let _ = writeln!(
                        out,
                        "    no factor known to cachalot differs: unexplained at {}",
                        unexplained.join(", ")
                    );
                } else {
                    for f in factors {
                        let _ =
                            writeln!(out, "    possible reason (not verified): {}: {}", f.kind.name(), f.description);
                    }
                    let _ = writeln!(out, "    unexplained (no experiment to rerun): {}", unexplained.join(", "));
                }
            }
        }
    }
}

/// The factors switched in on the simulator, and what is left.
fn tested(test: &FactorTest, base: &str, other: &str, out: &mut String) {
    test.factors.iter().for_each(|factor| tested_factor(factor, out));
    if test.unexplained.is_empty() {
        let _ = writeln!(
            out,
            "    verified: the simulator running {} with {base}'s factors switched to {other}'s gives {other}'s marks \
             exactly",
            test.experiment
        );
    } else {
        let _ = writeln!(out, "    unexplained: the simulator with {other}'s factors differs from it at:");
        shifts(&test.remaining, out);
        if !test.only_one_has.is_empty() {
            let _ = writeln!(out, "      marks only one has: {:?}", test.only_one_has);
        }
    }
}

fn tested_factor(tested: &TestedFactor, out: &mut String) {
    let (name, description) = (tested.factor.kind.name(), &tested.factor.description);
    if !tested.is_reason() {
        let _ = writeln!(out, "    differs, no effect on the marks: {name}: {description}");
        return;
    }
    let _ = writeln!(out, "    reason: {name}: {description}");
    shifts(&tested.shifts, out);
    if let Some(e) = &tested.simulation_error {
        let _ = writeln!(out, "      the simulated run stops: {e}");
    }
}

fn shifts(shifts: &[MarkShift], out: &mut String) {
    for shift in shifts {
        let at = match &shift.labels[..] {
            [one] => one.clone(),
            [first, .., last] => format!("{first} .. {last} ({} marks)", shift.labels.len()),
            [] => String::new(),
        };
        let _ = writeln!(out, "      {at}: allocated {}, reserved {}", signed(shift.allocated), signed(shift.reserved));
    }
}

/// A change in bytes with its sign (`+1,024 B`, `−512 B`).
fn signed(n: i128) -> String {
    let sign = if n < 0 { "−" } else { "+" };
    format!("{sign}{} B", group(n.unsigned_abs() as u64))
}

fn stats_section(comparison: &Comparison, out: &mut String) {
    if comparison.stats.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nstats at the end ('*': differs from A)");
    for stat in &comparison.stats {
        let mut row = format!("  {:<22}", stat.name);
        for (i, value) in stat.values.iter().enumerate() {
            let text = match value {
                None => "—".to_owned(),
                Some(v) => group((*v).max(0) as u64),
            };
            let star = if stat.differs(i) { "*" } else { "" };
            let _ = write!(row, " {:>20}", format!("{text}{star}"));
        }
        let _ = writeln!(out, "{row}");
    }
}

fn timing_section(comparison: &Comparison, out: &mut String) {
    if comparison.timings.is_empty() {
        return;
    }
    let _ = writeln!(out, "\ntime (seconds; ratio to the first run that has it)");
    for timing in &comparison.timings {
        let base = timing.baseline();
        let mut row = format!("  {:<22}", timing.label);
        for seconds in &timing.seconds {
            let text = match (seconds, base) {
                (Some(s), Some(b)) if b > 0.0 => format!("{s:.4} ({:.2}x)", s / b),
                (Some(s), _) => format!("{s:.4}"),
                (None, _) => "—".into(),
            };
            let _ = write!(row, " {text:>20}");
        }
        let _ = writeln!(out, "{row}");
    }
    let mut row = format!("  {:<22}", "total");
    for t in comparison.total_seconds() {
        let text = t.map_or_else(|| "—".to_owned(), |t| format!("{t:.4}"));
        let _ = write!(row, " {text:>20}");
    }
    let _ = writeln!(out, "{row}");
}

fn loss_section(losses: &LossComparison, out: &mut String) {
    let base = letter(losses.baseline());
    let _ = writeln!(out, "\nloss per step (relative difference to {base}, tolerance {:.0e})", losses.tolerance);
    let mut header = format!("  {:<10}", "step");
    for &i in &losses.columns {
        let _ = write!(header, " {:>24}", letter(i));
    }
    let _ = writeln!(out, "{header}");
    for (s, cells) in losses.steps.iter().enumerate() {
        let mut row = format!("  {s:<10}");
        for cell in cells {
            let text = match *cell {
                LossCell::Compared { value, relative, over_tolerance } => {
                    format!("{value:.6} ({relative:.1e}){}", if over_tolerance { " !" } else { "" })
                }
                LossCell::Value(value) => format!("{value:.6}"),
                LossCell::Missing => "—".into(),
            };
            let _ = write!(row, " {text:>24}");
        }
        let _ = writeln!(out, "{row}");
    }
    for v in &losses.verdicts {
        let verdict = if v.agrees { "agree" } else { "DISAGREE" };
        let _ = writeln!(
            out,
            "  {} vs {base}: largest relative difference {:.2e}: {verdict}",
            letter(v.column),
            v.largest_relative
        );
    }
}

fn events_section(columns: &[Column], events: &EventComparisons, out: &mut String) {
    let _ = writeln!(out, "\nallocator events (addresses as segment index + offset)");
    for r in &events.reproductions {
        let line = match &r.outcome {
            Ok(EventDiff::Identical { entries }) => {
                format!("the same {entries} events as the simulator running {} with its factors", r.experiment)
            }
            Ok(other) => format!("differs from the simulator with its factors: {other}"),
            Err(e) => format!("cannot rerun on the simulator: {e}"),
        };
        let _ = writeln!(out, "  {}: {line}", letter(r.column));
    }
    for pair in &events.pairs {
        let line = match &pair.diff {
            EventDiff::Identical { entries } => format!("identical ({entries} events)"),
            EventDiff::FreeCompletionOnly { entries, moved } => {
                let why = match pair.queue_stream_run {
                    Some(q) => format!(
                        "{} records kernel operands on its queue stream (record_stream), so a freed block \
                         returns to the cache at the next allocator call after its submission",
                        name(columns, q)
                    ),
                    None => "free completions moved".into(),
                };
                format!("the same {entries} decisions; {moved} free_completed at another point: {why}")
            }
            differ @ EventDiff::Differ { .. } => {
                let mut line = differ.to_string();
                if pair.both_reproduced {
                    line.push_str(
                        "; both are the simulator's events with their own factors, so the factors that differ \
                         (above) account for it",
                    );
                }
                line
            }
        };
        let _ = writeln!(out, "  {} vs {}: {line}", letter(pair.second), letter(pair.first));
    }
}

fn limits_section(comparison: &Comparison, out: &mut String) {
    if comparison.limits.is_empty() {
        return;
    }
    let _ = writeln!(out, "\ndevice limits");
    for limits in &comparison.limits {
        let mut parts = vec![format!("blocks {}-byte aligned", limits.alignment)];
        if let Some(align) = &limits.storage_offset_alignment {
            parts.push(format!(
                "storage offsets must be multiples of {align} (min_storage_buffer_offset_alignment), which {} \
                 satisfies: alignment changes nothing",
                limits.alignment
            ));
        }
        if let Some(max) = limits.max_segment_size {
            let fits = if limits.largest_segment_fits() { "fits" } else { "DOES NOT FIT" };
            parts.push(format!(
                "segments up to {} B (max_buffer_size); largest in this run {} B: {fits}",
                group(max),
                group(limits.largest_segment)
            ));
        }
        if let Some(max) = limits.max_binding_size {
            parts.push(format!("kernel bindings up to {} B (max_storage_buffer_binding_size)", group(max)));
        }
        let _ = writeln!(out, "  {}: {}", letter(limits.column), parts.join("; "));
        for note in comparison.columns.get(limits.column).map_or(&[][..], |c| &c.notes[..]) {
            let _ = writeln!(out, "     note: {note}");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test")]

    use cachalot_runtime::StreamDiscipline;
    use cachalot_runtime::comparison::{CompareOptions, Factors, MarkValue, compare_runs};

    use super::*;

    fn column(name: &str, losses: Vec<f32>) -> Column {
        Column {
            name: name.into(),
            title: format!("test: {name}"),
            marks: vec![MarkValue { label: "step0".into(), allocated: 1 << 20, reserved: 2 << 20 }],
            stats: None,
            timings: Vec::new(),
            losses,
            checks: Vec::new(),
            notes: Vec::new(),
            error: None,
            trace: None,
            factors: Factors {
                workspaces: None,
                settings: String::new(),
                discipline: StreamDiscipline::DefaultStream,
                capacity: 1 << 30,
                max_segment_size: None,
            },
            workspace_source: "none".into(),
            experiment: None,
            facts: None,
        }
    }

    #[test]
    fn signs_byte_changes() {
        assert_eq!(signed(-34_603_008), "−34,603,008 B");
        assert_eq!(signed(0), "+0 B");
    }

    #[test]
    fn losses_and_unverifiable_differences_render_as_before() {
        let mut other = column("b", vec![2.0, 1.01, 0.5]);
        other.marks[0].reserved += 512;
        other.factors.settings = "expandable_segments:True".into();
        let columns = vec![column("a", vec![2.0, 1.0]), other];
        let comparison = compare_runs(columns, CompareOptions::default());
        let text = render(&comparison);
        let expected = "\
differences
  B vs A: 1 of 1 marks differ
    possible reason (not verified): allocator settings: settings '' vs 'expandable_segments:True'
    unexplained (no experiment to rerun): step0

loss per step (relative difference to A, tolerance 1e-3)
  step                              A                        B
  0                          2.000000         2.000000 (0.0e0)
  1                          1.000000      1.010000 (1.0e-2) !
  2                                 —                 0.500000
  B vs A: largest relative difference 1.00e-2: DISAGREE

verdict: 1 unexplained mark difference(s); 1 loss step(s) over tolerance
";
        assert!(text.ends_with(expected), "{text}");
    }
}
