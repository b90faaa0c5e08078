//! Native-only parts: the window, headless screenshots (egui_kittest through wgpu, e.g. on
//! Mesa's lavapipe) of files and of live runs, and the benchmark.

mod live_bench;
mod live_shots;
mod renderer;

use std::cell::Cell;
use std::path::Path;

pub use live_bench::{LiveBenchReport, LiveBenchRound, bench_live, live_bench_ops};
pub use live_shots::{LiveShots, LiveShotsReport, live_screenshots};
pub use renderer::{WindowRenderer, auto_renderer, is_software_gl, wgpu_adapters};

use crate::app::ViewerApp;
use crate::tabs::View;

/// Prints frames per second and the slowest frame every two seconds (with
/// `CACHALOT_FRAME_STATS=1`), to check how the window keeps up on a given machine; each report
/// ends with the seconds it covers and when they ended (seconds since the Unix epoch).
struct FrameStats {
    app: ViewerApp,
    window_start: web_time::Instant,
    last_frame: web_time::Instant,
    frames: u32,
    slowest: f64,
}

impl eframe::App for FrameStats {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        let now = web_time::Instant::now();
        self.slowest = self.slowest.max(now.duration_since(self.last_frame).as_secs_f64());
        self.last_frame = now;
        self.frames += 1;
        let elapsed = now.duration_since(self.window_start).as_secs_f64();
        if elapsed >= 2.0 {
            // A live run: how far it has come, so that its rate shows beside the frame rate.
            let live = match self.app.active_tab() {
                Some(tab) if tab.live.is_some() => format!(", live run: {} entries", tab.run.trace.len()),
                _ => String::new(),
            };
            // When the two seconds ended, on the wall clock, so that a script driving the window
            // (scripts/dev/window-fps.sh) can keep the reports that fall inside its mouse drag.
            let until =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            eprintln!(
                "cachalot: {:.1} frames/s, slowest frame interval {:.1} ms{live} ({elapsed:.2} s until {until:.3})",
                f64::from(self.frames) / elapsed,
                self.slowest * 1000.0
            );
            self.window_start = now;
            self.frames = 0;
            self.slowest = 0.0;
        }
        self.app.ui(ui, frame);
        // A report every two seconds even while nothing else asks for a frame.
        ui.ctx().request_repaint_after(std::time::Duration::from_secs(2));
    }
}

/// Opens the window (blocks until it is closed), drawn by `renderer`. With
/// [`WindowRenderer::Auto`] the choice and its reason are printed when it is not wgpu, and if
/// OpenGL cannot start the window opens with wgpu instead.
pub fn run_window(app: ViewerApp, renderer: WindowRenderer) -> Result<(), String> {
    if let Some(missing) = missing_display() {
        return Err(missing);
    }
    let first = match renderer {
        WindowRenderer::Auto => {
            let (first, why) = auto_renderer(&wgpu_adapters());
            if let Some(why) = why {
                eprintln!("cachalot: {why}");
            }
            first
        }
        chosen => chosen,
    };
    let app = Cell::new(Some(app));
    match open_window(&app, first) {
        Err(e) if renderer == WindowRenderer::Auto && first == WindowRenderer::Glow => match app.take() {
            // OpenGL failed before the app was handed over: try wgpu with it.
            Some(unused) => {
                eprintln!("cachalot: OpenGL did not start ({e}); drawing the window with wgpu");
                open_window(&Cell::new(Some(unused)), WindowRenderer::Wgpu)
            }
            None => Err(e),
        },
        result => result,
    }
}

/// Why no window can open here, if so: on Linux and the BSDs, a window needs an X11 or Wayland
/// display, and without one winit fails with an error that names neither the cause nor what to do.
fn missing_display() -> Option<String> {
    if !cfg!(all(unix, not(target_os = "macos"), not(target_os = "ios"), not(target_os = "android"))) {
        return None;
    }
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    if set("DISPLAY") || set("WAYLAND_DISPLAY") || set("WAYLAND_SOCKET") {
        return None;
    }
    Some(
        "no display (neither DISPLAY nor WAYLAND_DISPLAY is set): render a picture with \
         `cachalot view FILE --screenshot out.png`, or open the viewer in a browser with `cachalot serve`"
            .to_owned(),
    )
}

