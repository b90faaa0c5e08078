//! The browser: eframe's web runner on a canvas, offering the simulator's experiments and
//! opening the files named in the page's address (`?open=trace.pickle&open=run.json`, fetched
//! from the same server). The file picker and dropped files are the app's loader's. Beside the
//! viewer, [`run`]'s window runs the experiments of `cachalot run` on the
//! visitor's GPU through WebGPU.

pub mod run;
mod warm;

use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

use crate::app::ViewerApp;
use crate::live::default_experiments;
use run::WebRuns;

/// The page's app: the viewer and the WebGPU runs' window over it.
struct WebApp {
    viewer: ViewerApp,
    runs: WebRuns,
    /// To wake the page up when a script starts a run.
    ctx: egui::Context,
}

impl eframe::App for WebApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        let drawn = |viewer: &ViewerApp| viewer.tabs.iter().filter(|t| t.timeline.plot_area.is_some()).count();
        let (tabs, drawn_before) = (self.viewer.tabs.len(), drawn(&self.viewer));
        self.viewer.show(ui);
        // Where a page load's time goes (`scripts/dev/web-test/bench.mjs` reads these).
        if self.viewer.tabs.len() > tabs {
            crate::loading::mark("cachalot tab added");
        }
        if drawn(&self.viewer) > drawn_before {
            crate::loading::mark("cachalot timeline drawn");
            // eframe paints this frame after `ui` returns, in the same animation-frame callback;
            // a microtask runs when that callback is over, so this mark is where the frame that
            // drew the timeline has been handed to the GPU (the native figure's end point).
            if let Some(window) = web_sys::window() {
                let painted = Closure::once_into_js(|| crate::loading::mark("cachalot timeline painted"));
                window.queue_microtask(painted.unchecked_ref());
            }
        }
        if self.viewer.host_button_clicked() {
            self.runs.show_window();
        }
        if let Some(run) = self.runs.window(ui.ctx()) {
            self.viewer.add_live(run);
        }
        // The Compare tab's analysis against an expected.json goes on while another view is
        // shown (the tab polls it itself when shown).
        if self.viewer.view != crate::tabs::View::SideBySide {
            self.viewer.side_by_side.expected.reasons.poll(ui.ctx());
        }
    }

    fn clear_color(&self, visuals: &egui::Visuals) -> [f32; 4] {
        visuals.panel_fill.to_normalized_gamma_f32()
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(&mut *self)
    }
}

/// The `open=` parameters of the page's address.
fn requested_files() -> Vec<String> {
    let Some(search) = web_sys::window().and_then(|w| w.location().search().ok()) else { return Vec::new() };
    let Ok(params) = web_sys::UrlSearchParams::new_with_str(&search) else { return Vec::new() };
    let all = params.get_all("open");
    (0..all.length()).filter_map(|i| all.get(i).as_string()).collect()
}

/// Whether the browser gives a canvas a WebGL2 context (tried on a canvas of its own).
fn has_webgl2() -> bool {
    let Some(document) = web_sys::window().and_then(|w| w.document()) else { return false };
    let Ok(canvas) = document.create_element("canvas") else { return false };
    let Ok(canvas) = canvas.dyn_into::<web_sys::HtmlCanvasElement>() else { return false };
    canvas.get_context("webgl2").ok().flatten().is_some()
}

/// The viewer running in a page, for JavaScript.
#[wasm_bindgen]
pub struct WebHandle {
    runner: eframe::WebRunner,
}

impl WebHandle {
    /// The running app, or the error a page's call gets before it starts or after it failed.
    fn app(&self) -> Result<std::cell::RefMut<'_, WebApp>, JsValue> {
        self.runner.app_mut::<WebApp>().ok_or_else(|| JsValue::from_str("the app is not running"))
    }
}

#[wasm_bindgen]
impl WebHandle {
    /// A runner; call [`WebHandle::start`] with the canvas.
    #[expect(clippy::new_without_default)]
    #[wasm_bindgen(constructor)]
    pub fn new() -> Self {
        eframe::WebLogger::init(log::LevelFilter::Warn).ok();
        WebHandle { runner: eframe::WebRunner::new() }
    }

