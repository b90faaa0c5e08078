//! `cachalot view [FILE...]`: the pool viewer. `--screenshot out.png` renders it headless
//! (egui_kittest through wgpu, e.g. on Mesa's lavapipe) instead of opening a window;
//! `--bench` measures opening a 3-million-entry trace and dragging the cursor across it.

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use cachalot_viewer::live::default_experiments;
use cachalot_viewer::native::{ScreenshotOptions, WindowRenderer, bench, generate_trace, run_window, screenshot};
use cachalot_viewer::{View, ViewerApp};

use crate::failure::{Failure, Outcome};

/// Arguments of `cachalot view`.
#[derive(Clone, Debug, clap::Args)]
pub struct ViewArgs {
    /// Files to open: cachalot snapshots (.json), PyTorch snapshot pickles, op files.
    pub files: Vec<PathBuf>,
    /// Render headless into this PNG instead of opening a window.
    #[arg(long, value_name = "PNG")]
    pub screenshot: Option<PathBuf>,
    /// Panel under the timeline: segments, pools, stats, events or compare.
    #[arg(long, default_value = "segments")]
    pub view: String,
    /// Cursor position (entries applied) for the screenshot; default: the run's peak of
    /// allocated memory.
    #[arg(long)]
    pub cursor: Option<usize>,
    /// Screenshot size in points, WIDTHxHEIGHT.
    #[arg(long, default_value = "1400x900")]
    pub size: String,
    /// Pixels per point of the screenshot, from 0.25 to 4 (the picture must also stay within
    /// the 8192-pixel textures every wgpu device supports).
    #[arg(long, default_value_t = 1.0, value_parser = parse_scale)]
    pub scale: f32,
    /// What draws the window: auto (wgpu on a GPU; OpenGL where wgpu finds only a software
    /// rasterizer, which runs it several times faster), wgpu or glow.
    #[arg(long, default_value = "auto")]
    pub renderer: WindowRenderer,
    /// Measure open time and cursor-drag frame times on a generated trace.
    #[arg(long)]
    pub bench: bool,
    /// Entries of the benchmark trace.
    #[arg(long, default_value_t = 3_000_000)]
    pub bench_entries: usize,
    /// Frames of cursor dragging to time.
    #[arg(long, default_value_t = 300)]
    pub bench_frames: usize,
    /// With --bench: only write the generated trace (a cachalot snapshot) to this file.
    #[arg(long, value_name = "JSON")]
    pub bench_trace: Option<PathBuf>,
}

fn parse_size(text: &str) -> anyhow::Result<egui::Vec2> {
    let (w, h) = text.split_once('x').ok_or_else(|| anyhow!("--size {text}: expected WIDTHxHEIGHT"))?;
    let (w, h): (f32, f32) = (w.trim().parse()?, h.trim().parse()?);
    if !(100.0..=8000.0).contains(&w) || !(100.0..=8000.0).contains(&h) {
        bail!("--size {text}: each side must be within 100..8000");
    }
    Ok(egui::vec2(w, h))
}

/// Smallest and largest `--scale`.
const SCALES: std::ops::RangeInclusive<f32> = 0.25..=4.0;

/// The side of the largest texture wgpu guarantees on every device (`max_texture_dimension_2d`
/// of its default limits); a larger screenshot would make wgpu panic.
const MAX_PIXELS_PER_SIDE: f32 = 8192.0;

/// `--scale`: a finite number within [`SCALES`]; 0, negative, NaN and infinite values would
/// reach wgpu as texture sizes it panics on.
fn parse_scale(text: &str) -> Result<f32, String> {
    let scale: f32 = text.trim().parse().map_err(|_| format!("'{text}' is not a number"))?;
    if !SCALES.contains(&scale) {
        return Err(format!("{scale} is outside {}..={}", SCALES.start(), SCALES.end()));
    }
    Ok(scale)
}

/// The screenshot's size in pixels must fit a texture.
fn check_pixels(size: egui::Vec2, scale: f32) -> anyhow::Result<()> {
    let (w, h) = (size.x * scale, size.y * scale);
    if w.ceil() > MAX_PIXELS_PER_SIDE || h.ceil() > MAX_PIXELS_PER_SIDE {
        bail!(
            "--size {}x{} at --scale {scale} is {w}x{h} pixels: at most {MAX_PIXELS_PER_SIDE} a side",
            size.x,
            size.y
        );
    }
    Ok(())
}

/// Runs `cachalot view`.
pub fn run(args: &ViewArgs) -> Outcome {
    let size = parse_size(&args.size).map_err(Failure::input)?;
    if args.screenshot.is_some() {
        check_pixels(size, args.scale).map_err(Failure::input)?;
    }
    if let (true, Some(out)) = (args.bench, &args.bench_trace) {
        let bytes = generate_trace(args.bench_entries).map_err(|e| Failure::input(anyhow!(e)))?;
        std::fs::write(out, bytes).map_err(|e| Failure::input(anyhow!("{}: {e}", out.display())))?;
        println!("wrote {}", out.display());
        return Ok(());
    }
    if args.bench {
        let report = bench(args.bench_entries, args.bench_frames, size).map_err(|e| Failure::input(anyhow!(e)))?;
        for line in report.lines() {
            println!("{line}");
        }
        return Ok(());
    }
    let view = View::from_name(&args.view).ok_or_else(|| {
        Failure::input(anyhow!("--view {}: expected segments, pools, stats, events or compare", args.view))
    })?;
    let mut app = ViewerApp::new().with_experiments(default_experiments());
    for file in &args.files {
        app.open_path(file);
    }
    match &args.screenshot {
        Some(out) => {
            if args.files.is_empty() {
                return Err(Failure::input(anyhow!("--screenshot needs a file to show")));
            }
            app.wait_for_loads();
            if let Some(notice) = app.notices.iter().find(|n| n.error) {
                eprintln!("cachalot: {}", notice.text);
            }
            if app.tabs.is_empty() {
                return Err(Failure::input(anyhow!("nothing could be opened")));
            }
            if view == View::SideBySide && app.tabs.len() >= 2 {
                app.side_by_side.a = 0;
                app.side_by_side.b = 1;
            }
            let options = ScreenshotOptions { size, view, cursor: args.cursor, pixels_per_point: args.scale };
            screenshot(app, &options, out).map_err(|e| Failure::input(anyhow!(e)))?;
            println!("wrote {}", out.display());
            Ok(())
        }
        None => {
            app.view = view;
            run_window(app, args.renderer).map_err(|e| Failure::input(anyhow!("cannot open a window: {e}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_and_size_are_checked_before_wgpu() {
        assert_eq!(parse_scale("2"), Ok(2.0));
        for bad in ["0", "-1", "NaN", "inf", "6", "x"] {
            assert!(parse_scale(bad).is_err(), "{bad}");
        }
        assert!(check_pixels(egui::vec2(1400.0, 900.0), 4.0).is_ok());
        let err = check_pixels(egui::vec2(8000.0, 900.0), 2.0).unwrap_err();
        assert!(err.to_string().contains("at most 8192"), "{err}");
    }
}