/// Runs eframe with `renderer` (wgpu or glow) on the app in `slot`.
fn open_window(slot: &Cell<Option<ViewerApp>>, renderer: WindowRenderer) -> Result<(), String> {
    let stats = std::env::var_os("CACHALOT_FRAME_STATS").is_some_and(|v| v != "0");
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default().with_inner_size([1400.0, 900.0]).with_title("cachalot"),
        renderer: match renderer {
            WindowRenderer::Glow => eframe::Renderer::Glow,
            WindowRenderer::Wgpu | WindowRenderer::Auto => eframe::Renderer::Wgpu,
        },
        ..Default::default()
    };
    eframe::run_native(
        "cachalot",
        options,
        Box::new(move |cc| -> Result<Box<dyn eframe::App>, _> {
            let mut app = slot.take().ok_or("the window was opened twice")?;
            ViewerApp::setup(&cc.egui_ctx);
            app.software_rendering = software_rasterized(cc);
            if stats {
                let now = web_time::Instant::now();
                return Ok(Box::new(FrameStats { app, window_start: now, last_frame: now, frames: 0, slowest: 0.0 }));
            }
            Ok(Box::new(app))
        }),
    )
    .map_err(|e| e.to_string())
}

/// Whether the window's renderer runs on the CPU: wgpu's adapter says so by its type, OpenGL
/// by its `GL_RENDERER` string.
fn software_rasterized(cc: &eframe::CreationContext<'_>) -> bool {
    if let Some(render_state) = &cc.wgpu_render_state {
        return render_state.adapter.get_info().device_type == eframe::wgpu::DeviceType::Cpu;
    }
    cc.gl.as_ref().is_some_and(|gl| {
        use eframe::glow::HasContext as _;
        // SAFETY: eframe calls the app creator with its OpenGL context current on this
        // thread, and GL_RENDERER is a valid name for glGetString.
        let name = unsafe { gl.get_parameter_string(eframe::glow::RENDERER) };
        is_software_gl(&name)
    })
}

/// What a screenshot shows.
#[derive(Clone, Debug)]
pub struct ScreenshotOptions {
    /// Window size in points.
    pub size: egui::Vec2,
    /// Which panel.
    pub view: View,
    /// Cursor position of every run (default: each run's peak of allocated memory).
    pub cursor: Option<usize>,
    /// Pixels per point.
    pub pixels_per_point: f32,
}

impl Default for ScreenshotOptions {
    fn default() -> Self {
        ScreenshotOptions { size: egui::vec2(1400.0, 900.0), view: View::Segments, cursor: None, pixels_per_point: 1.0 }
    }
}

/// A headless harness around `app`, rendering through wgpu (it prefers a CPU adapter such as
/// lavapipe, so pictures are the same on every machine with it). With `strict_glyphs`, text
/// that no font can draw panics (for tests of our own labels); else it shows as boxes, as in
/// the app (stack frames may hold any text).
pub fn harness(
    app: ViewerApp,
    size: egui::Vec2,
    pixels_per_point: f32,
    strict_glyphs: bool,
) -> egui_kittest::Harness<'static, ViewerApp> {
    let builder = egui_kittest::Harness::builder();
    // Screenshots of arbitrary files must not fail on text or widgets the tests never saw.
    let builder = if strict_glyphs { builder } else { builder.allow_missing_glyphs().with_accessibility_check(false) };
    builder.with_size(size).with_pixels_per_point(pixels_per_point).with_max_steps(16).wgpu().build_eframe(|cc| {
        ViewerApp::setup(&cc.egui_ctx);
        app
    })
}

