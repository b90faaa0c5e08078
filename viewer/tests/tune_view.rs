//! The Tune tab driven through egui_kittest on a reference trace (convnet_train, whose search
//! takes about half a second unoptimised): the picture of the chart and the ranking
//! (`tests/snapshots/tune_convnet_train.png`), the winner's line, and re-ranking by another
//! objective without a new search.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::path::PathBuf;

use cachalot_viewer::native::harness;
use cachalot_viewer::tune::paste_line;
use cachalot_viewer::{View, ViewerApp};
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;

fn trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../testdata/traces/pytorch-2.11-h200/{name}.pickle"))
}

/// The Tune tab of `name` with its search done, the timings zeroed so that the picture is the
/// same on every run.
fn tuned(name: &str) -> Harness<'static, ViewerApp> {
    let mut app = ViewerApp::new();
    app.open_path(trace(name));
    app.wait_for_loads();
    app.view = View::Tune;
    let mut harness = harness(app, egui::vec2(1200.0, 900.0), 1.0, true);
    harness.run_steps(2);
    harness.get_by_label("Run tune").click();
    harness.run_steps(1);
    let state = &mut harness.state_mut().tune;
    state.wait();
    let result = state.result.as_mut().unwrap().as_mut().unwrap();
    result.seconds = 0.0;
    for c in &mut result.tuning.ranked {
        c.allocator_seconds = 0.0;
    }
    harness.run_steps(4);
    harness
}

#[test]
fn the_tune_tab_of_a_reference_trace() {
    let mut harness = tuned("convnet_train");
    let tuning = harness.state().tune.result.clone().unwrap().unwrap().tuning;
    assert!(tuning.ranked.len() > 50, "{}", tuning.ranked.len());
    // The winner is the best of the ranking, and its line is shown to copy.
    let winner = tuning.winner().clone();
    assert!(tuning.ranked.iter().all(|c| c.peak_reserved >= winner.peak_reserved || !c.fits()));
    harness.get_by_label(&paste_line(&winner.settings));
    harness.get_by_label("📋 Copy").click();
    harness.run_steps(1);
    harness.get_by_label_contains("← the trace's own");
    harness.snapshot("tune_convnet_train");

    // Another objective re-ranks the same candidates.
    let count = tuning.ranked.len();
    harness.get_by_label("device-calls").click();
    harness.run_steps(2);
    let tuning = &harness.state().tune.result.as_ref().unwrap().as_ref().unwrap().tuning;
    assert_eq!(tuning.ranked.len(), count);
    let fitting: Vec<u64> = tuning.ranked.iter().filter(|c| c.fits()).map(|c| c.device_calls()).collect();
    assert!(fitting.windows(2).all(|w| w[0] <= w[1]), "ranked by device calls: {fitting:?}");
}

#[test]
fn a_run_that_is_not_a_pytorch_trace_says_why() {
    let mut app = ViewerApp::new();
    app.add_runs(vec![cachalot_viewer::Run::new(
        "a live run",
        cachalot_viewer::model::RunKind::Live,
        Default::default(),
    )]);
    app.view = View::Tune;
    let mut harness = harness(app, egui::vec2(1000.0, 600.0), 1.0, false);
    harness.run_steps(2);
    harness.get_by_label("Run tune").click();
    harness.run_steps(2);
    harness.get_by_label_contains("a live run is not a PyTorch trace");
}

#[test]
fn a_smaller_device_is_searched_anew_and_a_bad_size_is_named() {
    let mut app = ViewerApp::new();
    app.open_path(trace("convnet_train"));
    app.wait_for_loads();
    app.view = View::Tune;
    let mut harness = harness(app, egui::vec2(1200.0, 900.0), 1.0, false);
    harness.run_steps(2);
    let field = |h: &mut Harness<'static, ViewerApp>, text: &str| {
        h.get_by_role_and_label(egui::accesskit::Role::TextInput, "device total").focus();
        h.run_steps(1);
        h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::A);
        h.get_by_role_and_label(egui::accesskit::Role::TextInput, "device total").type_text(text);
        h.run_steps(1);
    };
    field(&mut harness, "a lot");
    harness.get_by_label("Run tune").click();
    harness.run_steps(2);
    harness.get_by_label_contains("device total 'a lot': not a size");

    // 250 MiB: more than the job allocates at its peak (178 MiB), less than its own settings
    // reserve on the trace's device (316 MiB): the allocator frees its cache and retries instead.
    let search = |h: &mut Harness<'static, ViewerApp>, text: &str| {
        field(h, text);
        h.get_by_label("Run tune").click();
        h.run_steps(1);
        h.state_mut().tune.wait();
        h.run_steps(2);
        h.state().tune.result.clone().unwrap().unwrap().tuning
    };
    let tuning = search(&mut harness, "250MiB");
    assert_eq!(tuning.device_total, 250 << 20);
    assert!(tuning.ranked.iter().all(|c| c.peak_reserved <= 250 << 20));
    assert!(tuning.baseline.fits() && tuning.winner().fits(), "{:?}", tuning.baseline);
    harness.get_by_label_contains("— device total 250.0 MiB");

    // 150 MiB: less than the job needs at once; every setting runs out, and the tab says where.
    let tuning = search(&mut harness, "150MiB");
    assert!(tuning.ranked.iter().all(|c| !c.fits()));
    let first = tuning.winner().first_new_oom.as_ref().unwrap().index;
    harness.get_by_label(&format!("no setting runs through on this device: first at entry #{first}"));
}

#[test]
fn clicking_a_bar_opens_its_candidate_beside_the_trace() {
    let mut harness = tuned("convnet_train");
    let rank = 5;
    let tuning = harness.state().tune.result.clone().unwrap().unwrap().tuning;
    let candidate = &tuning.ranked[rank - 1];
    let transform = harness.state().tune.chart_transform.unwrap();
    let pos = transform
        .position_from_point(&egui_plot::PlotPoint::new(rank as f64 - 1.0, candidate.peak_reserved as f64 / 2.0));
    harness.hover_at(pos);
    harness.run_steps(1);
    for pressed in [true, false] {
        let button = egui::PointerButton::Primary;
        harness.input_mut().events.push(egui::Event::PointerButton {
            pos,
            button,
            pressed,
            modifiers: Default::default(),
        });
        harness.run_steps(1);
    }
    harness.state_mut().wait_for_loads();
    harness.run_steps(3);
    let app = harness.state();
    assert_eq!(app.tune.selected, Some(rank - 1));
    assert_eq!(app.view, View::SideBySide, "{}", app.status_json());
    let right = &app.tabs[app.side_by_side.b].run;
    assert_eq!(right.name, cachalot_viewer::tune::replay_name("convnet_train.pickle", &candidate.settings));
    let peak = right.recorded_stats.as_ref().unwrap().to_flat()["reserved_bytes.all.peak"];
    assert_eq!(u64::try_from(peak).unwrap(), candidate.peak_reserved, "the bar's height is its replay's peak");
}
