//! The live-run benchmark (`cachalot view --bench-live`): an op file replayed on the simulator
//! (`cachalot run ops FILE --backend sim --no-compute`) unwatched and watched by the app, in
//! alternating rounds in one process, so the two times compare. While the watched run streams,
//! the app's frames (UI pass and tessellation, as in [`super::bench`]) run at 60 per second
//! on this thread, as a window's would, and each frame's work is timed.
//!
//! Reported: the run's op loop unwatched and watched (the runtime's own "ops" timing, the
//! same number `cachalot run ops` prints) and their ratio, the CPU time of the thread that ran
//! the run (the work being watched adds to the run itself, whatever else shares the cores),
//! the events per second the watched run streamed, and the frame times while it did.
//!
//! With a pace (`ops_per_second`), both runs sleep between steps to hold that rate, as a real
//! job's allocations come; the op loop's time then counts the work between the sleeps.

use std::time::{Duration, Instant};

use cachalot_runtime::experiments::OpsParams;
use cachalot_runtime::{BackendRequest, DeviceOptions, Experiment as RuntimeRun, execute};

use crate::app::ViewerApp;
use crate::live::channel;
use crate::live::device_runs::RuntimeExperiment;

/// A window's frame interval (60 frames per second).
const FRAME: Duration = Duration::from_micros(16_667);

/// One round: the same op file unwatched and watched.
#[derive(Clone, Debug)]
pub struct LiveBenchRound {
    /// Seconds of the unwatched run's op loop.
    pub unwatched_seconds: f64,
    /// Seconds of the watched run's op loop.
    pub watched_seconds: f64,
    /// CPU seconds of the thread that ran the unwatched run (the op file read, the op loop, the
    /// end).
    pub unwatched_cpu_seconds: f64,
    /// The same for the watched run.
    pub watched_cpu_seconds: f64,
    /// Wall seconds of the watched run, from its start to its end (sleeps of a paced run
    /// included).
    pub watched_wall_seconds: f64,
    /// Trace entries of the run.
    pub entries: usize,
    /// Seconds of work of every frame drawn while the run streamed (and until the app had
    /// taken in all of it).
    pub frame_seconds: Vec<f64>,
    /// Seconds from the first frame to the app holding the whole run.
    pub streamed_seconds: f64,
}

/// Results of [`bench_live`].
#[derive(Clone, Debug)]
pub struct LiveBenchReport {
    /// Operations of the op file.
    pub ops: usize,
    /// The pace of the runs in ops per second (0: as fast as they go).
    pub ops_per_second: u64,
    /// The rounds.
    pub rounds: Vec<LiveBenchRound>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0)
}

impl LiveBenchReport {
    /// Human-readable lines.
    pub fn lines(&self) -> Vec<String> {
        let ms = |s: f64| s * 1000.0;
        let pace = match self.ops_per_second {
            0 => "as fast as it goes".to_owned(),
            n => format!("paced at {n} ops/s"),
        };
        let mut lines = vec![format!(
            "op file: {} ops on the simulator (no kernels), {pace}, {} rounds",
            self.ops,
            self.rounds.len()
        )];
        for (i, r) in self.rounds.iter().enumerate() {
            let fps = r.frame_seconds.len() as f64 / r.streamed_seconds.max(1e-9);
            lines.push(format!(
                "round {}: op loop unwatched {:.3} s, watched {:.3} s (x{:.3}); run thread CPU {:.3} s, {:.3} s (x{:.3}); {:.0} events/s streamed; {} frames in {:.2} s ({:.0} frames/s), frame work median {:.1} ms, p95 {:.1} ms, max {:.1} ms",
                i + 1,
                r.unwatched_seconds,
                r.watched_seconds,
                r.watched_seconds / r.unwatched_seconds.max(1e-9),
                r.unwatched_cpu_seconds,
                r.watched_cpu_seconds,
                r.watched_cpu_seconds / r.unwatched_cpu_seconds.max(1e-9),
                r.entries as f64 / r.watched_wall_seconds.max(1e-9),
                r.frame_seconds.len(),
                r.streamed_seconds,
                fps,
                ms(percentile(&r.frame_seconds, 0.5)),
                ms(percentile(&r.frame_seconds, 0.95)),
                ms(percentile(&r.frame_seconds, 1.0)),
            ));
        }
        let ratio = median(self.rounds.iter().map(|r| r.watched_seconds / r.unwatched_seconds.max(1e-9)).collect());
        let cpu =
            median(self.rounds.iter().map(|r| r.watched_cpu_seconds / r.unwatched_cpu_seconds.max(1e-9)).collect());
        let rate = median(self.rounds.iter().map(|r| r.entries as f64 / r.watched_wall_seconds.max(1e-9)).collect());
        let frames: Vec<f64> = self.rounds.iter().flat_map(|r| r.frame_seconds.iter().copied()).collect();
        let fps =
            median(self.rounds.iter().map(|r| r.frame_seconds.len() as f64 / r.streamed_seconds.max(1e-9)).collect());
        lines.push(format!(
            "median: watched / unwatched = {ratio:.3} (op loop), {cpu:.3} (run thread CPU); {rate:.0} events/s streamed; {fps:.0} frames/s drawn (paced at 60), frame work p95 {:.1} ms (the UI could hold {:.0} frames/s)",
            ms(percentile(&frames, 0.95)),
            1.0 / percentile(&frames, 0.95).max(1e-9)
        ));
        lines
    }
}

