//! Warming the page's code before the visitor's first file.
//!
//! V8 runs a WebAssembly function first in its baseline tier (Liftoff) and compiles it
//! optimised (TurboFan) only once it has run for a while, so the page's first open of a file
//! parsed 4–6× and laid the timeline out about 4× slower than a second open of the same file in
//! the same page, which runs at native speed (docs/journal/benchmarks-2026-11.md §11). Nothing a
//! page can ask of V8 changes that; running the code does. So once the page has drawn its first
//! frames, it opens a small real PyTorch trace (`convnet_train`, 74 KB, built in) off-screen in
//! idle time, round after round — read and rebuilt as a file is, then one UI pass of the viewer in
//! an egui context of its own — until a round is no faster than the best before it. Each round is
//! one task of a few milliseconds, so the page stays responsive, and nothing of it is shown: the
//! visitor's viewer and its tabs are not touched.

use crate::app::ViewerApp;
use crate::load::{Progress, load_bytes};

/// The trace opened: a real PyTorch 2.11 snapshot pickle, small enough to build in.
const TRACE: &[u8] = include_bytes!("../../../testdata/traces/pytorch-2.11-h200/convnet_train.pickle");

/// At most this many rounds, whatever the times say.
const MAX_ROUNDS: usize = 12;

/// Milliseconds to leave the page's start (wasm compile, first frames, the fetch of a file named
/// in the address) before the first round.
const START_DELAY_MS: i32 = 300;

/// Opens [`TRACE`] off-screen round after round in idle time (see the module docs). Leaves a
/// `cachalot warmed up` performance mark when done, or nothing if the trace could not be read
/// (it is built in, so that would be a defect, logged).
pub async fn warm_up() {
    super::run::sleep_ms(START_DELAY_MS).await;
    let mut best = f64::INFINITY;
    for round in 0..MAX_ROUNDS {
        let started = now_ms();
        if let Err(message) = open_off_screen() {
            log::error!("warming the page's code: {message}");
            return;
        }
        let took = now_ms() - started;
        // Optimised code arrives in the background; three rounds in, a round no faster than the
        // best so far means the code it runs is as fast as it will get.
        if round >= 2 && took >= best {
            break;
        }
        best = best.min(took);
        // Let the page draw and take input between rounds.
        super::run::sleep_ms(0).await;
    }
    crate::loading::mark("cachalot warmed up");
}

/// One round: the trace read and rebuilt, then laid out by a viewer of its own.
fn open_off_screen() -> Result<(), String> {
    let runs = load_bytes("warm-up.pickle", TRACE, &Progress::default()).map_err(|e| e.to_string())?;
    let ctx = egui::Context::default();
    ViewerApp::setup(&ctx);
    let mut viewer = ViewerApp::new();
    viewer.add_runs(runs);
    let input = || egui::RawInput {
        screen_rect: Some(egui::Rect::from_min_size(egui::Pos2::ZERO, egui::vec2(1280.0, 800.0))),
        ..Default::default()
    };
    // Two passes, as the page's first frames with a new tab lay it out (the first sizes it).
    for _ in 0..2 {
        let output = ctx.run_ui(input(), |ui| viewer.show(ui));
        let _ = ctx.tessellate(output.shapes, output.pixels_per_point);
    }
    Ok(())
}

fn now_ms() -> f64 {
    web_sys::window().and_then(|w| w.performance()).map_or(0.0, |p| p.now())
}
