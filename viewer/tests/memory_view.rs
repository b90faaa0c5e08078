//! The Memory view — the Active Memory Timeline over the peak analysis — driven through
//! egui_kittest: pictures of the fixed run and of PyTorch reference traces
//! (`tests/snapshots/memory_*.png`), hovering and clicking a band, dragging the cursor, and the
//! peak buttons.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers outside #[test] functions")]

mod common;

use std::path::PathBuf;

use cachalot_viewer::format;
use cachalot_viewer::load::{Progress, load_bytes};
use cachalot_viewer::memory_timeline::ColorBy;
use cachalot_viewer::model::lifetimes::BandItem;
use cachalot_viewer::model::peak::Peaks;
use cachalot_viewer::native::harness;
use cachalot_viewer::{Run, View, ViewerApp};
use egui::{Pos2, Vec2};
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;

const SIZE: Vec2 = Vec2::new(1200.0, 760.0);

fn memory_view(run: Run, cursor: Option<usize>) -> Harness<'static, ViewerApp> {
    let mut app = ViewerApp::new();
    app.add_runs(vec![run]);
    app.view = View::Memory;
    if let Some(c) = cursor {
        app.set_cursor(c);
    }
    let mut harness = harness(app, SIZE, 1.0, true);
    harness.run_steps(4);
    harness
}

fn reference(name: &str) -> Option<Run> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../testdata/traces/pytorch-2.11-h200/{name}.pickle"));
    let bytes = std::fs::read(&path).ok()?;
    Some(load_bytes(name, &bytes, &Progress::default()).unwrap().remove(0))
}

/// Where the band of the allocation `item` was drawn, at its widest column: a point inside it.
fn band_point(harness: &Harness<'_, ViewerApp>, pick: impl Fn(u64) -> bool) -> (Pos2, u32, usize) {
    let tab = &harness.state().tabs[0];
    let (area, _, _) = tab.memory.plot_area.expect("the timeline was drawn");
    let layout = tab.memory.layout().unwrap();
    let top = tab.run.active.values().iter().copied().max().unwrap() as f32;
    let band = layout
        .bands
        .iter()
        .filter(|b| matches!(b.item, BandItem::Allocation(i) if pick(tab.memory.lifetimes.items[i as usize].size)))
        .max_by_key(|b| (b.x1 - b.x0) as u64 * (b.y1 - b.y0))
        .expect("a band of that size");
    let BandItem::Allocation(item) = band.item else { unreachable!() };
    let col_w = area.width() / layout.columns as f32;
    let x = area.left() + (band.x0 + band.x1) as f32 / 2.0 * col_w;
    let y = area.bottom() - ((band.y0 + band.y1) as f32 / 2.0 / top) * area.height();
    let column = ((x - area.left()) / col_w) as usize;
    (Pos2::new(x, y), item, layout.samples[column] as usize)
}

#[test]
fn the_memory_view_renders_the_fixed_run() {
    let mut harness = memory_view(common::fixed_run(false), Some(40));
    harness.snapshot("memory_fixed");
}

/// A PyTorch 2.11 transformer's training steps at their peak of allocated memory (where a run
/// opens).
#[test]
fn the_memory_view_renders_a_reference_training_trace() {
    let Some(gpt) = reference("gpt_train") else {
        eprintln!("skipped: the reference traces are not there");
        return;
    };
    let mut harness = memory_view(gpt, None);
    harness.snapshot("memory_gpt_train");
}

/// A PyTorch 2.11 run on several streams, coloured by stream.
#[test]
fn the_memory_view_renders_a_reference_multistream_trace_by_stream() {
    let Some(run) = reference("multistream") else {
        eprintln!("skipped: the reference traces are not there");
        return;
    };
    let mut harness = memory_view(run, None);
    harness.state_mut().tabs[0].memory.color_by = ColorBy::Stream;
    harness.run_steps(3);
    harness.snapshot("memory_multistream");
}

#[test]
fn hovering_a_band_names_the_allocation_and_clicking_it_selects_its_block() {
    let mut harness = memory_view(common::fixed_run(false), Some(40));
    // The 40 MiB weights: the one allocation of that size.
    let (point, item, sample) = band_point(&harness, |size| size == 40 << 20);
    harness.hover_at(point);
    // Past egui's tooltip delay.
    harness.run_steps(40);
    harness.get_by_label_contains(&format!("40.0 MiB at {}", format::address(common::WEIGHTS)));
    // The tooltip's stack, one indented frame a line (the by-stack table names it too).
    harness.get_by_label_contains("\n  init_weights (model.py:10)");

    harness.drag_at(point);
    harness.run_steps(1);
    harness.drop_at(point);
    harness.run_steps(3);
    let app = harness.state();
    assert_eq!(app.tabs[0].memory.lifetimes.items[item as usize].address, common::WEIGHTS);
    assert_eq!(app.view, View::Segments, "the click shows the segment map");
    assert_eq!(app.tabs[0].segments.selected, Some(common::WEIGHTS));
    assert_eq!(app.tabs[0].cursor, sample, "at the moment of the clicked column");
}

#[test]
fn dragging_moves_the_cursor_without_laying_the_picture_out_again() {
    let mut harness = memory_view(common::fixed_run(false), Some(40));
    let made = harness.state().tabs[0].memory.layouts_made;
    let (area, start, end) = harness.state().tabs[0].memory.plot_area.unwrap();
    let y = area.top() + 2.0;
    let from = Pos2::new(area.left() + 0.9 * area.width(), y);
    let to = Pos2::new(area.left() + 0.25 * area.width(), y);
    harness.hover_at(from);
    harness.run_steps(1);
    harness.drag_at(from);
    harness.run_steps(1);
    for k in 1..=4 {
        harness.hover_at(from + (to - from) * (k as f32 / 4.0));
        harness.run_steps(1);
    }
    harness.drop_at(to);
    harness.run_steps(2);
    let tab = &harness.state().tabs[0];
    let expected = start as f32 + 0.25 * (end - start) as f32;
    assert!((tab.cursor as f32 - expected).abs() <= 1.0, "cursor {} expected about {expected}", tab.cursor);
    assert_eq!(tab.memory.layouts_made, made, "moving the cursor reuses the layout");
}

#[test]
fn the_peak_buttons_jump_to_each_peak() {
    let run = common::fixed_run(false);
    let peaks = Peaks::of(&run);
    let (run_allocated, run_reserved) = (run.allocated.values().to_vec(), run.reserved.values().to_vec());
    let mut harness = memory_view(run, Some(0));
    let unused = |p: usize| run_reserved[p] - run_allocated[p];
    for (label, at, bytes) in [
        ("fragmentation", peaks.fragmentation, unused(peaks.fragmentation)),
        ("reserved", peaks.reserved, run_reserved[peaks.reserved]),
        ("allocated", peaks.allocated, run_allocated[peaks.allocated]),
    ] {
        harness.get_by_label(&format!("{label} {}", format::bytes(bytes))).click();
        harness.run_steps(2);
        assert_eq!(harness.state().tabs[0].cursor, at, "{label}");
    }
    // The by-stack table at the allocated peak lists the weights' stack and sums to the total.
    harness.get_by_label_contains("init_weights (model.py:10)");
}