/// Renders `app` headless and writes a PNG, once the files it is loading are loaded; returns
/// the app. Fails if nothing could be opened (the message says why).
///
/// The renderer starts while the files load on their threads, and draws one frame of the
/// loading window then: starting wgpu on lavapipe and compiling its shaders for the first
/// picture take most of a second, which used to come after the load.
pub fn screenshot(app: ViewerApp, options: &ScreenshotOptions, out: &Path) -> Result<ViewerApp, String> {
    let mut harness = harness(app, options.size, options.pixels_per_point, false);
    harness.step();
    harness.render()?;
    let app = harness.state_mut();
    app.wait_for_loads();
    if app.tabs.is_empty() {
        let errors: Vec<&str> = app.notices.iter().filter(|n| n.error).map(|n| n.text.as_str()).collect();
        return Err(match errors.is_empty() {
            true => "nothing could be opened".into(),
            false => format!("nothing could be opened: {}", errors.join("; ")),
        });
    }
    app.view = options.view;
    if options.view == View::SideBySide && app.tabs.len() >= 2 {
        app.side_by_side.a = 0;
        app.side_by_side.b = 1;
    }
    if let Some(cursor) = options.cursor {
        for tab in &mut app.tabs {
            tab.cursor = cursor.min(tab.run.end());
        }
    }
    if options.view == View::Tune {
        // The picture of the Tune tab is of its search's result.
        app.tune_shown_run();
    }
    if options.view == View::Explain {
        // The picture of the Explain tab is of its whole answer, the fix search's included.
        app.explain_shown_run(options.cursor.is_none());
    }
    // A few frames: panels settle their sizes and the plot its bounds.
    harness.run_steps(4);
    let image = harness.render()?;
    save_png(&image, out)?;
    Ok(harness.into_state())
}

/// Writes `image` to `path` as a PNG, whole or not at all ([`cachalot_trace::output`]): a
/// failed write leaves the previous file at `path` as it was.
pub fn save_png(image: &image::RgbaImage, path: &Path) -> Result<(), String> {
    cachalot_trace::output::write_atomic_with(path, |w| {
        image
            .write_with_encoder(image::codecs::png::PngEncoder::new(w))
            .map_err(|e| std::io::Error::other(e.to_string()))
    })
    .map_err(|e| e.to_string())
}

/// Benchmark results.
#[derive(Clone, Debug)]
pub struct BenchReport {
    /// Trace entries.
    pub entries: usize,
    /// Bytes of the snapshot file.
    pub file_bytes: usize,
    /// Seconds to read, parse and build the run.
    pub open_seconds: f64,
    /// Checkpoints kept.
    pub checkpoints: usize,
    /// Per-frame seconds while the cursor is dragged across the run (UI pass + tessellation).
    pub frame_seconds: Vec<f64>,
    /// Per-frame seconds of random jumps.
    pub jump_seconds: Vec<f64>,
    /// Most segments and blocks at a cursor position visited.
    pub largest_state: (usize, usize),
    /// Per-frame seconds of a cursor drag including rendering through wgpu (lavapipe without a
    /// GPU), if an adapter was found.
    pub rendered_seconds: Vec<f64>,
    /// Seconds of the first frame of the Memory view: the allocations' lifetimes found, the
    /// Active Memory Timeline laid out, the peak analysis at the cursor.
    pub memory_first_seconds: f64,
    /// Per-frame seconds while the cursor is dragged in the Memory view (the picture cached).
    pub memory_drag_seconds: Vec<f64>,
    /// Per-frame seconds while the Memory view zooms in and pans (a new layout every frame).
    pub memory_zoom_seconds: Vec<f64>,
}

impl BenchReport {
    fn percentile(v: &[f64], p: f64) -> f64 {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0)
    }

    /// Human-readable lines.
    pub fn lines(&self) -> Vec<String> {
        let ms = |s: f64| s * 1000.0;
        let fps = |v: &[f64]| 1.0 / (v.iter().sum::<f64>() / v.len().max(1) as f64);
        let frames = |label: &str, v: &[f64]| {
            format!(
                "{label}: {} frames, median {:.1} ms, p95 {:.1} ms, max {:.1} ms ({:.0} frames/s)",
                v.len(),
                ms(Self::percentile(v, 0.5)),
                ms(Self::percentile(v, 0.95)),
                ms(Self::percentile(v, 1.0)),
                fps(v)
            )
        };
        vec![
            format!(
                "trace: {} entries, {:.1} MB snapshot file, {} checkpoints",
                crate::format::count(self.entries as u64),
                self.file_bytes as f64 / 1e6,
                self.checkpoints
            ),
            format!("open (read + parse + rebuild): {:.2} s", self.open_seconds),
            format!(
                "largest state visited: {} segments, {} blocks",
                crate::format::count(self.largest_state.0 as u64),
                crate::format::count(self.largest_state.1 as u64)
            ),
            frames("cursor drag", &self.frame_seconds),
            frames("random jumps", &self.jump_seconds),
            format!(
                "memory view, first frame (lifetimes + layout + peak analysis): {:.0} ms",
                ms(self.memory_first_seconds)
            ),
            frames("memory view, cursor drag", &self.memory_drag_seconds),
            frames("memory view, zoom and pan (new layout each frame)", &self.memory_zoom_seconds),
            if self.rendered_seconds.is_empty() {
                "rendered drag: no wgpu adapter".to_owned()
            } else {
                format!(
                    "rendered drag (wgpu, 1 px per point): {} frames, median {:.1} ms, p95 {:.1} ms ({:.0} frames/s)",
                    self.rendered_seconds.len(),
                    ms(Self::percentile(&self.rendered_seconds, 0.5)),
                    ms(Self::percentile(&self.rendered_seconds, 0.95)),
                    fps(&self.rendered_seconds)
                )
            },
        ]
    }
}

