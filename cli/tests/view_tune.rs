//! The viewer's Tune tab against the command line: clicking a candidate of the ranking opens
//! its replay beside the trace in Compare, and that replay's peak reserved is what `cachalot
//! stats TRACE --config CANDIDATE --json` reports, to the byte (and what the chart showed); and
//! `cachalot view TRACE --compare-policy` does the same with the trace's replay under
//! `policy:cachalot`.

#![allow(clippy::unwrap_used, reason = "test")]

mod common;

use cachalot_viewer::tune::replay_name;
use cachalot_viewer::{View, ViewerApp};
use common::{cachalot, text, trace};
use egui_kittest::kittest::Queryable;

/// `reserved_bytes.all.peak` of `cachalot stats TRACE --config SETTINGS --json`.
fn stats_peak(trace: &str, settings: &str) -> u64 {
    let out = cachalot(&["stats", trace, "--config", settings, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    stats["reserved_bytes.all.peak"].as_u64().unwrap()
}

#[test]
fn clicking_a_candidate_compares_its_replay_with_the_trace() {
    let path = trace("convnet_train");
    let mut app = ViewerApp::new();
    app.open_path(&path);
    app.wait_for_loads();
    app.view = View::Tune;
    let mut harness = cachalot_viewer::native::harness(app, egui::vec2(1200.0, 900.0), 1.0, false);
    harness.run_steps(2);
    harness.get_by_label("Run tune").click();
    harness.run_steps(1);
    harness.state_mut().tune.wait();
    harness.run_steps(2);
    let tuning = harness.state().tune.result.clone().unwrap().unwrap().tuning;
    // Not the winner: a setting other than the trace's own and the first.
    let rank = 3;
    let candidate = tuning.ranked[rank - 1].clone();
    assert_ne!(candidate.settings, tuning.baseline.settings);
    harness.get_by_label(&format!("compare #{rank}")).click();
    harness.run_steps(1);
    harness.state_mut().wait_for_loads();
    harness.run_steps(3);

    let app = harness.state();
    assert_eq!(app.view, View::SideBySide, "{}", app.status_json());
    let (a, b) = (&app.tabs[app.side_by_side.a], &app.tabs[app.side_by_side.b]);
    assert_eq!(a.run.name, "convnet_train.pickle", "the trace on the left");
    assert_eq!(b.run.name, replay_name("convnet_train.pickle", &candidate.settings), "its replay on the right");
    let right_peak = b.run.recorded_stats.as_ref().unwrap().to_flat()["reserved_bytes.all.peak"];
    let cli_peak = stats_peak(&path, &candidate.settings);
    assert_eq!(u64::try_from(right_peak).unwrap(), cli_peak, "{}", candidate.settings);
    assert_eq!(candidate.peak_reserved, cli_peak, "the chart's bar");
    // The replay's rebuilt state agrees with its own end state.
    assert!(matches!(b.run.verification, cachalot_viewer::model::Verification::Matches { .. }));
}

/// `cachalot view TRACE --compare-policy`: the trace beside its replay under `policy:cachalot`
/// in Compare, headless; the replay's peak is `cachalot stats TRACE --config policy:cachalot`'s.
#[test]
fn compare_policy_opens_the_replay_under_cachalots_policy_beside_the_trace() {
    let path = trace("gpt_train");
    let out_dir = std::env::temp_dir().join(format!("cachalot-compare-policy-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let png = out_dir.join("compare.png");
    let out = cachalot(&["view", &path, "--compare-policy", "--screenshot", png.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("wrote"), "{}", text(&out.stdout));
    assert!(std::fs::metadata(&png).unwrap().len() > 10_000);
    let _ = std::fs::remove_dir_all(&out_dir);

    let mut app = ViewerApp::new();
    app.open_path(&path);
    app.compare_policies_when_loaded();
    app.wait_for_loads();
    assert_eq!(app.view, View::SideBySide, "{}", app.status_json());
    let b = &app.tabs[app.side_by_side.b];
    assert_eq!(b.run.name, replay_name("gpt_train.pickle", "policy:cachalot"));
    let right_peak = b.run.recorded_stats.as_ref().unwrap().to_flat()["reserved_bytes.all.peak"];
    assert_eq!(u64::try_from(right_peak).unwrap(), stats_peak(&path, "policy:cachalot"));

    // Without a file there is nothing to replay.
    let out = cachalot(&["view", "--compare-policy", "--screenshot", "never.png"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--compare-policy needs a PyTorch trace"), "{}", text(&out.stderr));
}
