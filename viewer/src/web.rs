//! The browser: eframe's web runner on a canvas, offering the simulator's experiments and
//! opening the files named in the page's address (`?open=trace.pickle&open=run.json`, fetched
//! from the same server). The file picker and dropped files are the app's loader's.

use wasm_bindgen::prelude::*;

use crate::app::ViewerApp;
use crate::live::default_experiments;

/// The `open=` parameters of the page's address.
fn requested_files() -> Vec<String> {
    let Some(search) = web_sys::window().and_then(|w| w.location().search().ok()) else { return Vec::new() };
    let Ok(params) = web_sys::UrlSearchParams::new_with_str(&search) else { return Vec::new() };
    let all = params.get_all("open");
    (0..all.length()).filter_map(|i| all.get(i).as_string()).collect()
}

/// The viewer running in a page, for JavaScript.
#[wasm_bindgen]
pub struct WebHandle {
    runner: eframe::WebRunner,
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
        self.runner
            .start(
                canvas,
                eframe::WebOptions::default(),
                Box::new(|cc| {
                    ViewerApp::setup(&cc.egui_ctx);
                    let app = ViewerApp::new().with_experiments(default_experiments());
                    for url in requested_files() {
                        app.fetch(url, cc.egui_ctx.clone());
                    }
                    Ok(Box::new(app))
                }),
            )
            .await
    }

    /// What the viewer shows, as JSON (see `ViewerApp::status_json`).
    #[wasm_bindgen]
    pub fn status(&self) -> String {
        self.runner.app_mut::<ViewerApp>().map(|app| app.status_json()).unwrap_or_else(|| "null".into())
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