    /// Starts the viewer on `canvas`, opening the files the address names.
    pub async fn start(&self, canvas: web_sys::HtmlCanvasElement) -> Result<(), JsValue> {
        let mut options = eframe::WebOptions::default();
        // The page draws with WebGL2 where the browser has it (every desktop browser), leaving
        // WebGPU to the experiments' compute (`web::run`): the same pictures, and headless
        // Chromium (the test) captures a WebGL canvas in screenshots, where a WebGPU one comes
        // out blank. Without WebGL2 (headless Firefox on a machine with no GPU) wgpu picks.
        if has_webgl2()
            && let eframe::egui_wgpu::WgpuSetup::CreateNew(setup) = &mut options.wgpu_options.wgpu_setup
        {
            setup.instance_descriptor.backends = wgpu::Backends::GL;
        }
        self.runner
            .start(
                canvas,
                options,
                Box::new(|cc| {
                    ViewerApp::setup(&cc.egui_ctx);
                    let viewer = ViewerApp::new()
                        .with_experiments(default_experiments())
                        .with_host_button("Run on this GPU (WebGPU)…");
                    for url in requested_files() {
                        viewer.fetch(url, cc.egui_ctx.clone());
                    }
                    let runs = WebRuns::default();
                    runs.request_adapter(&cc.egui_ctx);
                    wasm_bindgen_futures::spawn_local(warm::warm_up());
                    Ok(Box::new(WebApp { viewer, runs, ctx: cc.egui_ctx.clone() }))
                }),
            )
            .await
    }

    /// What the viewer shows, as JSON (see `ViewerApp::status_json`).
    #[wasm_bindgen]
    pub fn status(&self) -> String {
        self.runner.app_mut::<WebApp>().map(|app| app.viewer.status_json()).unwrap_or_else(|| "null".into())
    }

    /// The WebGPU runs' state as JSON (see `WebRuns::status_json`): the adapter, the current
    /// run, and when it finished its record, marks and allocator events.
    #[wasm_bindgen]
    pub fn gpu_status(&self) -> String {
        self.runner.app_mut::<WebApp>().map(|app| app.runs.status_json()).unwrap_or_else(|| "null".into())
    }

    /// Opens a file of the page's server, as `?open=` does (the benchmark times it).
    #[wasm_bindgen]
    pub fn open_url(&self, url: String) -> Result<(), JsValue> {
        let app = self.app()?;
        app.viewer.fetch(url, app.ctx.clone());
        Ok(())
    }

    /// The finished WebGPU run's snapshot as cachalot's JSON (what "Download snapshot"
    /// saves), or `null` while none has finished.
    #[wasm_bindgen]
    pub fn gpu_snapshot(&self) -> Option<String> {
        let app = self.runner.app_mut::<WebApp>()?;
        let progress = app.runs.current()?;
        let progress = progress.borrow();
        let result = progress.result.as_ref()?;
        String::from_utf8(result.snapshot.to_json()).ok()
    }

    /// The finished WebGPU run as a PyTorch snapshot pickle (what "Download PyTorch pickle"
    /// saves), or `null` while none has finished.
    #[wasm_bindgen]
    pub fn gpu_pickle(&self) -> Result<Option<Vec<u8>>, JsValue> {
        let Some(app) = self.runner.app_mut::<WebApp>() else { return Ok(None) };
        let Some(progress) = app.runs.current() else { return Ok(None) };
        let progress = progress.borrow();
        let Some(result) = progress.result.as_ref() else { return Ok(None) };
        run::torch_pickle(result).map(Some).map_err(|e| JsValue::from_str(&e))
    }

    /// Shows the "Run on this GPU (WebGPU)" window, as the button of the page's top bar does
    /// (`gpu_status().window_open` says whether it is shown).
    #[wasm_bindgen]
    pub fn show_gpu_window(&self) -> Result<(), JsValue> {
        let mut app = self.app()?;
        app.runs.show_window();
        app.ctx.request_repaint();
        Ok(())
    }

    /// Asks the current WebGPU run to stop, as the window's Stop button does.
    #[wasm_bindgen]
    pub fn stop_gpu_run(&self) {
        if let Some(app) = self.runner.app_mut::<WebApp>() {
            app.runs.stop();
        }
    }

