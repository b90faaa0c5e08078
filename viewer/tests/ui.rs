//! The viewer, driven like a person would through egui_kittest: pictures of every view
//! rendered through wgpu (lavapipe on CI), and interactions — drag the timeline's cursor,
//! select a block, pick an event, open a bad file, watch a live run — asserting what the UI
//! then shows.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers outside #[test] functions")]

mod common;

use common::click_at;

use cachalot_viewer::format;
use cachalot_viewer::live::{self, SimExperiment, SimRunner};
use cachalot_viewer::model::Verification;
use cachalot_viewer::native::harness;
use cachalot_viewer::{View, ViewerApp};
use egui::{Pos2, Vec2};
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;

const SIZE: Vec2 = Vec2::new(1200.0, 760.0);

fn app_with(runs: Vec<cachalot_viewer::Run>, view: View) -> ViewerApp {
    let mut app = ViewerApp::new();
    app.add_runs(runs);
    app.view = view;
    app
}

/// The cursor position the fixed run's timeline shows at a fraction of its plot's width.
fn plot_point(harness: &Harness<'_, ViewerApp>, fraction: f32) -> (Pos2, usize) {
    let (rect, x0, x1) = harness.state().tabs[0].timeline.plot_area.expect("the timeline was drawn");
    let x = rect.left() + fraction * rect.width();
    let entry = (x0 + (x1 - x0) * f64::from(fraction)).round() as usize;
    (Pos2::new(x, rect.center().y), entry)
}

/// Renders `view` of the fixed run (and, for Compare, of its expandable twin) at entry 40 and
/// compares the picture with `tests/snapshots/fixed_VIEW.png`.
fn render(view: View) {
    let cursor = 40;
    let mut runs = vec![common::fixed_run(false)];
    if view == View::SideBySide {
        runs.push(common::fixed_run(true));
    }
    let mut app = app_with(runs, view);
    for tab in &mut app.tabs {
        tab.cursor = cursor;
    }
    app.side_by_side.a = 0;
    app.side_by_side.b = 1;
    app.active = 0;
    let mut harness = harness(app, SIZE, 1.0, true);
    harness.run_steps(4);
    harness.snapshot(format!("fixed_{}", view.title().to_lowercase()));
}

/// Marks a few entries apart: their labels stack in rows and none overlaps another (the picture
/// is `tests/snapshots/crowded_marks.png`), and the legend above the plot hides none of them.
#[test]
fn crowded_mark_labels_never_overlap() {
    let mut harness = harness(app_with(vec![common::crowded_marks_run()], View::Segments), SIZE, 1.0, true);
    harness.run_steps(4);
    harness.snapshot("crowded_marks");
}

#[test]
fn the_segment_map_renders() {
    render(View::Segments);
}

#[test]
fn the_pools_render() {
    render(View::Pools);
}

#[test]
fn the_stats_render() {
    render(View::Stats);
}

#[test]
fn the_event_list_renders() {
    render(View::Events);
}

#[test]
fn the_comparison_renders() {
    render(View::SideBySide);
}

#[test]
fn dragging_the_timeline_moves_the_cursor_and_the_stats_follow() {
    let mut harness = harness(app_with(vec![common::fixed_run(false)], View::Stats), SIZE, 1.0, true);
    harness.run_steps(3);
    let tab = &harness.state().tabs[0];
    let peak = tab.run.allocated.values().iter().copied().max().unwrap();
    assert!(peak > 0 && tab.run.allocated.at(tab.cursor) == peak, "a run opens at its peak of allocated memory");
    assert!(tab.run.allocated.values()[..tab.cursor].iter().all(|&v| v < peak), "at the first time it is reached");

    let (from, _) = plot_point(&harness, 0.8);
    let (to, expected) = plot_point(&harness, 0.35);
    harness.hover_at(from);
    harness.run_steps(1);
    harness.drag_at(from);
    harness.run_steps(1);
    for k in 1..=5 {
        harness.hover_at(from + (to - from) * (k as f32 / 5.0));
        harness.run_steps(1);
    }
    harness.drop_at(to);
    harness.run_steps(3);

    let tab = &harness.state().tabs[0];
    let cursor = tab.cursor;
    assert!(cursor.abs_diff(expected) <= 1, "cursor {cursor}, expected about {expected}");
    let allocated = tab.run.allocated.at(cursor);
    let state = tab.run.state_at(cursor);
    assert_eq!(state.stats.allocated_bytes.all().current as u64, allocated);
    // The stats table now shows the allocated bytes at the cursor, and the header says where.
    let text = format::bytes(allocated);
    assert!(!harness.query_all_by_label(&text).collect::<Vec<_>>().is_empty(), "no label {text:?}");
    harness.get_by_label_contains(&format!("after #{}:", format::count(cursor as u64 - 1)));

    // The keyboard steps one entry.
    harness.key_press(egui::Key::ArrowLeft);
    harness.run_steps(2);
    assert_eq!(harness.state().tabs[0].cursor, cursor - 1);
}

