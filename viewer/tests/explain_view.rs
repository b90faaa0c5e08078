//! The Explain tab driven through egui_kittest on the reference trace with out-of-memory errors
//! (`oom_probe_fraction`, its memory fraction read from the `expected.json` beside it): the tab
//! opens on the first error and names its main cause as `cachalot explain` does
//! (`cli/tests/golden/explain-oom.out`), the fix search runs on a thread when asked and names the
//! fix, and clicking an OOM marker of the timeline opens the tab at that error.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::path::PathBuf;

use cachalot_viewer::native::harness;
use cachalot_viewer::{View, ViewerApp};
use egui::{Pos2, vec2};
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;

fn trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../testdata/traces/pytorch-2.11-h200/{name}.pickle"))
}

fn opened(name: &str, view: View) -> Harness<'static, ViewerApp> {
    let mut app = ViewerApp::new();
    app.open_path(trace(name));
    app.wait_for_loads();
    assert_eq!(app.tabs.len(), 1, "{:?}", app.notices.iter().map(|n| &n.text).collect::<Vec<_>>());
    app.view = view;
    harness(app, vec2(1300.0, 900.0), 1.0, true)
}

#[test]
fn the_explain_tab_opens_on_the_first_oom_with_its_main_cause_and_finds_the_fix() {
    let mut harness = opened("oom_probe_fraction", View::Explain);
    // The first frame moves the cursor to the first error, the next starts explaining it.
    harness.run_steps(2);
    let first = harness.state().tabs[0].run.markers.ooms[0] as usize;
    assert_eq!(first, 88, "the recording's first out-of-memory error");
    assert_eq!(harness.state().tabs[0].cursor, first + 1);
    harness.state_mut().explain.wait();
    harness.run_steps(2);
    harness.get_by_label_contains("entry #88 ran out of memory: 64.0 MiB asked");
    harness.get_by_label_contains(
        "main cause: the memory fraction's allowance refused memory the device had (allowance 2.8 GiB",
    );
    // The stack that asked, and the one holding the live memory.
    assert_eq!(harness.query_all_by_label_contains("oom_probe shared/traces/capture.py:108").count(), 2);

    // The fix search runs off the UI thread, and says so while it does.
    harness.get_by_label("Find the fix").click();
    harness.run_steps(1);
    assert!(harness.state().explain.searching_fix(), "the search started on its thread");
    harness.state_mut().explain.wait();
    harness.run_steps(2);
    assert!(!harness.state().explain.is_running());
    harness.get_by_label("torch.cuda.set_per_process_memory_fraction(0.0202)");
    harness.get_by_label_contains("the job then runs through, peak reserved 2.8 GiB");
}

#[test]
fn clicking_an_oom_marker_opens_its_explanation() {
    let mut harness = opened("oom_probe_fraction", View::Segments);
    harness.state_mut().tabs[0].cursor = 0;
    harness.run_steps(3);
    let ooms = harness.state().tabs[0].run.markers.ooms.clone();
    let (rect, left, right) = harness.state().tabs[0].timeline.plot_area.expect("the timeline was drawn");
    let x_of = |entry: f64| rect.left() + ((entry - left) / (right - left)) as f32 * rect.width();
    // The last error's marker, one point to its right: a click near a marker picks it.
    let last = *ooms.last().unwrap() as usize;
    let pos = Pos2::new(x_of(last as f64 + 1.0) + 1.0, rect.center().y);
    let nearest = ooms
        .iter()
        .map(|&m| m as usize)
        .min_by(|&a, &b| (x_of(a as f64 + 1.0) - pos.x).abs().total_cmp(&(x_of(b as f64 + 1.0) - pos.x).abs()))
        .unwrap();
    common::click_at(&mut harness, pos);
    assert_eq!(harness.state().view, View::Explain);
    assert_eq!(harness.state().tabs[0].cursor, nearest + 1, "the cursor just past the error clicked");
    harness.state_mut().explain.wait();
    harness.run_steps(2);
    harness.get_by_label_contains(&format!("entry #{nearest} ran out of memory"));
    harness.get_by_label_contains("main cause:");

    // A click away from every marker only moves the cursor.
    harness.state_mut().view = View::Segments;
    let away = Pos2::new(rect.left() + 3.0, rect.center().y);
    harness.hover_at(away);
    harness.run_steps(1);
    harness.drag_at(away);
    harness.run_steps(1);
    harness.drop_at(away);
    harness.run_steps(2);
    assert_eq!(harness.state().view, View::Segments);
    assert!(harness.state().tabs[0].cursor < ooms[0] as usize, "{}", harness.state().tabs[0].cursor);
}

#[test]
fn a_run_without_a_request_before_the_cursor_says_so() {
    let mut harness = opened("seeds", View::Explain);
    harness.state_mut().tabs[0].cursor = 0;
    harness.run_steps(2);
    harness.get_by_label("no request before the cursor");
    harness.get_by_label("no out-of-memory error recorded");
    // At the peak (an allocation), the request is explained as served.
    let peak = cachalot_viewer::tabs::peak_cursor(&harness.state().tabs[0].run);
    harness.state_mut().tabs[0].cursor = peak;
    harness.run_steps(2);
    harness.state_mut().explain.wait();
    harness.run_steps(2);
    harness.get_by_label_contains("was served");
}
