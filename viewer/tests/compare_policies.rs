//! One PyTorch trace under PyTorch's policy and under cachalot's own (`policy:cachalot`) side by
//! side: "Replay under policy:cachalot" replays the trace off the UI path and opens the replay
//! beside it in Compare, whose line of peaks shows both peaks reserved and their ratio — the
//! figures of `cachalot_trace::replay` under each policy, computed here independently.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::PathBuf;

use cachalot_trace::replay::{ExpectedRun, ReplayOptions, replay};
use cachalot_trace::snapshot::pickle::read_snapshot;
use cachalot_trace::tune::own_policy_settings;
use cachalot_viewer::model::Verification;
use cachalot_viewer::native::harness;
use cachalot_viewer::side_by_side::Peaks;
use cachalot_viewer::{View, ViewerApp};
use egui_kittest::kittest::Queryable;

fn trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../testdata/traces/pytorch-2.11-h200/{name}.pickle"))
}

/// `(max_memory_reserved, max_memory_allocated)` of the trace replayed under its own settings
/// with `policy:cachalot` added, or as recorded.
fn replayed_peaks(name: &str, own_policy: bool) -> (u64, u64) {
    let path = trace(name);
    let snapshot = read_snapshot(&std::fs::read(&path).unwrap()).unwrap();
    let expected = ExpectedRun::beside(&path).unwrap();
    let mut options = ReplayOptions::for_snapshot(&snapshot, expected.as_ref()).unwrap();
    if own_policy {
        options.config =
            cachalot_core::AllocatorConfig::parse(&own_policy_settings(options.config.settings())).unwrap();
    }
    let stats = replay(&snapshot, &options, |_, _| {}).unwrap().allocator.stats().clone();
    (stats.max_memory_reserved(), stats.max_memory_allocated())
}

#[test]
fn a_trace_beside_its_replay_under_cachalots_policy_with_both_peaks() {
    for name in ["gpt_train", "convnet_train"] {
        let mut app = ViewerApp::new();
        app.open_path(trace(name));
        app.wait_for_loads();
        let mut harness = harness(app, egui::vec2(1300.0, 900.0), 1.0, true);
        harness.run_steps(2);
        harness.get_by_label("Replay under policy:cachalot").click();
        harness.run_steps(1);
        harness.state_mut().wait_for_loads();
        harness.run_steps(3);

        let app = harness.state_mut();
        assert_eq!(app.view, View::SideBySide, "{name}: the replay is shown in Compare");
        assert_eq!(app.tabs.len(), 2);
        let (a, b) = (app.side_by_side.a, app.side_by_side.b);
        assert_eq!((a, b), (0, 1), "{name}: the trace as A, its replay as B");
        assert_eq!(app.tabs[a].run.name, format!("{name}.pickle"));
        assert_eq!(app.tabs[b].run.name, format!("{name}.pickle · policy:cachalot"));
        // The viewer rebuilds the replay under the policy's own rules: every entry fits, and the
        // rebuilt end state is the allocator's.
        let replayed = &app.tabs[b].run;
        assert_eq!(replayed.anomaly_count, 0, "{name}: {:?}", replayed.anomalies.first());
        assert!(matches!(replayed.verification, Verification::Matches { .. }), "{name}: {:?}", replayed.verification);

        let (ta, tb) = app.tabs.split_at_mut(1);
        let peaks = Peaks::of(&mut ta[0].run, &mut tb[0].run);
        let (pytorch, cachalot) = (replayed_peaks(name, false), replayed_peaks(name, true));
        assert_eq!(peaks.reserved, (pytorch.0, cachalot.0), "{name}: peak reserved under each policy");
        assert_eq!(peaks.allocated, (pytorch.1, cachalot.1), "{name}: peak allocated under each policy");
        let ratio = peaks.reserved_ratio().unwrap();
        assert!(ratio < 1.0, "{name}: policy:cachalot reserves less at its peak ({ratio})");
        harness.get_by_label(&format!("B / A {ratio:.3}×"));
        harness.get_by_label_contains("B runs under policy:cachalot: memory_allocated() differs from PyTorch's");
    }
}

#[test]
fn a_run_that_is_not_a_pytorch_trace_cannot_be_replayed_under_the_policy() {
    let mut app = ViewerApp::new();
    app.add_runs(vec![cachalot_viewer::Run::new(
        "a live run",
        cachalot_viewer::model::RunKind::Live,
        Default::default(),
    )]);
    app.compare_policies();
    assert_eq!(app.tabs.len(), 1);
    assert!(app.notices.iter().any(|n| n.error && n.text.contains("a live run is not a PyTorch trace")));
}
