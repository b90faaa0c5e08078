//! The "Run experiment" window driven through egui_kittest as a person would: the settings of
//! every experiment of `cachalot run` are there, what is wrong with them is said in the window
//! (a bad allocator config, a missing op file, a device that does not open), and an op file
//! run on the simulator from it becomes a run whose model equals the one loaded from the run
//! saved as a file (a cachalot snapshot and a PyTorch pickle), stopped or not.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cachalot_core::TraceEntry;
use cachalot_viewer::ViewerApp;
use cachalot_viewer::live::save::{SaveFormat, run_bytes};
use cachalot_viewer::load::{Progress, load_bytes};
use cachalot_viewer::model::{Run, Verification};
use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;

fn window() -> Harness<'static, ViewerApp> {
    let mut harness = cachalot_viewer::native::harness(ViewerApp::new(), egui::vec2(1200.0, 900.0), 1.0, false);
    harness.run_steps(2);
    harness.get_all_by_label("Run experiment…").next().unwrap().click();
    harness.run_steps(2);
    harness
}

/// Replaces the text of the field labelled `label` with `text`.
fn type_into(harness: &mut Harness<'static, ViewerApp>, label: &str, text: &str) {
    harness.get_by_role_and_label(Role::TextInput, label).focus();
    harness.run_steps(1);
    harness.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::A);
    harness.run_steps(1);
    if text.is_empty() {
        harness.key_press(egui::Key::Delete);
    } else {
        harness.get_by_role_and_label(Role::TextInput, label).type_text(text);
    }
    harness.run_steps(1);
}

/// Steps the window until `done` holds (a minute at most).
fn step_until(
    harness: &mut Harness<'static, ViewerApp>,
    what: &str,
    done: impl Fn(&Harness<'static, ViewerApp>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done(harness) {
        assert!(Instant::now() < deadline, "{what}: {}", harness.state().status_json());
        harness.step();
        std::thread::sleep(Duration::from_millis(2));
    }
    harness.run_steps(2);
}

#[test]
fn every_experiment_shows_the_flags_of_cachalot_run() {
    let mut harness = window();
    for field in ["backend", "config", "device", "capacity", "profile", "compute"] {
        harness.get_all_by_label(field).next().unwrap_or_else(|| panic!("no field {field}"));
    }
    for name in ["auto", "cuda", "wgpu", "sim"] {
        harness.get_by_label(name);
    }
    harness.get_by_label("mlp-train").click();
    harness.run_steps(2);
    for field in ["steps", "widths", "depth", "batches", "learning rate", "momentum", "seed"] {
        harness.get_by_role_and_label(Role::TextInput, field);
    }
    for choice in ["adam", "sgd", "relu", "gelu", "cross-entropy", "mse"] {
        harness.get_by_label(choice);
    }
    harness.get_by_label("matmul-sweep").click();
    harness.run_steps(2);
    for field in ["shapes", "sizes", "layouts", "tolerance", "seed"] {
        harness.get_by_role_and_label(Role::TextInput, field);
    }
    harness.get_by_label("ops").click();
    harness.run_steps(2);
    for field in ["op file", "mark every"] {
        harness.get_by_role_and_label(Role::TextInput, field);
    }
}

#[test]
fn what_is_wrong_is_said_in_the_window() {
    let mut harness = window();
    type_into(&mut harness, "config", "expandable_segments:Maybe");
    harness.get_by_label("Start run").click();
    harness.run_steps(2);
    harness.get_by_label_contains("config 'expandable_segments:Maybe': allocator config: invalid value 'Maybe'");
    assert!(harness.state().tabs.is_empty(), "nothing started");

    type_into(&mut harness, "config", "");
    harness.get_by_label("ops").click();
    harness.run_steps(1);
    type_into(&mut harness, "op file", "/no/such/file.ops");
    // Said as it is typed, and refused on Start.
    harness.get_by_label_contains("op file /no/such/file.ops:");
    harness.get_by_label("Start run").click();
    harness.run_steps(2);
    harness.get_all_by_label_contains("op file /no/such/file.ops:").next().unwrap();
    assert!(harness.state().tabs.is_empty(), "nothing started");

    // A CUDA device no machine has: the worker thread cannot open it, and the window says so.
    harness.get_by_label("seeds").click();
    harness.run_steps(1);
    harness.get_by_label("cuda").click();
    harness.run_steps(1);
    type_into(&mut harness, "device", "4096");
    harness.get_by_label("Start run").click();
    step_until(&mut harness, "the device's failure was not shown", |h| h.query_by_label_contains("seeds: ").is_some());
    assert!(harness.state().tabs.is_empty(), "nothing started: {:?}", harness.state().notices);
}

