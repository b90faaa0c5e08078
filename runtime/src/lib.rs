//! # cachalot-runtime
//!
//! Identical experiments on every backend. A small tensor runtime over
//! `CachingAllocator<B>` and the backend's kernels — tensors own blocks, and a dropped tensor
//! is a freed block, as in PyTorch — and experiments written once against it that run
//! unchanged on CUDA, on any GPU through wgpu, and on the simulator with the CPU reference
//! kernels. Labelled marks record `memory_allocated()` / `memory_reserved()` where
//! `torch.cuda.memory_allocated()` would read them, and [`comparison`] puts runs side by side
//! and says why they differ.
//!
//! - [`device`]: the [`Device`] traits ([`DeviceInfo`]: facts and the allocator;
//!   [`DeviceKernels`]: one method per op) and their three implementations (CUDA, wgpu,
//!   simulator), with the stream discipline that makes the wgpu and simulator event sequences
//!   equal;
//! - [`runtime`]: [`Runtime`] and [`Tensor`];
//! - [`experiments`]: `seeds`, `mlp-train`, `matmul-sweep`, `ops`;
//! - [`select`]: `--backend auto|cuda|wgpu|sim`; [`run`](mod@run): a run and its snapshot;
//! - [`stream`]: a run watched as it happens (a [`stream::TraceSink`] gets the allocator's
//!   entries in batches and may stop it; the viewer's live runs);
//! - [`comparison`]: runs side by side with the tested reasons they differ, as data
//!   ([`comparison::Comparison`]; `cachalot compare` renders it as text);
//! - [`bench`](mod@bench): op files timed on any backend (`cachalot bench`).
//!
//! ```
//! use cachalot_runtime::{DeviceOptions, BackendRequest, Experiment, execute};
//!
//! // `seeds` on the simulator standing for an H200: PyTorch 2.11's marks, with no GPU.
//! let options = DeviceOptions { backend: BackendRequest::Sim, compute: false, ..Default::default() };
//! let run = execute(&Experiment::Seeds, &options)?;
//! let linear = run.marks.iter().find(|m| m.label == "linear_output").unwrap();
//! assert_eq!((linear.allocated, linear.reserved), (76_997_120, 77_594_624));
//! # Ok::<(), cachalot_runtime::RuntimeError>(())
//! ```

#![forbid(unsafe_code)]

#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
pub mod comparison;
pub mod device;
mod error;
pub mod experiments;
pub mod run;
pub mod runtime;
pub mod select;
pub mod stream;
// Replays a trace's calls on a native CUDA or wgpu device (`cachalot replay --backend`); the
// browser replays on the simulator only.
#[cfg(not(target_arch = "wasm32"))]
pub mod trace_replay;

pub use device::sim::{SimDevice, SimProfile};
pub use device::{Activation, BackendKind, Device, DeviceInfo, DeviceKernels, StreamDiscipline, Workspaces};
pub use error::RuntimeError;
pub use experiments::{Experiment, MlpParams, Outcome, SweepParams};
pub use run::{RunRecord, RunResult, execute, execute_async, execute_on, execute_watched};
pub use runtime::{DType, LinearGrads, Runtime, Tensor};
pub use select::{BackendRequest, DeviceOptions, Selection, open};