    /// Starts a run as the window's Run button does, with settings given as JSON:
    /// `{"experiment": "seeds" | "mlp-train" | "matmul-sweep", "backend": "webgpu" | "sim",
    /// "steps": 5, "widths": "256,512,512,10", "batches": "64,128,32", "config": "",
    /// "budget_mib": 1024}` (every key optional). For scripts that drive the page; the result
    /// shows in [`WebHandle::gpu_status`].
    #[wasm_bindgen]
    pub fn run_on_gpu(&self, settings: &str) -> Result<(), JsValue> {
        let value: serde_json::Value =
            serde_json::from_str(settings).map_err(|e| JsValue::from_str(&format!("settings: {e}")))?;
        let mut app = self.app()?;
        let s = &mut app.runs.settings;
        let text = |key: &str| value.get(key).and_then(|v| v.as_str()).map(str::to_owned);
        if let Some(name) = text("experiment") {
            s.kind = match name.as_str() {
                "seeds" => run::Kind::Seeds,
                "mlp-train" => run::Kind::MlpTrain,
                "matmul-sweep" => run::Kind::MatmulSweep,
                "ops" => run::Kind::Ops,
                other => return Err(JsValue::from_str(&format!("unknown experiment '{other}'"))),
            };
        }
        if let Some(backend) = text("backend") {
            s.webgpu = backend != "sim";
        }
        if let Some(steps) = value.get("steps").and_then(|v| v.as_u64()) {
            s.steps = steps as u32;
        }
        if let Some(widths) = text("widths") {
            s.widths = widths;
        }
        if let Some(batches) = text("batches") {
            s.batches = batches;
        }
        if let Some(shapes) = text("shapes") {
            s.shapes = shapes;
        }
        if let Some(config) = text("config") {
            s.config = config;
        }
        if let Some(budget) = value.get("budget_mib").and_then(|v| v.as_u64()) {
            s.budget_mib = budget;
        }
        if let (Some(name), Some(ops)) = (text("ops_name"), text("ops")) {
            s.ops = Some((name, ops));
        }
        let ctx = app.ctx.clone();
        let run = app.runs.start(&ctx).map_err(|e| JsValue::from_str(&e))?;
        app.viewer.add_live(run);
        ctx.request_repaint();
        Ok(())
    }

    /// Compares a run with PyTorch's `expected.json` in the Compare tab, as its section "Against
    /// PyTorch's expected.json" does: `json` is the file's text as an upload gives it (named
    /// `name`), or `null` for the built-in `seeds.expected.json`; `run` names the run's tab (the
    /// last tab when `null`). Shows the Compare tab and starts the analysis;
    /// [`WebHandle::compare_status`] follows it.
    #[wasm_bindgen]
    pub fn compare_with_expected(
        &self,
        name: Option<String>,
        json: Option<String>,
        run: Option<String>,
    ) -> Result<(), JsValue> {
        let mut app = self.app()?;
        let app = &mut *app;
        let expected = &mut app.viewer.side_by_side.expected;
        match json {
            Some(text) => expected.open(name.as_deref().unwrap_or("expected.json"), text.as_bytes()),
            None => expected.open(crate::reasons::SEEDS_EXPECTED.0, crate::reasons::SEEDS_EXPECTED.1),
        }
        let tabs = &app.viewer.tabs;
        let index = match &run {
            Some(name) => tabs.iter().position(|t| t.run.name == *name),
            None => tabs.len().checked_sub(1),
        }
        .ok_or_else(|| JsValue::from_str(&format!("no run {}", run.as_deref().unwrap_or("is open"))))?;
        expected.run = index;
        expected.start(&tabs[index]).map_err(|e| JsValue::from_str(&e))?;
        app.viewer.view = crate::tabs::View::SideBySide;
        app.ctx.request_repaint();
        Ok(())
    }

    /// The Compare tab's comparison with PyTorch's `expected.json` as JSON (see
    /// `ExpectedState::status_json`).
    #[wasm_bindgen]
    pub fn compare_status(&self) -> String {
        self.runner
            .app_mut::<WebApp>()
            .map(|app| app.viewer.side_by_side.expected.status_json().to_string())
            .unwrap_or_else(|| "null".into())
    }

    /// Shows the view titled `title` (`Segments`, `Memory`, `Pools`, `Stats`, `Events`,
    /// `Compare`, `Tune`), as its button in the top bar does.
    #[wasm_bindgen]
    pub fn show_view(&self, title: &str) -> Result<(), JsValue> {
        let mut app = self.app()?;
        app.viewer.view =
            crate::tabs::View::from_name(title).ok_or_else(|| JsValue::from_str(&format!("no view '{title}'")))?;
        app.ctx.request_repaint();
        Ok(())
    }

    /// Makes the page's WebGPU device fail, for tests of how the page reports it:
    /// `"validation"` submits an invalid command (a validation error), `"device-loss"`
    /// destroys the device (as a driver reset or the browser reclaiming it would lose it).
    #[wasm_bindgen]
    pub fn inject_gpu_fault(&self, kind: &str) -> Result<(), JsValue> {
        let app = self.app()?;
        app.runs.inject_fault(kind).map_err(|e| JsValue::from_str(&e))?;
        app.ctx.request_repaint();
        Ok(())
    }

    /// Whether the app panicked.
    #[wasm_bindgen]
    pub fn has_panicked(&self) -> bool {
        self.runner.has_panicked()
    }

    /// The panic message, if any.
    #[wasm_bindgen]
    pub fn panic_message(&self) -> Option<String> {
        self.runner.panic_summary().map(|s| s.message())
    }
}
