//! Live runs of `cachalot run`'s experiments through the app, on the simulator and on wgpu
//! (Mesa's lavapipe without a GPU): the model the window built from the streamed events must
//! equal the model loaded from the run saved as a file — as a cachalot snapshot and as a
//! PyTorch pickle — and a stopped run must end with what it did, saved the same way.
//!
//! The wgpu test skips where no adapter exists, unless `CACHALOT_REQUIRE_GPU=1` (then a missing
//! adapter fails it).

#![allow(clippy::unwrap_used, reason = "tests")]

use std::time::{Duration, Instant};

use cachalot_core::{ContextId, TraceEntry};
use cachalot_runtime::{BackendRequest, DeviceOptions, Experiment as RuntimeRun, MlpParams};
use cachalot_viewer::ViewerApp;
use cachalot_viewer::live::Experiment;
use cachalot_viewer::live::device_runs::RuntimeExperiment;
use cachalot_viewer::live::save::{SaveFormat, run_bytes};
use cachalot_viewer::load::{Progress, load_bytes};
use cachalot_viewer::model::{PoolState, Run, StateCache, Verification};

fn options(backend: BackendRequest, compute: bool) -> DeviceOptions {
    DeviceOptions { backend, compute, ..Default::default() }
}

/// Starts `experiment` on `backend` in a fresh app and polls it as the window's frames would,
/// until the run has ended (or, with `stop_after`, asks it to stop once that many entries
/// arrived).
fn watch(experiment: &RuntimeExperiment, backend: &str, stop_after: Option<usize>) -> ViewerApp {
    let ctx = egui::Context::default();
    let mut app = ViewerApp::new();
    app.add_live(experiment.start(backend, &ctx).unwrap());
    let deadline = Instant::now() + Duration::from_secs(300);
    while app.has_live_runs() {
        assert!(Instant::now() < deadline, "the live run did not end");
        app.poll(&ctx);
        let tab = &app.tabs[0];
        if let (Some(n), Some(live)) = (stop_after, &tab.live)
            && tab.run.trace.len() >= n
        {
            live.request_stop();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    app
}

/// Everything the panels read from a run: equal for the window's run and the loaded one. A
/// pickle numbers its stacks anew (in the order entries use them), so entries are compared with
/// their stacks' frames rather than their ids.
fn assert_same_model(live: &Run, loaded: &Run, what: &str) {
    assert_eq!(live.trace.len(), loaded.trace.len(), "{what}: trace length");
    let frames = |run: &Run, i: usize| run.trace[i].context.map(|c| run.contexts.frames(c).to_vec());
    let untagged = |run: &Run, i: usize| TraceEntry { context: None, ..run.trace[i] };
    if let Some(i) = (0..live.trace.len())
        .find(|&i| untagged(live, i) != untagged(loaded, i) || frames(live, i) != frames(loaded, i))
    {
        panic!("{what}: entry {i} differs: {:?} vs {:?}", live.trace[i], loaded.trace[i]);
    }
    assert_eq!(live.allocated.values(), loaded.allocated.values(), "{what}: allocated bytes");
    assert_eq!(live.active.values(), loaded.active.values(), "{what}: active bytes");
    assert_eq!(live.reserved.values(), loaded.reserved.values(), "{what}: reserved bytes");
    assert_eq!(live.markers, loaded.markers, "{what}: markers");
    assert_eq!(live.anomaly_count, loaded.anomaly_count, "{what}: anomalies");
    assert!(same_state(live, live.head(), loaded, loaded.head()), "{what}: end state");
    assert_eq!(live.end(), loaded.end(), "{what}: cursor positions");
    assert_eq!(live.verification, loaded.verification, "{what}: verification");
    let (mut a, mut b) = (StateCache::default(), StateCache::default());
    for cursor in (0..=live.end()).step_by((live.end() / 13).max(1)) {
        assert!(
            same_state(live, live.seek(&mut a, cursor), loaded, loaded.seek(&mut b, cursor)),
            "{what}: state at {cursor}"
        );
    }
}

/// Whether two states are equal, stacks compared by their frames.
fn same_state(run_a: &Run, a: &PoolState, run_b: &Run, b: &PoolState) -> bool {
    let normalized = |run: &Run, state: &PoolState| {
        let mut state = state.clone();
        let mut stacks = Vec::new();
        let mut frames = |c: &mut Option<ContextId>| stacks.push(c.take().map(|c| run.contexts.frames(c).to_vec()));
        for segment in state.segments.values_mut() {
            frames(&mut segment.context);
            for block in &mut segment.blocks {
                frames(&mut block.context);
            }
        }
        (state, stacks)
    };
    normalized(run_a, a) == normalized(run_b, b)
}

/// Runs `experiment` live on `backend`, saves it both ways and compares the models.
fn live_run_equals_its_saved_file(experiment: RuntimeExperiment, backend: &str) {
    let app = watch(&experiment, backend, None);
    let tab = &app.tabs[0];
    let run = &tab.run;
    assert!(!run.live && tab.live.is_none());
    assert!(matches!(run.verification, Verification::Matches { .. }), "{:?}", run.verification);
    assert!(!run.marks.is_empty() && run.trace.len() > 20, "{} entries", run.trace.len());
    assert!(app.notices.iter().all(|n| !n.error), "{:?}", app.notices);

    let json = run_bytes(run, tab.end_snapshot.as_deref(), SaveFormat::Cachalot).unwrap();
    let loaded = load_bytes("live.json", &json, &Progress::default()).unwrap().remove(0);
    assert_same_model(run, &loaded, "cachalot snapshot");
    assert_eq!(run.contexts.stacks(), loaded.contexts.stacks());
    assert_eq!(run.marks, loaded.marks);
    // The saved file keeps the run's record, as `cachalot run`'s snapshot does.
    let saved = cachalot_trace::Snapshot::from_json(&json).unwrap();
    let record = cachalot_runtime::RunRecord::from_snapshot(&saved).unwrap().unwrap();
    assert_eq!(record.experiment, experiment.experiment);
    assert!(record.error.is_none());

    let pickle = run_bytes(run, tab.end_snapshot.as_deref(), SaveFormat::TorchPickle).unwrap();
    let from_pickle = load_bytes("live.pickle", &pickle, &Progress::default()).unwrap().remove(0);
    assert_same_model(run, &from_pickle, "PyTorch pickle");
}

#[test]
fn a_live_simulator_run_equals_its_saved_snapshot_and_pickle() {
    let mlp = RuntimeRun::MlpTrain(MlpParams { steps: 4, ..MlpParams::default() });
    live_run_equals_its_saved_file(RuntimeExperiment::new(mlp, options(BackendRequest::Sim, false)), "sim");
    live_run_equals_its_saved_file(
        RuntimeExperiment::new(RuntimeRun::Seeds, options(BackendRequest::Sim, false)),
        "sim",
    );
}

#[test]
fn a_live_wgpu_run_equals_its_saved_snapshot_and_pickle() {
    let wgpu = options(BackendRequest::Wgpu, true);
    if let Err(error) = cachalot_runtime::open(&wgpu) {
        let required = std::env::var("CACHALOT_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0");
        assert!(!required, "CACHALOT_REQUIRE_GPU is set, but no wgpu device opens: {error}");
        eprintln!("skipped: no wgpu adapter ({error}); install mesa-vulkan-drivers, or set CACHALOT_REQUIRE_GPU=1");
        return;
    }
    let mlp = RuntimeRun::MlpTrain(MlpParams {
        steps: 3,
        widths: vec![64, 128, 10],
        batches: vec![32, 16],
        ..MlpParams::default()
    });
    live_run_equals_its_saved_file(RuntimeExperiment::new(mlp, wgpu), "wgpu");
}

#[test]
fn a_stopped_live_run_ends_with_what_it_did_and_saves_it() {
    let long = RuntimeRun::MlpTrain(MlpParams { steps: 100_000, ..MlpParams::default() });
    let app = watch(&RuntimeExperiment::new(long, options(BackendRequest::Sim, false)), "sim", Some(2_000));
    let tab = &app.tabs[0];
    let notice = app.notices.iter().find(|n| n.error).expect("a notice says the run ended early");
    assert!(notice.text.contains("ended early") && notice.text.contains("stopped"), "{}", notice.text);
    assert!(matches!(tab.run.verification, Verification::Matches { .. }), "{:?}", tab.run.verification);
    assert!(tab.run.marks.len() < 100_000);
    let json = run_bytes(&tab.run, tab.end_snapshot.as_deref(), SaveFormat::Cachalot).unwrap();
    let loaded = load_bytes("stopped.json", &json, &Progress::default()).unwrap().remove(0);
    assert_same_model(&tab.run, &loaded, "stopped run");
}

#[test]
fn a_device_that_cannot_be_opened_is_a_notice_not_a_hang() {
    // A CUDA device of an ordinal no machine has.
    let options = DeviceOptions { device: Some(4096), ..options(BackendRequest::Cuda, true) };
    let app = watch(&RuntimeExperiment::new(RuntimeRun::Seeds, options), "cuda", None);
    assert!(app.notices.iter().any(|n| n.error), "{:?}", app.notices);
    assert!(app.tabs[0].end_snapshot.is_none());
}

/// Through the window, as a person would: the experiment the command line named starts at the
/// first frame, the views follow it, Stop ends it, and Save… writes it as a PyTorch pickle
/// that opens as the same run.
#[test]
fn the_window_starts_follows_stops_and_saves_a_live_run() {
    use egui_kittest::kittest::Queryable;
    let long = RuntimeRun::MlpTrain(MlpParams { steps: 100_000, ..MlpParams::default() });
    let app = ViewerApp::new()
        .with_experiments(vec![Box::new(RuntimeExperiment::new(long, options(BackendRequest::Sim, false)))]);
    let mut harness = cachalot_viewer::native::harness(app, egui::vec2(1200.0, 760.0), 1.0, false);
    harness.state_mut().start_experiment(0, "sim");
    let deadline = Instant::now() + Duration::from_secs(120);
    while harness.state().tabs.first().is_none_or(|t| t.run.trace.len() < 3_000) {
        assert!(Instant::now() < deadline, "the run did not stream");
        harness.step();
        std::thread::sleep(Duration::from_millis(2));
    }
    let tab = &harness.state().tabs[0];
    assert!(tab.live.is_some() && tab.timeline.follow);
    assert_eq!(tab.cursor, tab.run.end(), "the views follow the newest entry");
    harness.get_by_label("⏹ Stop").click();
    while harness.state().has_live_runs() {
        assert!(Instant::now() < deadline, "the run did not stop");
        harness.step();
        std::thread::sleep(Duration::from_millis(2));
    }
    harness.run_steps(2);
    assert!(harness.state().notices.iter().any(|n| n.text.contains("ended early")));

    let dir = std::env::temp_dir().join(format!("cachalot-live-ui-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("stopped.pickle");
    harness.get_by_label("Save…").click();
    harness.run_steps(2);
    let field = harness.get_by_role(egui::accesskit::Role::TextInput);
    field.focus();
    harness.run_steps(1);
    // Replace the proposed path.
    harness.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::A);
    harness.run_steps(1);
    harness.get_by_role(egui::accesskit::Role::TextInput).type_text(&format!("{}", path.display()));
    harness.run_steps(1);
    harness.get_by_label("Save PyTorch pickle").click();
    harness.run_steps(2);
    let bytes = std::fs::read(&path).unwrap();
    let loaded = load_bytes("stopped.pickle", &bytes, &Progress::default()).unwrap().remove(0);
    assert_same_model(&harness.state().tabs[0].run, &loaded, "saved through the window");
    let _ = std::fs::remove_dir_all(&dir);
}
