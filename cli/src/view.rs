//! `cachalot view [FILE...]`: the pool viewer. `--screenshot out.png` renders it headless
//! (egui_kittest through wgpu, e.g. on Mesa's lavapipe) instead of opening a window;
//! `--bench` measures opening a 3-million-entry trace and dragging the cursor across it.
//! Several files open as the ranks of one job, aligned by step (the Ranks tab).
//!
//! `cachalot view --run EXPERIMENT [--backend ...] [experiment flags]` runs an experiment of
//! `cachalot run` (same experiments, flags and device options) live in the window: its
//! allocator events stream in as they happen (see `cachalot_viewer::live::device_runs`). With
//! `--screenshot` it runs headless and pictures the end (and, with `--mid-screenshot`, the
//! run held at `--mid-event`), prints what it checked, and saves the run to `--out`.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use cachalot_viewer::live::default_experiments;
use cachalot_viewer::live::device_runs::{RuntimeExperiment, runtime_experiments};
use cachalot_viewer::live::save::{SaveFormat, run_bytes};
use cachalot_viewer::model::Verification;
use cachalot_viewer::native::{
    LiveShots, ScreenshotOptions, WindowRenderer, bench, bench_live, generate_trace, live_screenshots, run_window,
    screenshot,
};
use cachalot_viewer::{View, ViewerApp};

use crate::failure::{Failure, Outcome};
use crate::run::{ExperimentCommand, RunOptions, experiment};

/// Arguments of `cachalot view`.
#[derive(Clone, Debug, clap::Args)]
pub struct ViewArgs {
    /// Files to open: cachalot snapshots (.json), PyTorch snapshot pickles, op files.
    pub files: Vec<PathBuf>,
    /// Render headless into this PNG instead of opening a window.
    #[arg(long, global = true, value_name = "PNG")]
    pub screenshot: Option<PathBuf>,
    /// Panel under the timeline: segments, memory, pools, stats, events, compare, tune,
    /// explain (the first out-of-memory error, with the fix search) or ranks (the files as the
    /// ranks of one job, aligned by step). Default: segments, or ranks when several files are
    /// given.
    #[arg(long, global = true)]
    pub view: Option<String>,
    /// Replay the first file (a PyTorch trace) under cachalot's own policy (policy:cachalot,
    /// with the trace's other settings, memory fraction and device) and show the replay beside
    /// the trace in Compare, with the peak reserved of each and their ratio.
    #[arg(long, global = true)]
    pub compare_policy: bool,
    /// Cursor position (entries applied) for the screenshot; default: the run's peak of
    /// allocated memory (a live run: its last entry).
    #[arg(long, global = true)]
    pub cursor: Option<usize>,
    /// Screenshot size in points, WIDTHxHEIGHT.
    #[arg(long, global = true, default_value = "1400x900")]
    pub size: String,
    /// Pixels per point of the screenshot, from 0.25 to 4 (the picture must also stay within
    /// the 8192-pixel textures every wgpu device supports).
    #[arg(long, global = true, default_value_t = 1.0, value_parser = parse_scale)]
    pub scale: f32,
    /// What draws the window: auto (wgpu on a GPU; OpenGL where wgpu finds only a software
    /// rasterizer, which runs it several times faster), wgpu or glow.
    #[arg(long, global = true, default_value = "auto")]
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
    /// Measure a live run: an op file replayed on the simulator unwatched and watched by the
    /// app (frames at 60 per second), in alternating rounds: the slowdown and the frame times.
    #[arg(long)]
    pub bench_live: bool,
    /// Operations of the --bench-live op file.
    #[arg(long, default_value_t = 2_000_000)]
    pub bench_ops: usize,
    /// Rounds of --bench-live.
    #[arg(long, default_value_t = 3)]
    pub bench_rounds: usize,
    /// With --bench-live: run the op file at this many ops per second (0: as fast as it goes).
    #[arg(long, default_value_t = 0)]
    pub bench_pace: u64,
    /// Run EXPERIMENT (seeds, mlp-train, matmul-sweep, ops FILE; flags as for `cachalot run`)
    /// live: its allocator events stream into the window as they happen. With --screenshot,
    /// --out saves the run when it ends (a .pickle name: as a PyTorch snapshot pickle); in the
    /// window, Save… does.
    #[arg(long)]
    pub run: bool,
    /// The experiment of --run.
    #[command(subcommand)]
    pub experiment: Option<ExperimentCommand>,
    /// The device of --run and where its snapshot goes.
    #[command(flatten)]
    pub run_options: RunOptions,
    /// With --run and --screenshot: also a picture mid-run, the experiment held once it has
    /// sent --mid-event entries and the cursor there.
    #[arg(long, value_name = "PNG", global = true, requires = "mid_event")]
    pub mid_screenshot: Option<PathBuf>,
    /// The entry of --mid-screenshot.
    #[arg(long, value_name = "N", global = true)]
    pub mid_event: Option<u64>,
    /// With --run and --screenshot: the longest the run may take, in seconds.
    #[arg(long, default_value_t = 600, global = true)]
    pub run_timeout: u64,
}

