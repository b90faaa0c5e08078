//! The real window, on a virtual display (Xvfb): it opens with the renderer `--renderer auto`
//! picks, says why when that is not wgpu, and keeps drawing frames.
//!
//! Skips when Xvfb is not installed, unless `CACHALOT_REQUIRE_DISPLAY` is set (CI sets it).

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cachalot_viewer::native::{WindowRenderer, auto_renderer, wgpu_adapters};

/// An Xvfb server on a free display, stopped on drop.
struct VirtualDisplay {
    server: Child,
    display: String,
}

impl VirtualDisplay {
    /// Starts Xvfb, or returns None (with the reason printed) where it is not installed and the
    /// test may skip.
    fn start() -> Option<Self> {
        let spawned = Command::new("Xvfb")
            .args(["-displayfd", "1", "-screen", "0", "1600x1000x24"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn();
        let mut server = match spawned {
            Ok(server) => server,
            Err(e) if std::env::var_os("CACHALOT_REQUIRE_DISPLAY").is_none() => {
                eprintln!("skipped: Xvfb cannot be started ({e}); set CACHALOT_REQUIRE_DISPLAY=1 to fail instead");
                return None;
            }
            Err(e) => panic!("CACHALOT_REQUIRE_DISPLAY is set but Xvfb cannot be started: {e}"),
        };
        // Xvfb writes its display number once it accepts clients.
        let mut number = String::new();
        let mut byte = [0u8; 1];
        let stdout = server.stdout.as_mut().unwrap();
        while stdout.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
            number.push(byte[0] as char);
        }
        assert!(!number.is_empty(), "Xvfb did not report a display");
        Some(VirtualDisplay { server, display: format!(":{}", number.trim()) })
    }
}

impl Drop for VirtualDisplay {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

#[test]
fn the_window_opens_and_draws_with_the_renderer_auto_picks() {
    let Some(display) = VirtualDisplay::start() else { return };
    let log = std::env::temp_dir().join(format!("cachalot-window-test-{}.log", std::process::id()));
    let trace =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/traces/pytorch-2.11-h200/seeds.pickle");
    let mut app = Command::new(env!("CARGO_BIN_EXE_cachalot"))
        .arg("view")
        .arg(&trace)
        .env("DISPLAY", &display.display)
        .env("CACHALOT_FRAME_STATS", "1")
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // The app reports its frames every two seconds: wait for a report, or for it to exit.
    let started = Instant::now();
    let mut exited = None;
    while started.elapsed() < Duration::from_secs(60) {
        if let Some(status) = app.try_wait().unwrap() {
            exited = Some(status);
            break;
        }
        if std::fs::read_to_string(&log).unwrap_or_default().contains("frames/s") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = app.kill();
    let _ = app.wait();
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(exited.is_none(), "the viewer exited ({exited:?}):\n{output}");

    let report = output.lines().find(|l| l.contains("frames/s")).unwrap_or_else(|| panic!("no frames:\n{output}"));
    let fps: f64 = report.trim_start_matches("cachalot: ").split(' ').next().unwrap().parse().unwrap();
    assert!(fps > 0.0, "{report}");
    // The choice is announced exactly when it is not wgpu, and OpenGL was usable here (no
    // fallback), or the window would not be the fast one on this machine.
    let (expected, why) = auto_renderer(&wgpu_adapters());
    match expected {
        WindowRenderer::Glow => {
            assert!(output.contains(&why.unwrap()), "{output}");
            assert!(!output.contains("OpenGL did not start"), "{output}");
        }
        _ => assert!(!output.contains("drawing the window with"), "{output}"),
    }
}
