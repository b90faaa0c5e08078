//! The browser: eframe's web runner on a canvas, files from a picker, from drops, or named in
//! the page's address (`?open=trace.pickle&open=run.json`, fetched from the same server).

use std::cell::RefCell;
use std::rc::Rc;

use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

use crate::app::ViewerApp;

type Received = Vec<(String, Result<Vec<u8>, String>)>;

/// Files read by browser callbacks, waiting for the next frame.
#[derive(Clone, Debug, Default)]
pub struct Inbox(Rc<RefCell<Received>>);

fn js_error(value: &JsValue) -> String {
    value.as_string().unwrap_or_else(|| format!("{value:?}"))
}

async fn read_file(file: web_sys::File) -> Result<Vec<u8>, String> {
    let buffer = wasm_bindgen_futures::JsFuture::from(file.array_buffer()).await.map_err(|e| js_error(&e))?;
    Ok(js_sys::Uint8Array::new(&buffer).to_vec())
}

async fn fetch_bytes(url: String) -> Result<Vec<u8>, String> {
    let window = web_sys::window().ok_or("no window")?;
    let response = wasm_bindgen_futures::JsFuture::from(window.fetch_with_str(&url)).await.map_err(|e| js_error(&e))?;
    let response: web_sys::Response = response.dyn_into().map_err(|e| js_error(&e))?;
    if !response.ok() {
        return Err(format!("HTTP {}", response.status()));
    }
    let buffer = response.array_buffer().map_err(|e| js_error(&e))?;
    let buffer = wasm_bindgen_futures::JsFuture::from(buffer).await.map_err(|e| js_error(&e))?;
    Ok(js_sys::Uint8Array::new(&buffer).to_vec())
}

impl Inbox {
    /// Everything received since the last call.
    pub fn take(&self) -> Received {
        std::mem::take(&mut *self.0.borrow_mut())
    }

    fn push(&self, name: String, bytes: Result<Vec<u8>, String>, ctx: &egui::Context) {
        self.0.borrow_mut().push((name, bytes));
        ctx.request_repaint();
    }

    /// Opens the browser's file picker; the chosen files arrive in the inbox.
    pub fn pick_files(&self, ctx: egui::Context) {
        let Some(document) = web_sys::window().and_then(|w| w.document()) else { return };
        let Ok(element) = document.create_element("input") else { return };
        let Ok(input) = element.dyn_into::<web_sys::HtmlInputElement>() else { return };
        input.set_type("file");
        input.set_multiple(true);
        let inbox = self.clone();
        let chosen = input.clone();
        let on_change = Closure::<dyn FnMut()>::new(move || {
            let Some(files) = chosen.files() else { return };
            for i in 0..files.length() {
                let Some(file) = files.get(i) else { continue };
                let (inbox, ctx) = (inbox.clone(), ctx.clone());
                wasm_bindgen_futures::spawn_local(async move {
                    let name = file.name();
                    let bytes = read_file(file).await;
                    inbox.push(name, bytes, &ctx);
                });
            }
        });
        input.set_onchange(Some(on_change.as_ref().unchecked_ref()));
        // The input lives as long as the page may call back into it.
        on_change.forget();
        input.click();
    }

    /// Reads a file dropped on the page.
    pub fn read_dropped(&self, file: egui::DroppedFileHandle, ctx: egui::Context) {
        let inbox = self.clone();
        wasm_bindgen_futures::spawn_local(async move {
            let name = file.path().display().to_string();
            let bytes = file.bytes_async().await;
            inbox.push(name, bytes, &ctx);
        });
    }

    /// Fetches `url` from the server the page came from.
    pub fn fetch(&self, url: String, ctx: egui::Context) {
        let inbox = self.clone();
        wasm_bindgen_futures::spawn_local(async move {
            let name = url.rsplit('/').next().unwrap_or(&url).to_owned();
            let bytes = fetch_bytes(url).await;
            inbox.push(name, bytes, &ctx);
        });
    }
}

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
                    let app = ViewerApp::new();
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

impl ViewerApp {
    /// Fetches a file from the page's server and opens it.
    pub fn fetch(&self, url: String, ctx: egui::Context) {
        self.inbox().fetch(url, ctx);
    }
}
