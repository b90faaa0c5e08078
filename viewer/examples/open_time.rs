//! Seconds the native viewer takes to open files and draw them, the reference for the web
//! page's figure in BENCHMARKS.md (`scripts/dev/bench-web.sh` runs both). Per file, the median
//! of `--runs` opens (default 3) of two measures, printed as one JSON line:
//!
//! - `load_seconds`: read + parse + rebuild (what `cachalot view` does before its first frame);
//! - `seconds`: the same, then the viewer's frames (UI pass and tessellation, in a headless
//!   egui_kittest harness) until the run's timeline is laid out: the first frame with the trace,
//!   handed to the GPU, as the page's figure ends (the page's WebGL draws it after);
//! - `rendered_seconds`: the same, then that frame rendered to pixels through wgpu (lavapipe
//!   without a GPU) and read back.
//!
//! The harness, its device and the fonts are made and warmed up before the clock starts, as the
//! page's are before its file is asked for.
//!
//! ```text
//! cargo run --release -p cachalot-viewer --example open_time -- [--runs N] FILE...
//! ```

use std::time::Instant;

use cachalot_viewer::ViewerApp;
use cachalot_viewer::load::{Progress, load_bytes};

/// The page's viewport in the benchmark (`scripts/dev/web-test/bench.mjs`).
const SIZE: egui::Vec2 = egui::vec2(1400.0, 860.0);
/// Frames to wait at most for the timeline to be laid out (panels settle their sizes first).
const MAX_FRAMES: usize = 8;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), String> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut runs = 3;
    if let Some(i) = args.iter().position(|a| a == "--runs") {
        runs = args.get(i + 1).and_then(|n| n.parse().ok()).ok_or("--runs takes a number")?;
        args.drain(i..i + 2);
    }
    if args.is_empty() {
        return Err("usage: open_time [--runs N] FILE...".into());
    }
    for path in &args {
        let name = std::path::Path::new(path).file_name().map_or(path.clone(), |n| n.to_string_lossy().into_owned());
        let (mut loads, mut drawn, mut rendered) = (Vec::new(), Vec::new(), Vec::new());
        let mut entries = 0;
        for _ in 0..runs.max(1) {
            let mut harness = cachalot_viewer::native::harness(ViewerApp::new(), SIZE, 1.0, false);
            harness.run_steps(2);
            harness.render()?;

            let started = Instant::now();
            let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
            let opened = load_bytes(&name, &bytes, &Progress::default()).map_err(|e| format!("{path}: {e}"))?;
            loads.push(started.elapsed().as_secs_f64());
            entries = opened.iter().map(|r| r.trace.len()).sum::<usize>();
            harness.state_mut().add_runs(opened);
            let laid_out = |app: &ViewerApp| app.tabs.iter().all(|t| t.timeline.plot_area.is_some());
            for _ in 0..MAX_FRAMES {
                harness.step();
                if laid_out(harness.state()) {
                    break;
                }
            }
            if !laid_out(harness.state()) {
                return Err(format!("{path}: the timeline was not laid out in {MAX_FRAMES} frames"));
            }
            drawn.push(started.elapsed().as_secs_f64());
            harness.render()?;
            rendered.push(started.elapsed().as_secs_f64());
        }
        println!(
            r#"{{"file":"{name}","entries":{entries},"load_seconds":{:.4},"seconds":{:.4},"rendered_seconds":{:.4}}}"#,
            median(loads),
            median(drawn),
            median(rendered)
        );
    }
    Ok(())
}
