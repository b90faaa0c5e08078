//! The browser's ways in for files: its file picker, files dropped on the page and files
//! fetched from the page's server. Their callbacks run between frames and leave the bytes in an
//! [`Inbox`], which the [`super::Loader`] empties on the next frame.

use std::cell::RefCell;
use std::rc::Rc;

use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

type Received = Vec<(String, Result<Vec<u8>, String>)>;

/// Files read by browser callbacks, waiting for the next frame, and the names of those still
/// arriving (a fetch of a large trace takes seconds: the page shows them as loading).
#[derive(Clone, Debug, Default)]
pub struct Inbox {
    received: Rc<RefCell<Received>>,
    arriving: Rc<RefCell<Vec<String>>>,
}

/// Leaves a mark on the page's performance timeline (`performance.mark`), where a script timing
/// the page (`scripts/dev/web-test/bench.mjs`) or the browser's profiler finds it. Marks are
/// left only around loads, never every frame, so the timeline stays small.
pub fn mark(name: &str) {
    if let Some(performance) = web_sys::window().and_then(|w| w.performance()) {
        let _ = performance.mark(name);
    }
}

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
        std::mem::take(&mut *self.received.borrow_mut())
    }

    /// The names of the files still arriving.
    pub fn arriving(&self) -> Vec<String> {
        self.arriving.borrow().clone()
    }

    /// Notes that `name` is on its way, until [`Inbox::push`] brings it.
    fn expect(&self, name: &str) {
        self.arriving.borrow_mut().push(name.to_owned());
    }

    fn push(&self, name: String, bytes: Result<Vec<u8>, String>, ctx: &egui::Context) {
        {
            let mut arriving = self.arriving.borrow_mut();
            if let Some(i) = arriving.iter().position(|n| *n == name) {
                arriving.remove(i);
            }
        }
        self.received.borrow_mut().push((name, bytes));
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
                    inbox.expect(&name);
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
            inbox.expect(&name);
            let bytes = file.bytes_async().await;
            inbox.push(name, bytes, &ctx);
        });
    }

    /// Fetches `url` from the server the page came from.
    pub fn fetch(&self, url: String, ctx: egui::Context) {
        let inbox = self.clone();
        let name = url.rsplit('/').next().unwrap_or(&url).to_owned();
        // Counted as loading from the call on, so a script sees the load the moment it asks.
        inbox.expect(&name);
        wasm_bindgen_futures::spawn_local(async move {
            mark(&format!("cachalot fetch {name}"));
            let bytes = fetch_bytes(url).await;
            mark(&format!("cachalot fetched {name}"));
            inbox.push(name, bytes, &ctx);
        });
    }
}
