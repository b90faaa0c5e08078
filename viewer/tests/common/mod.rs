//! A small fixed trace for the UI tests: a short scripted run of the real allocator on the
//! simulator with history on — deterministic to the byte, so rendered pictures are too.

#![allow(dead_code, reason = "each test file uses part of it")]
#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use cachalot_core::size::MIB;
use cachalot_core::{AllocatorConfig, CachingAllocator, Frame, SimBackend, StreamId};
use cachalot_trace::Snapshot;
use cachalot_viewer::load::{Progress, snapshot_run};
use cachalot_viewer::model::{Run, RunKind};

/// Address of the 40 MiB weight tensor (the first segment the simulator hands out).
pub const WEIGHTS: u64 = 0x7f00_0000_0000;

/// The fixed run, with or without expandable segments.
pub fn fixed_snapshot(expandable: bool) -> Snapshot {
    let config = if expandable {
        AllocatorConfig::parse("expandable_segments:True").unwrap()
    } else {
        AllocatorConfig::default()
    };
    let backend = SimBackend::new(1 << 30).with_name("fixed 1 GiB test device");
    let mut a = CachingAllocator::new(backend, config).unwrap();
    a.record_history(true, usize::MAX, &[], false);
    let stack = |a: &mut CachingAllocator<SimBackend>, file: &str, line: i64, name: &str| {
        a.intern_context(&[
            Frame { filename: file.into(), line, name: name.into() },
            Frame { filename: "test.py".into(), line: 1, name: "main".into() },
        ])
    };
    let weights = stack(&mut a, "model.py", 10, "init_weights");
    let forward = stack(&mut a, "model.py", 20, "forward");
    let backward = stack(&mut a, "train.py", 30, "backward");
    let mut clock = 1_000_000;
    let mut tick = |a: &mut CachingAllocator<SimBackend>| {
        clock += 250;
        a.backend_mut().set_time_us(clock);
    };
    tick(&mut a);
    a.set_context(Some(weights));
    let w = a.malloc(40 * MIB, StreamId::DEFAULT).unwrap();
    let bias = a.malloc(3 * MIB + 1, StreamId::DEFAULT).unwrap();
    let mut small = Vec::new();
    for i in 0..5 {
        tick(&mut a);
        small.push(a.malloc(4096 * (i + 1), StreamId::DEFAULT).unwrap());
    }
    a.mark("weights loaded");
    let mut kept = Vec::new();
    for step in 0..3u64 {
        a.set_context(Some(forward));
        let mut acts = Vec::new();
        for size in [12 * MIB, 700 * 1024, 5 * MIB + step * MIB] {
            tick(&mut a);
            acts.push(a.malloc(size, StreamId::DEFAULT).unwrap());
        }
        a.set_context(Some(backward));
        tick(&mut a);
        let grad = a.malloc(8 * MIB, StreamId(7)).unwrap();
        // The gradient is also used on the default stream: its free waits for that stream.
        a.backend_mut().hold_stream(StreamId::DEFAULT);
        a.record_stream(&grad, StreamId::DEFAULT).unwrap();
        a.set_context(None);
        for x in acts.drain(1..) {
            tick(&mut a);
            a.free(x).unwrap();
        }
        kept.extend(acts);
        tick(&mut a);
        a.free(grad).unwrap();
        a.mark(format!("step {step}"));
        a.backend_mut().finish_stream(StreamId::DEFAULT);
    }
    tick(&mut a);
    a.free(small.remove(2)).unwrap();
    a.free(kept.remove(0)).unwrap();
    a.empty_cache().unwrap();
    a.mark("after empty_cache");
    tick(&mut a);
    // Served from the cache, so the releases above read as the empty_cache call they were.
    kept.push(a.malloc(1000, StreamId::DEFAULT).unwrap());
    tick(&mut a);
    a.set_context(Some(forward));
    assert!(a.malloc(2 << 30, StreamId::DEFAULT).is_err(), "a 2 GiB request must fail on the 1 GiB device");
    tick(&mut a);
    let _late = a.malloc(6 * MIB, StreamId::DEFAULT).unwrap();
    let _ = (w, bias);
    Snapshot::capture(&a, if expandable { "fixed test run, expandable" } else { "fixed test run" })
}

/// The fixed run as the viewer loads it.
pub fn fixed_run(expandable: bool) -> Run {
    let name = if expandable { "fixed-expandable.json" } else { "fixed.json" };
    snapshot_run(name, fixed_snapshot(expandable), RunKind::Cachalot, &Progress::default())
}

/// A run whose marks crowd the timeline, as `seeds`'s do: a labelled mark after each of 24
/// allocations, two or three entries apart, with labels of every length.
pub fn crowded_marks_run() -> Run {
    let backend = SimBackend::new(1 << 30).with_name("crowded marks");
    let mut a = CachingAllocator::new(backend, AllocatorConfig::default()).unwrap();
    a.record_history(true, usize::MAX, &[], false);
    let labels = ["tiny", "tiny_del", "tiny_empty", "10240x1050", "empty", "linear_model", "linear_input"];
    let mut live = Vec::new();
    for i in 0..24u64 {
        live.push(a.malloc((i % 5 + 1) * MIB, StreamId::DEFAULT).unwrap());
        if i % 3 == 2 {
            a.free(live.remove(0)).unwrap();
        }
        a.mark(format!("{}_{i}", labels[i as usize % labels.len()]));
    }
    let snapshot = Snapshot::capture(&a, "crowded marks");
    snapshot_run("crowded.json", snapshot, RunKind::Cachalot, &Progress::default())
}

/// A click of the pointer at `pos` (hover, press, release), with the frames egui needs between.
pub fn click_at(harness: &mut egui_kittest::Harness<'_, cachalot_viewer::ViewerApp>, pos: egui::Pos2) {
    harness.hover_at(pos);
    harness.run_steps(1);
    harness.drag_at(pos);
    harness.run_steps(1);
    harness.drop_at(pos);
    harness.run_steps(2);
}