/// Generates a trace of about `entries` entries on the simulator (a training-like loop with
/// stacks, two streams and periodic `empty_cache`), as a cachalot snapshot file.
pub fn generate_trace(entries: usize) -> Result<Vec<u8>, String> {
    use cachalot_core::{AllocatorConfig, CachingAllocator, Frame, SimBackend, StreamId};
    use cachalot_trace::Snapshot;
    let mut a =
        CachingAllocator::new(SimBackend::new(80 << 30), AllocatorConfig::default()).map_err(|e| e.to_string())?;
    a.record_history(true, usize::MAX, &[], false);
    let stacks: Vec<_> = (0..64)
        .map(|i| {
            a.intern_context(&[
                Frame { filename: "model.py".into(), line: 10 + i, name: format!("layer{i}.forward").into() },
                Frame { filename: "train.py".into(), line: 42, name: "step".into() },
            ])
        })
        .collect();
    let mut live: Vec<cachalot_core::Allocation> = Vec::new();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut step = 0u64;
    while (a.trace_len_total() as usize) < entries {
        step += 1;
        // A step: grow activations, then free most of them in a shuffled order.
        let n = 200 + next() % 200;
        for _ in 0..n {
            let r = next();
            let size = match r % 10 {
                0..=4 => 1 + r % (1 << 20),
                5..=8 => (1 << 20) + r % (24 << 20),
                _ => (64 << 20) + r % (256 << 20),
            };
            a.set_context(Some(stacks[(r >> 8) as usize % stacks.len()]));
            match a.malloc(size, StreamId(r >> 60 & 1)) {
                Ok(x) => live.push(x),
                Err(_) => {
                    for x in live.drain(..) {
                        a.free(x).map_err(|e| e.to_string())?;
                    }
                }
            }
        }
        // Keep half: the live set grows until the device is full, an allocation fails and
        // everything is freed — thousands of live blocks and a fragmented cache on the way.
        let keep = live.len() / 2;
        while live.len() > keep {
            let i = next() as usize % live.len();
            a.free(live.swap_remove(i)).map_err(|e| e.to_string())?;
        }
        if step.is_multiple_of(50) {
            a.empty_cache().map_err(|e| e.to_string())?;
        }
    }
    Ok(Snapshot::capture(&a, format!("benchmark trace of {entries} entries")).to_json())
}