/// A small op file: a few allocations and frees, sizes of both pools.
fn op_file(name: &str, ops: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cachalot-run-dialog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = String::new();
    for i in 0..ops {
        let size = [512, 4096, 1 << 20, 3 << 20, 700_000][i % 5] + i;
        text.push_str(&format!("a {i} {size}\n"));
        if i >= 3 {
            text.push_str(&format!("f {}\n", i - 3));
        }
    }
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Starts `ops FILE` on the simulator from the window.
fn start_ops(path: &std::path::Path, mark_every: &str) -> Harness<'static, ViewerApp> {
    let mut harness = window();
    harness.get_by_label("ops").click();
    harness.run_steps(1);
    type_into(&mut harness, "op file", &path.display().to_string());
    type_into(&mut harness, "mark every", mark_every);
    harness.get_by_label("sim").click();
    harness.run_steps(1);
    harness.get_by_label("Start run").click();
    step_until(&mut harness, "the run did not start", |h| !h.state().tabs.is_empty());
    harness
}

/// The window's run equals the run loaded from it saved in either format.
fn assert_saved_runs_equal(run: &Run, end: Option<&cachalot_trace::Snapshot>) {
    assert!(matches!(run.verification, Verification::Matches { .. }), "{:?}", run.verification);
    for format in [SaveFormat::Cachalot, SaveFormat::TorchPickle] {
        let bytes = run_bytes(run, end, format).unwrap();
        let loaded = load_bytes(&format!("saved.{}", format.extension()), &bytes, &Progress::default()).unwrap();
        let loaded = &loaded[0];
        let what = format.extension();
        assert_eq!(run.trace.len(), loaded.trace.len(), "{what}: entries");
        let frames = |r: &Run, i: usize| r.trace[i].context.map(|c| r.contexts.frames(c).to_vec());
        let untagged = |r: &Run, i: usize| TraceEntry { context: None, ..r.trace[i] };
        for i in 0..run.trace.len() {
            assert_eq!(untagged(run, i), untagged(loaded, i), "{what}: entry {i}");
            assert_eq!(frames(run, i), frames(loaded, i), "{what}: stack of entry {i}");
        }
        assert_eq!(run.allocated.values(), loaded.allocated.values(), "{what}: allocated");
        assert_eq!(run.active.values(), loaded.active.values(), "{what}: active");
        assert_eq!(run.reserved.values(), loaded.reserved.values(), "{what}: reserved");
        assert_eq!(run.markers, loaded.markers, "{what}: markers");
        assert_eq!(run.verification, loaded.verification, "{what}: verification");
    }
}

#[test]
fn an_op_file_run_from_the_window_equals_its_saved_snapshot() {
    let path = op_file("small.ops", 40);
    let mut harness = start_ops(&path, "10");
    step_until(&mut harness, "the run did not end", |h| !h.state().has_live_runs());
    let tab = &harness.state().tabs[0];
    assert!(tab.run.name.starts_with("ops small.ops on "), "{}", tab.run.name);
    // The file's 40 allocations and 37 frees, then the frees and releases at the end.
    assert!(tab.run.trace.len() > 77, "{}", tab.run.trace.len());
    assert_eq!(tab.run.marks.iter().filter(|m| m.label.starts_with("op ")).count(), 7, "77 ops, a mark every 10");
    assert_saved_runs_equal(&tab.run, tab.end_snapshot.as_deref());
    // Save… is offered for it.
    harness.get_by_label("Save…");
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_stopped_op_file_run_saves_what_it_did() {
    let path = op_file("long.ops", 200_000);
    let mut harness = start_ops(&path, "0");
    step_until(&mut harness, "the run did not stream", |h| h.state().tabs[0].run.trace.len() >= 1_000);
    harness.get_by_label("⏹ Stop").click();
    step_until(&mut harness, "the run did not stop", |h| !h.state().has_live_runs());
    assert!(harness.state().notices.iter().any(|n| n.text.contains("ended early")), "{:?}", harness.state().notices);
    let tab = &harness.state().tabs[0];
    assert!(tab.run.trace.len() < 400_000, "stopped before the end: {}", tab.run.trace.len());
    assert_saved_runs_equal(&tab.run, tab.end_snapshot.as_deref());
    let _ = std::fs::remove_file(path);
}