/// `--size WIDTHxHEIGHT`; an error names the flag and quotes the value (at most its first
/// [`cachalot_core::error::QUOTED_BYTES`] bytes).
fn parse_size(text: &str) -> anyhow::Result<egui::Vec2> {
    let quoted = cachalot_core::error::shorten(text);
    let expected = || anyhow!("--size {quoted}: expected WIDTHxHEIGHT, two numbers of points (e.g. 1400x900)");
    let (w, h) = text.split_once('x').ok_or_else(expected)?;
    let side = |s: &str| s.trim().parse::<f32>().ok().filter(|v| v.is_finite());
    let (Some(w), Some(h)) = (side(w), side(h)) else { return Err(expected()) };
    if !(100.0..=8000.0).contains(&w) || !(100.0..=8000.0).contains(&h) {
        bail!("--size {quoted}: each side must be within 100..8000");
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
    let scale: f32 =
        text.trim().parse().map_err(|_| format!("'{}' is not a number", cachalot_core::error::shorten(text)))?;
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

/// The experiment of `--run`, if one was asked for.
fn live_experiment(args: &ViewArgs) -> anyhow::Result<Option<RuntimeExperiment>> {
    match (&args.experiment, args.run) {
        (Some(command), true) => {
            Ok(Some(RuntimeExperiment::new(experiment(command)?, args.run_options.device_options()?)))
        }
        (Some(_), false) => bail!("an experiment to run live needs --run before it (cachalot view --run seeds)"),
        (None, true) => bail!("--run needs an experiment: seeds, mlp-train, matmul-sweep or ops FILE"),
        (None, false) => {
            if args.mid_screenshot.is_some() {
                bail!("--mid-screenshot needs a live run (--run EXPERIMENT)");
            }
            Ok(None)
        }
    }
}

/// A live run rendered headless: the pictures, what the window's model checked, the saved run.
fn live_headless(
    mut app: ViewerApp,
    live: &RuntimeExperiment,
    args: &ViewArgs,
    size: egui::Vec2,
    view: View,
    out: &Path,
) -> Outcome {
    // Started here rather than queued, so that a run that cannot start is an error of this command.
    let hold = args.mid_screenshot.as_ref().map(|_| args.mid_event.unwrap_or(0));
    let started = live.start_held(&args.run_options.backend, &egui::Context::default(), hold);
    app.add_live(started.map_err(|e| Failure::input(anyhow!(e)))?);
    let shots = LiveShots {
        options: ScreenshotOptions { size, view, cursor: args.cursor, pixels_per_point: args.scale },
        mid: args.mid_screenshot.clone().map(|p| (args.mid_event.unwrap_or(0), p)),
        end: out.to_path_buf(),
        timeout: std::time::Duration::from_secs(args.run_timeout),
    };
    let (app, report) = live_screenshots(app, &shots).map_err(|e| Failure::input(anyhow!(e)))?;
    for notice in &app.notices {
        println!("{}: {}", if notice.error { "error" } else { "note" }, notice.text);
    }
    let tab = app.active_tab().ok_or_else(|| Failure::input(anyhow!("no run was started")))?;
    let run = &tab.run;
    println!("live run: {}", run.name);
    if let (Some((cursor, running)), Some(path)) = (report.mid, &args.mid_screenshot) {
        let when = if running { "while the experiment was held there" } else { "after the run had ended" };
        println!("wrote {} (cursor at entry {cursor}, {when})", path.display());
    }
    println!("wrote {} ({} entries)", out.display(), report.entries);
    if !run.marks.is_empty() {
        println!("marks the window received (memory_allocated / memory_reserved):");
        for m in &run.marks {
            println!("  {:<20} {:>15} {:>15}", m.label, m.allocated, m.reserved);
        }
    }
    let verified = match &run.verification {
        Verification::Matches { segments, blocks } => {
            println!("end state: the window's rebuilt state matches the run's ({segments} segments, {blocks} blocks)");
            true
        }
        Verification::Differs(why) => {
            println!("end state: DIFFERS from the run's: {why}");
            false
        }
        Verification::Unavailable => {
            println!("end state: none received (the run did not finish)");
            false
        }
    };
    if let Some(path) = &args.run_options.out {
        let format = if path.extension().is_some_and(|e| e == "pickle") {
            SaveFormat::TorchPickle
        } else {
            SaveFormat::Cachalot
        };
        let bytes = run_bytes(run, tab.end_snapshot.as_deref(), format).map_err(|e| Failure::input(anyhow!(e)))?;
        cachalot_trace::output::write_atomic(path, &bytes).map_err(|e| Failure::input(anyhow!(e)))?;
        println!("saved the run: {}", path.display());
    }
    if !verified || app.notices.iter().any(|n| n.error) {
        return Err(Failure { status: 1, error: anyhow!("the live run did not end as it should") });
    }
    Ok(())
}

/// Runs `cachalot view`.
pub fn run(args: &ViewArgs) -> Outcome {
    let size = parse_size(&args.size).map_err(Failure::input)?;
    if args.screenshot.is_some() || args.mid_screenshot.is_some() {
        check_pixels(size, args.scale).map_err(Failure::input)?;
    }
    if let (true, Some(out)) = (args.bench, &args.bench_trace) {
        let bytes = generate_trace(args.bench_entries).map_err(|e| Failure::input(anyhow!(e)))?;
        cachalot_trace::output::write_atomic(out, &bytes).map_err(|e| Failure::input(anyhow!(e)))?;
        println!("wrote {}", out.display());
        return Ok(());
    }
    if args.bench_live {
        let report = bench_live(args.bench_ops, args.bench_pace, args.bench_rounds, size)
            .map_err(|e| Failure::input(anyhow!(e)))?;
        for line in report.lines() {
            println!("{line}");
        }
        return Ok(());
    }
    if args.bench {
        let report = bench(args.bench_entries, args.bench_frames, size).map_err(|e| Failure::input(anyhow!(e)))?;
        for line in report.lines() {
            println!("{line}");
        }
        return Ok(());
    }
    let view = match &args.view {
        Some(name) => View::from_name(name).ok_or_else(|| {
            let names: Vec<String> = View::ALL.iter().map(|v| v.title().to_lowercase()).collect();
            Failure::input(anyhow!("--view {name}: expected one of {}", names.join(", ")))
        })?,
        // Several files on the command line are most often the ranks of one job.
        None if args.files.len() > 1 => View::Ranks,
        None => View::Segments,
    };
    let live = live_experiment(args).map_err(Failure::input)?;
    let device_options = args.run_options.device_options_unchecked().map_err(Failure::input)?;
    let mut app = ViewerApp::new();
    if let Some(live) = &live {
        app = app.with_experiments(vec![Box::new(live.clone())]);
    }
    app = app.with_experiments(runtime_experiments(&device_options)).with_experiments(default_experiments());
    for file in &args.files {
        app.open_path(file);
    }
    if args.compare_policy {
        if args.files.is_empty() {
            return Err(Failure::input(anyhow!("--compare-policy needs a PyTorch trace to replay")));
        }
        app.compare_policies_when_loaded();
    }
    // The comparison is shown in Compare.
    let view = if args.compare_policy { View::SideBySide } else { view };
    if let (Some(live), Some(out)) = (&live, &args.screenshot) {
        app.view = view;
        return live_headless(app, live, args, size, view, out);
    }
    if live.is_some() {
        // The experiment the command line named is offered first.
        app.start_experiment(0, args.run_options.backend.clone());
    }
    match &args.screenshot {
        Some(out) => {
            if args.files.is_empty() {
                return Err(Failure::input(anyhow!("--screenshot needs a file to show")));
            }
            let options = ScreenshotOptions { size, view, cursor: args.cursor, pixels_per_point: args.scale };
            let app = screenshot(app, &options, out).map_err(|e| Failure::input(anyhow!(e)))?;
            for notice in app.notices.iter().filter(|n| n.error) {
                eprintln!("cachalot: {}", notice.text);
            }
            // The process ends here: freeing the runs (millions of entries, thousands of
            // checkpoints) piece by piece took about a second on the 3M-entry trace; the system
            // takes the memory back at once.
            std::mem::forget(app);
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
        assert_eq!(parse_size("1400x900").unwrap(), egui::vec2(1400.0, 900.0));
        for bad in ["1400x900x3", "1400", "x900", "1400xNaN", "ax1"] {
            let err = parse_size(bad).unwrap_err().to_string();
            assert!(err.starts_with(&format!("--size {bad}: expected WIDTHxHEIGHT")), "{err}");
        }
        let err = parse_size(&format!("1x{}", "9".repeat(1 << 20))).unwrap_err().to_string();
        assert!(err.len() < 250 && err.contains("(1,048,578 bytes)"), "{err}");
    }
}