/// Measures how long a trace of `entries` entries takes to open, and frame times while the
/// cursor is dragged across it and jumps around, at `size` points.
pub fn bench(entries: usize, frames: usize, size: egui::Vec2) -> Result<BenchReport, String> {
    let bytes = generate_trace(entries)?;
    let dir = std::env::temp_dir().join(format!("cachalot-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let path = dir.join("bench.json");
    cachalot_trace::output::write_atomic(&path, &bytes).map_err(|e| e.to_string())?;
    let file_bytes = bytes.len();
    drop(bytes);

    let started = web_time::Instant::now();
    let data = std::fs::read(&path).map_err(|e| e.to_string())?;
    let runs =
        crate::load::load_bytes("bench.json", &data, &crate::load::Progress::default()).map_err(|e| e.to_string())?;
    let open_seconds = started.elapsed().as_secs_f64();
    drop(data);
    let _ = std::fs::remove_dir_all(&dir);

    let mut app = ViewerApp::new();
    app.add_runs(runs);
    let (end, checkpoints) = app.active_tab().map_or((0, 0), |t| (t.run.end(), t.run.checkpoint_count()));
    let ctx = egui::Context::default();
    ViewerApp::setup(&ctx);
    let input = |t: f64| egui::RawInput {
        screen_rect: Some(egui::Rect::from_min_size(egui::Pos2::ZERO, size)),
        time: Some(t),
        ..Default::default()
    };
    let frame = |app: &mut ViewerApp, t: f64| {
        let started = web_time::Instant::now();
        let output = ctx.run_ui(input(t), |ui| app.show(ui));
        let _ = ctx.tessellate(output.shapes, output.pixels_per_point);
        started.elapsed().as_secs_f64()
    };
    // Warm up (first frame lays out fonts).
    for i in 0..3 {
        frame(&mut app, i as f64);
    }
    let mut frame_seconds = Vec::with_capacity(frames);
    let mut largest_state = (0, 0);
    for i in 0..frames {
        // A drag: the cursor moves steadily from start to end, as a mouse would.
        app.set_cursor(end * i / frames.max(1));
        frame_seconds.push(frame(&mut app, 3.0 + i as f64 / 60.0));
        if let Some(state) = app.active_tab().and_then(|t| t.cache.state()) {
            largest_state = largest_state.max((state.segments.len(), state.block_count));
        }
    }
    let mut jump_seconds = Vec::with_capacity(frames / 2);
    let mut rng = 12345u64;
    for i in 0..frames / 2 {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        app.set_cursor((rng >> 33) as usize % end.max(1));
        jump_seconds.push(frame(&mut app, 100.0 + i as f64 / 60.0));
    }
    // The Memory view: its first frame, a drag (cached picture), then zooming in to a hundredth
    // of the run and panning across it, a new layout every frame.
    app.view = View::Memory;
    let started = web_time::Instant::now();
    frame(&mut app, 200.0);
    let memory_first_seconds = started.elapsed().as_secs_f64();
    let mut memory_drag_seconds = Vec::with_capacity(frames);
    for i in 0..frames {
        app.set_cursor(end * i / frames.max(1));
        memory_drag_seconds.push(frame(&mut app, 201.0 + i as f64 / 60.0));
    }
    let mut memory_zoom_seconds = Vec::with_capacity(frames);
    let whole = (end + 1) as f64;
    for i in 0..frames {
        // Halfway: zoomed from the whole run to 1% of it; then panned over the rest.
        let t = i as f64 / frames.max(1) as f64;
        let (span, from) = if t < 0.5 {
            let span = whole * 0.01f64.powf(t * 2.0);
            (span, (whole - span) / 2.0)
        } else {
            (whole * 0.01, (t - 0.5) * 2.0 * whole * 0.99)
        };
        if let Some(tab) = app.active_tab_mut() {
            tab.memory.view = Some((from, from + span));
        }
        memory_zoom_seconds.push(frame(&mut app, 300.0 + i as f64 / 60.0));
    }
    app.view = View::Segments;
    // The same drag again, rendered: what a window on this machine would show per frame.
    let mut rendered_seconds = Vec::new();
    let rendered_frames = (frames / 5).max(10);
    // Drawn as a window on this machine would be: the harness prefers a CPU adapter.
    app.software_rendering = true;
    let mut harness = harness(app, size, 1.0, false);
    if harness.render().is_ok() {
        for i in 0..rendered_frames {
            let started = web_time::Instant::now();
            harness.state_mut().set_cursor(end * i / rendered_frames);
            harness.run_steps(1);
            if harness.render().is_err() {
                break;
            }
            rendered_seconds.push(started.elapsed().as_secs_f64());
        }
    }
    Ok(BenchReport {
        entries: end,
        file_bytes,
        open_seconds,
        checkpoints,
        frame_seconds,
        jump_seconds,
        largest_state,
        rendered_seconds,
        memory_first_seconds,
        memory_drag_seconds,
        memory_zoom_seconds,
    })
}
