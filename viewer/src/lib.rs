//! # cachalot-viewer
//!
//! See the pools of PyTorch's caching allocator — and of cachalot on any GPU — in an
//! egui/eframe app that runs on the desktop and in the browser.
//!
//! - [`model`]: a loaded run and the allocator's state at any point of its trace, rebuilt
//!   fast from checkpoints (the state and its rules are `cachalot_trace::rebuild`'s);
//! - [`load`]: cachalot snapshots, PyTorch snapshot pickles and op files into runs;
//! - [`live`]: experiments that stream their trace into the viewer while they run;
//! - [`app`]: [`app::ViewerApp`], which holds all state, and one module per panel:
//!   [`timeline`], [`segments`], [`pools`], [`stats`], [`events`], [`compare`];
//! - natively, [`native`]: the window, headless screenshots and the benchmark; in the
//!   browser, `web`: the page's entry point and file picker.
//!
//! The `cachalot` command line is this crate's binary (`cachalot view`, `cachalot serve`).

pub mod app;
pub mod compare;
pub mod events;
pub mod format;
pub mod live;
pub mod load;
pub mod model;
pub mod pools;
pub mod segments;
pub mod stats;
pub mod timeline;

#[cfg(not(target_arch = "wasm32"))]
pub mod native;
#[cfg(target_arch = "wasm32")]
pub mod web;

pub use app::{View, ViewerApp};
pub use model::Run;
