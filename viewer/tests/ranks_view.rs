//! The Ranks tab on two ranks of one job, made from the reference trace `gpt_train` (no
//! multi-GPU machine here): rank 0 is the recording, rank 1 the same recording with one 2 MiB
//! tensor more, allocated early in one step and freed just before the end of the next (a new
//! segment of its own, so the rest of the trace stays valid), written back as a PyTorch pickle.
//! Both ranks are cut into the same steps, and the tab names exactly those two steps as where
//! they differ, by the measures the tensor moves (`tests/snapshots/ranks_gpt_train.png`).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::PathBuf;

use cachalot_core::{StreamId, TraceAction, TraceEntry};
use cachalot_trace::snapshot::pickle::{read_snapshot, write_snapshot};
use cachalot_viewer::native::harness;
use cachalot_viewer::ranks::{Measure, RankSteps, StepSource, differences};
use cachalot_viewer::{View, ViewerApp};
use egui_kittest::kittest::Queryable;

const EXTRA: u64 = 2 << 20;
/// The step (0-based) whose start allocates the extra tensor; the next step frees it.
const STEP: usize = 3;

fn recording() -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/traces/pytorch-2.11-h200/gpt_train.pickle");
    std::fs::read(path).unwrap()
}

/// `gpt_train` with a 2 MiB tensor live from just after the start of step [`STEP`] to just
/// before the end of the next, in a segment of its own.
fn perturbed(rank0: &RankSteps) -> Vec<u8> {
    let mut snapshot = read_snapshot(&recording()).unwrap();
    let trace = &mut snapshot.device_traces[0];
    // Cursor positions: the step's range starts after `start` entries.
    let start = *rank0.steps.range(STEP).start();
    let next_end = *rank0.steps.range(STEP + 1).end();
    let entry = |action, at: &TraceEntry| TraceEntry {
        action,
        addr: 0x7fff_0000_0000,
        size: EXTRA,
        stream: StreamId::DEFAULT,
        time_us: at.time_us,
        context: None,
        annotation: None,
    };
    // Freed before the entry that brings the next step back to its low.
    let free_at = next_end - 1;
    let frees = [TraceAction::FreeRequested, TraceAction::FreeCompleted, TraceAction::SegmentFree]
        .map(|a| entry(a, &trace[free_at]));
    trace.splice(free_at..free_at, frees);
    let alloc_at = start + 1;
    let allocs = [TraceAction::SegmentAlloc, TraceAction::Alloc].map(|a| entry(a, &trace[alloc_at]));
    trace.splice(alloc_at..alloc_at, allocs);
    write_snapshot(&snapshot).unwrap()
}

fn opened(ranks: [(&str, Vec<u8>); 2]) -> ViewerApp {
    let mut app = ViewerApp::new();
    for (name, bytes) in ranks {
        app.open_bytes(name, bytes);
    }
    app.wait_for_loads();
    assert_eq!(app.tabs.len(), 2, "{:?}", app.notices.iter().map(|n| &n.text).collect::<Vec<_>>());
    app
}

#[test]
fn two_ranks_are_aligned_by_step_and_the_steps_where_they_differ_are_named() {
    let app = opened([("rank0.pickle", recording()), ("rank1.pickle", recording())]);
    let rank0 = RankSteps::of(&app.tabs[0].run);
    // gpt_train's eight training steps end where allocated memory falls back to the weights and
    // optimizer state (its expected.json's marks read about 415 MB at each step's end), and its
    // clean-up follows.
    let StepSource::RecurringLow { level } = rank0.steps.source else { panic!("{:?}", rank0.steps) };
    assert!((400_000_000..430_000_000).contains(&level), "{level}");
    assert_eq!((rank0.steps.steps(), rank0.steps.len()), (8, 9), "{:?}", rank0.steps);
    assert_eq!(rank0.steps.names[8], "after step 8");

    let app = opened([("rank0.pickle", recording()), ("rank1.pickle", perturbed(&rank0))]);
    let ranks: Vec<RankSteps> = app.tabs.iter().map(|t| RankSteps::of(&t.run)).collect();
    assert_eq!(ranks[1].steps.len(), ranks[0].steps.len(), "the extra tensor moves no step boundary");
    let (found, counts) = differences(&ranks);
    assert!(counts.is_empty());
    let at = |step: usize| -> Vec<Measure> { found.iter().filter(|d| d.step == step).map(|d| d.measure).collect() };
    assert_eq!(at(STEP), [Measure::PeakAllocated, Measure::PeakReserved, Measure::AllocatedAtEnd]);
    assert_eq!(at(STEP + 1), [Measure::PeakAllocated, Measure::PeakReserved]);
    assert!(found.iter().all(|d| d.step == STEP || d.step == STEP + 1), "{found:?}");
    assert!(found.iter().all(|d| d.values.1 == d.values.0 + EXTRA), "{found:?}");

    let mut app = app;
    app.view = View::Ranks;
    let mut harness = harness(app, egui::vec2(1300.0, 900.0), 1.0, true);
    harness.run_steps(3);
    harness.get_by_label_contains(&format!(
        "the ranks differ at 2 of {} ranges; first at step {}: peak allocated",
        ranks[0].steps.len(),
        STEP + 1
    ));
    // The table of the measure picked: the differing cells carry their difference (and so does
    // the line above, once).
    harness.get_by_label("allocated at the step's end").click();
    harness.run_steps(2);
    assert_eq!(harness.query_all_by_label_contains("(+2.0 MiB)").count(), 1 + 1);
    harness.get_by_label("peak allocated").click();
    harness.run_steps(2);
    assert_eq!(harness.query_all_by_label_contains("(+2.0 MiB)").count(), 1 + 2);
    // The picture (`docs/viewer-ranks.png` is this one).
    harness.snapshot("ranks_gpt_train");
}

#[test]
fn identical_ranks_are_said_to_agree() {
    let app = opened([("rank0.pickle", recording()), ("rank1.pickle", recording())]);
    let mut app = app;
    app.view = View::Ranks;
    let mut harness = harness(app, egui::vec2(1300.0, 900.0), 1.0, true);
    harness.run_steps(3);
    harness.get_by_label_contains("every step's peak allocated, peak reserved and allocated at its end are equal");
    // A rank left out leaves one: nothing to align.
    harness.get_by_role_and_label(egui::accesskit::Role::CheckBox, "rank1.pickle").click();
    harness.run_steps(2);
    harness.get_by_label_contains("Open the ranks of one job");
}