#[test]
fn selecting_a_block_shows_its_details() {
    let mut app = app_with(vec![common::fixed_run(false)], View::Segments);
    app.set_cursor(12);
    let mut harness = harness(app, SIZE, 1.0, true);
    harness.run_steps(3);
    let rect = harness.state().tabs[0].segments.drawn_rect(common::WEIGHTS).expect("the weights block is drawn");
    click_at(&mut harness, rect.center());
    assert_eq!(harness.state().tabs[0].segments.selected, Some(common::WEIGHTS));
    harness.get_by_label_contains(&format!("Block {} — 40.0 MiB", format::address(common::WEIGHTS)));
    harness.get_by_label("size 41,943,040 B, requested 41,943,040 B");
    harness.get_by_label("model.py:10 init_weights");
    harness.get_by_label_contains("made by entry #1: alloc");

    // "go there" moves the cursor to just after the allocation.
    harness.get_by_label("go there").click();
    harness.run_steps(2);
    assert_eq!(harness.state().tabs[0].cursor, 2);
}

#[test]
fn picking_an_event_moves_the_cursor() {
    let mut app = app_with(vec![common::fixed_run(false)], View::Events);
    app.set_cursor(0);
    let mut harness = harness(app, SIZE, 1.0, true);
    harness.run_steps(3);
    let line = cachalot_viewer::events::entry_line(&harness.state().tabs[0].run, 5);
    harness.get_by_label(&line).click();
    harness.run_steps(2);
    assert_eq!(harness.state().tabs[0].cursor, 6);
    harness.get_by_label_contains("after #5:");

    // Filtering by action keeps only those entries.
    harness.get_by_label("alloc").click();
    harness.run_steps(2);
    let tab = &harness.state().tabs[0];
    let kept = tab.events.filtered();
    assert!(!kept.is_empty());
    assert!(kept.iter().all(|&i| tab.run.trace[i as usize].action != cachalot_core::TraceAction::Alloc));
}