/// Writes a deterministic op file of `ops` operations: sizes from 512 B to 8 MiB, up to 2,000
/// blocks live, freed in random order (the shape of `random-512B-64MiB.ops`, smaller blocks).
pub fn live_bench_ops(ops: usize) -> String {
    use std::fmt::Write as _;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut text = String::with_capacity(ops * 12);
    let mut live: Vec<usize> = Vec::new();
    let mut id = 0;
    for _ in 0..ops {
        let r = next();
        if live.len() < 2000 && (live.is_empty() || r % 2 == 0) {
            let size = 512u64 << ((r >> 8) % 15);
            let _ = writeln!(text, "a {id} {}", size + (r >> 24) % size);
            live.push(id);
            id += 1;
        } else {
            let victim = live.swap_remove((r >> 32) as usize % live.len());
            let _ = writeln!(text, "f {victim}");
        }
    }
    text
}

/// Runs the benchmark: an op file of `ops` operations run at `ops_per_second` (0: as fast as
/// it goes), `rounds` rounds, frames of `size` points.
pub fn bench_live(ops: usize, ops_per_second: u64, rounds: usize, size: egui::Vec2) -> Result<LiveBenchReport, String> {
    let dir = std::env::temp_dir().join(format!("cachalot-bench-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let path = dir.join("live.ops");
    cachalot_trace::output::write_atomic(&path, live_bench_ops(ops).as_bytes()).map_err(|e| e.to_string())?;
    let experiment = RuntimeRun::Ops(OpsParams { path: path.display().to_string(), mark_every: 0, ops_per_second });
    let options = DeviceOptions { backend: BackendRequest::Sim, compute: false, ..Default::default() };
    let result = (0..rounds.max(1)).map(|_| round(&experiment, &options, size)).collect::<Result<Vec<_>, _>>();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(LiveBenchReport { ops, ops_per_second, rounds: result? })
}

/// The op loop's seconds in a run's timings.
fn ops_seconds(timings: &[cachalot_trace::snapshot::Timing]) -> Result<f64, String> {
    timings
        .iter()
        .find(|t| t.label == "ops")
        .map(|t| t.seconds)
        .ok_or_else(|| "the run recorded no op loop time".into())
}

/// CPU seconds the calling thread has used.
fn thread_cpu_seconds() -> f64 {
    let mut time = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `time` is a valid timespec for the call to write; the thread's CPU clock always
    // exists on Linux (on failure `time` stays zero and the figure reads 0).
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
    time.tv_sec as f64 + time.tv_nsec as f64 * 1e-9
}

fn round(experiment: &RuntimeRun, options: &DeviceOptions, size: egui::Vec2) -> Result<LiveBenchRound, String> {
    let cpu = thread_cpu_seconds();
    let unwatched = execute(experiment, options).map_err(|e| e.to_string())?;
    let unwatched_cpu_seconds = thread_cpu_seconds() - cpu;
    let unwatched_seconds = ops_seconds(&unwatched.snapshot.timings)?;
    drop(unwatched);

    let ctx = egui::Context::default();
    ViewerApp::setup(&ctx);
    let mut app = ViewerApp::new();
    // The watched run on a thread of this benchmark (as `RuntimeExperiment::start` would run it),
    // so that the thread's CPU time can be read at its end.
    let (sender, live) = channel();
    let sender = sender.with_repaint(ctx.clone());
    let watched = RuntimeExperiment::new(experiment.clone(), options.clone());
    let worker = std::thread::Builder::new()
        .name("cachalot-live".into())
        .spawn(move || {
            let (cpu, wall) = (thread_cpu_seconds(), Instant::now());
            watched.run(BackendRequest::Sim, sender);
            (thread_cpu_seconds() - cpu, wall.elapsed().as_secs_f64())
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    app.add_live(live);
    let input = |t: f64| egui::RawInput {
        screen_rect: Some(egui::Rect::from_min_size(egui::Pos2::ZERO, size)),
        time: Some(t),
        ..Default::default()
    };
    let started = Instant::now();
    let mut frame_seconds = Vec::new();
    let mut next_frame = started;
    while app.has_live_runs() {
        let frame_start = Instant::now();
        let mut output = ctx.run_ui(input(frame_start.duration_since(started).as_secs_f64()), |ui| app.show(ui));
        let _ = ctx.tessellate(output.shapes, output.pixels_per_point);
        // No painter here uploads the font atlas.
        output.textures_delta.clear();
        frame_seconds.push(frame_start.elapsed().as_secs_f64());
        next_frame += FRAME;
        if let Some(wait) = next_frame.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        } else {
            next_frame = Instant::now();
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err("the watched run did not end in 10 minutes".into());
        }
    }
    let streamed_seconds = started.elapsed().as_secs_f64();
    let (watched_cpu_seconds, watched_wall_seconds) =
        worker.join().map_err(|_| "the watched run's thread panicked".to_owned())?;
    let tab = app.active_tab().ok_or("no run was started")?;
    let end = tab.end_snapshot.as_ref().ok_or_else(|| format!("the watched run failed: {:?}", app.notices))?;
    Ok(LiveBenchRound {
        unwatched_seconds,
        watched_seconds: ops_seconds(&end.timings)?,
        unwatched_cpu_seconds,
        watched_cpu_seconds,
        watched_wall_seconds,
        entries: tab.run.trace.len(),
        frame_seconds,
        streamed_seconds,
    })
}
