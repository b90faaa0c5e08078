//! # cachalot-core
//!
//! A caching GPU memory allocator that behaves exactly like PyTorch 2.11's CUDA caching
//! allocator — same rounding, pools, best fit, split and merge, streams and events, garbage
//! collection, out-of-memory retry chain, expandable segments, `memory_stats()` and
//! `memory_summary()` — over any device with the [`Backend`] capabilities.
//!
//! This crate is pure Rust with no parser, GPU or GUI dependency and no `unsafe` (it also builds
//! for `wasm32`): all policy lives here, and the backends (`cachalot-cuda`, `cachalot-wgpu`, and
//! [`SimBackend`] in this crate) only provide raw segments, page mapping, stream events and
//! device facts. The same policy code therefore runs on CUDA, wgpu, the simulator and in the
//! browser. Files — cachalot's JSON snapshots, PyTorch's snapshot pickles, op files — and the
//! replay of recorded traces are `cachalot-trace`'s; the `serde` feature derives
//! `Serialize`/`Deserialize` for the data types those files carry.
//!
//! ```
//! use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
//!
//! // The worked example of `docs/allocator-rules.md` §21: 4 B, 43,008,000 B, 1 MiB + 1, 15 MiB and 25 MiB.
//! let mut allocator = CachingAllocator::new(SimBackend::new(150_109_880_320), AllocatorConfig::default())?;
//! for size in [4, 43_008_000, (1 << 20) + 1, 15 << 20, 25 << 20] {
//!     allocator.malloc(size, StreamId::DEFAULT)?;
//! }
//! assert_eq!(allocator.memory_allocated(), 88_081_408);
//! assert_eq!(allocator.memory_reserved(), 90 << 20);
//! # Ok::<(), cachalot_core::AllocatorError>(())
//! ```

#![forbid(unsafe_code)]

mod allocator;
pub mod backend;
mod block;
pub mod config;
pub mod error;
pub mod pool;
mod shared;
pub mod sim;
pub mod size;
pub mod stats;
pub mod summary;
pub mod text;
pub mod trace;
mod tree;

pub use allocator::{
    Allocation, Allocator, BlockCheckpoint, BlockSnapshot, BlockState, CachingAllocator, DeviceAllocators,
    DynOomObserver, OomEvent, OomObserver, PoolCheckpoint, RestoreDelta, SegmentCheckpoint, SegmentSnapshot,
};
pub use backend::{
    Backend, BackendError, DeviceFacts, EventLayer, Pages, Segments, StreamEvents, StreamId, WithEvents,
};
pub use config::{AllocatorConfig, ConfigBuilder, ConfigError, Policy};
pub use error::{AllocatorError, HandleError, OutOfMemoryError, PoolError};
pub use pool::{PoolFilter, PoolId};
pub use shared::SharedAllocator;
pub use sim::SimBackend;
pub use stats::MemoryStats;
pub use trace::{Annotation, ContextId, ContextTable, Frame, Mark, TraceAction, TraceEntry};
