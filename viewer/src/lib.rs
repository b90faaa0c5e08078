//! # cachalot-viewer
//!
//! See the pools of PyTorch's caching allocator — and of cachalot on any GPU — in an
//! egui/eframe app that runs on the desktop and in the browser.
//!
//! - [`format`](mod@format) and [`style`]: how numbers read and how things look, for every panel;
//! - [`model`]: a loaded run and the allocator's state at any point of its trace, rebuilt
//!   fast from checkpoints (the state and its rules are `cachalot_trace::rebuild`'s);
//! - [`load`]: cachalot snapshots, PyTorch snapshot pickles and op files into runs;
//! - [`live`]: experiments that stream their trace into the viewer while they run;
//! - the panels of one run, each a module with a `ui` function: [`timeline`], [`segments`],
//!   [`pools`], [`stats`], [`events`], the Active Memory Timeline ([`memory_timeline`]) with the
//!   peak analysis under it ([`peak_analysis`]); and [`notices`], the messages at the bottom;
//! - [`tabs`]: the open runs ([`tabs::RunTab`]), the panel shown ([`View`]) and the tab bar;
//! - [`side_by_side`]: two runs side by side with linked cursors (the "Compare" tab), and
//!   [`reasons`]: why they differ, or how a run differs from PyTorch's `expected.json`, from
//!   `cachalot compare`'s analysis;
//! - [`tune`]: the "Tune" tab, `cachalot tune`'s search of a PyTorch trace as a chart and a
//!   ranking, each candidate's replay opened beside the trace in "Compare";
//! - [`ranks`]: the "Ranks" tab, the ranks of one distributed job side by side, aligned by
//!   step, and where they differ;
//! - [`explain`]: the "Explain" tab, `cachalot explain` for the request at the cursor (why it
//!   ran out of memory, and the fix proven by replay);
//! - `loading` (files loaded off the UI path) and `dialogs` ("Run experiment", "Open files"),
//!   both private to the app;
//! - [`app`]: [`ViewerApp`], which holds all state and runs the frame;
//! - natively, [`native`]: the window, headless screenshots and the benchmark; in the
//!   browser, `web`: the page's entry point, and `web::run`: the experiments of `cachalot run`
//!   on the visitor's GPU through WebGPU.
//!
//! Each module imports only modules listed before it: no panel imports [`app`]. The `cachalot`
//! command line (crate `cachalot-cli`) shows this viewer with `cachalot view` and serves its web
//! build with `cachalot serve`.

// No unsafe code outside the two platform calls of the desktop app (`native`). The web build is
// left out: its entry points are wasm-bindgen glue.
#![cfg_attr(not(target_arch = "wasm32"), deny(unsafe_code, clippy::undocumented_unsafe_blocks))]

pub mod app;
mod dialogs;
pub mod events;
pub mod explain;
pub mod format;
pub mod live;
pub mod load;
mod loading;
pub mod memory_timeline;
pub mod model;
pub mod notices;
pub mod peak_analysis;
pub mod pools;
pub mod ranks;
pub mod reasons;
pub mod segments;
pub mod side_by_side;
pub mod stats;
pub mod style;
pub mod tabs;
pub mod timeline;
pub mod tune;

#[cfg(not(target_arch = "wasm32"))]
#[allow(
    unsafe_code,
    reason = "the OpenGL renderer's name and the thread CPU clock are FFI calls, each with its SAFETY line"
)]
pub mod native;
#[cfg(target_arch = "wasm32")]
pub mod web;

pub use app::ViewerApp;
pub use model::Run;
pub use tabs::View;