#[test]
fn bad_files_show_an_error_and_the_app_stays_usable() {
    let mut app = ViewerApp::new();
    app.open_bytes("broken.pickle", b"\x80\x04\x95garbage".to_vec());
    app.open_bytes("empty.json", Vec::new());
    app.open_bytes("random.bin", vec![7; 64]);
    app.open_bytes("truncated.json", br#"{"format": "cachalot-snapshot", "version": 1, "trace": ["#.to_vec());
    app.wait_for_loads();
    app.add_runs(vec![common::fixed_run(false)]);
    let mut harness = harness(app, SIZE, 1.0, true);
    harness.run_steps(3);
    for name in
        ["broken.pickle", "empty.json: the file is empty", "random.bin: not a cachalot snapshot", "truncated.json"]
    {
        harness.get_by_label_contains(name);
    }
    assert_eq!(harness.state().tabs.len(), 1);
    harness.get_by_label("Stats").click();
    harness.run_steps(2);
    harness.get_by_label("allocated_bytes.all");
    // Errors can be dismissed.
    let before = harness.state().notices.len();
    harness.get_all_by_label("dismiss").next().expect("a dismiss button").click();
    harness.run_steps(2);
    assert_eq!(harness.state().notices.len(), before - 1);
}

#[test]
fn a_live_run_streams_into_the_viewer() {
    let (sender, run) = live::channel();
    // Slow enough that the harness sees it grow over many frames.
    let experiment = SimExperiment { ops_per_tick: 4, ..SimExperiment::training(3) };
    let mut runner = SimRunner::new(&experiment, sender).expect("simulator");
    let mut app = ViewerApp::new();
    app.add_live(run.with_pump(move || runner.tick()));
    let mut harness = harness(app, SIZE, 1.0, true);
    let mut seen_growing = false;
    for _ in 0..2000 {
        harness.run_steps(1);
        let tab = &harness.state().tabs[0];
        if tab.live.is_some() && tab.run.end() > 0 {
            seen_growing = true;
            assert_eq!(tab.cursor, tab.run.end(), "the cursor follows a live run");
        }
        if tab.live.is_none() {
            break;
        }
    }
    let tab = &harness.state().tabs[0];
    assert!(seen_growing, "the run was seen while it grew");
    assert!(tab.live.is_none(), "the run finished");
    assert!(tab.run.end() > 300);
    assert!(matches!(tab.run.verification, Verification::Matches { .. }), "{:?}", tab.run.verification);
    harness.get_by_label_contains("training loop (simulator): finished");
}

/// The last batch of a live run is drawn: a threaded experiment sends its last entries and its
/// end together, taken in by the frame that stops following the run, and the timeline then
/// still spans the whole run, its last mark included; the cursor goes to the run's peak, where
/// a file of the run opens.
#[test]
fn a_finished_live_run_is_drawn_whole_at_its_peak() {
    // What a run sends, recorded first, then sent in two parts: all but its last entries while
    // the window draws it, then the last entries, marks and its end at once.
    let (sender, mut recorded) = live::channel();
    let experiment = SimExperiment { ops_per_tick: 4, ..SimExperiment::training(3) };
    let mut runner = SimRunner::new(&experiment, sender).expect("simulator");
    while runner.tick() {}
    drop(runner);
    let (events, _) = recorded.poll();
    let last_entries = events.iter().rposition(|e| matches!(e, live::LiveEvent::Entries(_))).expect("entries");
    assert!(matches!(events.last(), Some(live::LiveEvent::Finished(_))), "the run finished");
    let (sender, run) = live::channel();
    let mut app = ViewerApp::new();
    app.add_live(run);
    let mut harness = harness(app, SIZE, 1.0, true);
    for event in &events[..last_entries] {
        sender.send(event.clone());
    }
    harness.run_steps(4);
    let running_end = harness.state().tabs[0].run.end();
    assert!(harness.state().tabs[0].live.is_some() && running_end > 0, "the run is drawn while it runs");
    for event in &events[last_entries..] {
        sender.send(event.clone());
    }
    drop(sender);
    harness.run_steps(4);
    let tab = &harness.state().tabs[0];
    assert!(tab.live.is_none(), "the run ended");
    assert!(tab.run.end() > running_end, "the last batch came with the end");
    let (_, left, right) = tab.timeline.plot_area.expect("the timeline was drawn");
    let end = tab.run.end() as f64;
    assert!(left <= 0.0 && right >= end, "the plot shows entries {left}..{right} of 0..{end}");
    let last_mark = tab.run.marks.last().expect("the run has marks");
    assert!(right >= last_mark.trace_index as f64, "the last mark ({}) is in view", last_mark.label);
    assert_eq!(tab.cursor, cachalot_viewer::tabs::peak_cursor(&tab.run), "the cursor is at the peak");
    assert!(tab.cursor < tab.run.end(), "the training loop frees its memory before it ends");
}

#[test]
fn the_run_experiment_dialog_starts_a_live_run() {
    let app = ViewerApp::new().with_experiments(live::default_experiments());
    let mut harness = harness(app, SIZE, 1.0, true);
    harness.run_steps(2);
    harness.get_all_by_label("Run experiment…").next().expect("the button").click();
    harness.run_steps(2);
    harness.get_by_label_contains("KV-cache decoding").click();
    harness.run_steps(1);
    harness.get_by_label("Start").click();
    harness.run_steps(2);
    assert_eq!(harness.state().tabs.len(), 1);
    for _ in 0..600 {
        if harness.state().tabs[0].live.is_none() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        harness.run_steps(1);
    }
    let tab = &harness.state().tabs[0];
    assert!(tab.live.is_none(), "the experiment finished");
    assert!(tab.run.markers.empty_cache.len() == 1, "{:?}", tab.run.markers);
    assert!(matches!(tab.run.verification, Verification::Matches { .. }), "{:?}", tab.run.verification);
}

/// Experiments reach the viewer only through `with_experiments`: a bare viewer offers none and
/// its dialog says so.
#[test]
fn the_run_experiment_dialog_offers_only_the_hosts_experiments() {
    let mut harness = harness(ViewerApp::new(), SIZE, 1.0, true);
    harness.run_steps(2);
    harness.get_all_by_label("Run experiment…").next().expect("the button").click();
    harness.run_steps(2);
    harness.get_by_label_contains("offers no experiments");
    assert!(harness.query_by_label_contains("KV-cache decoding").is_none());
    assert!(harness.query_by_label("Start").is_none());
}

/// On a software rasterizer the panels paint no fill (the window is cleared to their colour,
/// which the harness does not do, so the picture shows through to transparent); elsewhere they
/// do. Both ways the panels' contents are drawn.
#[test]
fn panels_skip_their_fill_on_a_software_rasterizer() {
    let panel_fill = egui::Visuals::dark().panel_fill;
    for software in [false, true] {
        let mut app = app_with(vec![common::fixed_run(false)], View::Stats);
        app.software_rendering = software;
        let mut harness = harness(app, SIZE, 1.0, true);
        harness.run_steps(4);
        let image = harness.render().expect("renders");
        // An empty spot of the central panel, right of the stats table and summary.
        let [r, g, b, a] = image.get_pixel(SIZE.x as u32 - 10, SIZE.y as u32 - 40).0;
        let fill = panel_fill.to_srgba_unmultiplied();
        if software {
            assert_eq!(a, 0, "no panel fill under a software rasterizer, found {:?}", [r, g, b, a]);
        } else {
            assert_eq!([r, g, b, a], fill, "the panel fill");
        }
        harness.get_by_label("allocated_bytes.all");
    }
}

/// The Compare tab says why two runs differ, as `cachalot compare` does: `seeds` simulated with
/// PyTorch's CUDA workspaces and with wgpu's queue discipline (no workspaces) differ by the
/// workspaces, which the rerun confirms.
#[test]
fn the_compare_tab_explains_why_two_runs_differ() {
    use cachalot_core::AllocatorConfig;
    use cachalot_runtime::{Experiment, Selection, SimDevice, SimProfile, execute_on};
    use cachalot_viewer::load::{Progress, snapshot_run};
    use cachalot_viewer::model::RunKind;

    let run = |profile: SimProfile, name: &str| {
        let device = Box::new(SimDevice::new(profile, AllocatorConfig::default(), false).unwrap());
        let selection = Selection { backend: cachalot_runtime::BackendKind::Sim, lines: Vec::new() };
        let mut snapshot = execute_on(&Experiment::Seeds, device, selection).snapshot;
        // The entries carry the host's clock; the picture must not.
        for (i, entry) in snapshot.trace.iter_mut().enumerate() {
            entry.time_us = i as i64 * 100;
        }
        snapshot_run(name, snapshot, RunKind::Cachalot, &Progress::default())
    };
    let runs = vec![run(SimProfile::cuda_sm90(), "seeds.cuda.json"), run(SimProfile::wgpu(), "seeds.wgpu.json")];
    let mut harness = harness(app_with(runs, View::SideBySide), SIZE, 1.0, true);
    harness.run_steps(2);
    harness.get_by_label("Why they differ").click();
    harness.run_steps(2);
    harness.get_by_label("explain").click();
    harness.run_steps(1);
    harness.state_mut().side_by_side.reasons.wait();
    harness.run_steps(2);
    harness.get_by_label_contains("✔ every difference has a known reason");
    harness.get_by_label_contains("✔ a reason: cuBLAS/cuBLASLt workspaces");
    harness.snapshot("compare_reasons");
    harness.get_by_label_contains("linear_output: allocated −33.0 MiB");
}
