//! # cachalot-torch
//!
//! cachalot as the CUDA allocator of a PyTorch process. PyTorch 2.11 lets a process replace
//! its caching allocator before the first CUDA tensor (`CUDAPluggableAllocator` +
//! `change_current_allocator`); since cachalot's policy is PyTorch's, byte for byte, the job
//! then reserves exactly what it reserves on PyTorch's own allocator, and gains cachalot's
//! stats, snapshots and history where PyTorch's API cannot reach a pluggable allocator.
//!
//! - [`abi`]: the C functions PyTorch calls (`alloc`, `free`, `record_stream`, `empty_cache`,
//!   memory fraction) and the last error of a failed allocation.
//! - [`registry`]: one `CachingAllocator` per device, made when PyTorch first asks for that
//!   device, each behind its own mutex, with the live pointer → allocation map.
//! - [`backend`]: the device under an allocator — `cachalot-cuda` with events recorded on
//!   PyTorch's own `cudaStream_t`s, or the simulator.
//! - `python` (feature `python`): the `cachalot_torch._native` module the Python package
//!   (`bindings/torch/python/cachalot_torch`, built with maturin) wraps.
//!
//! The registry runs on the simulator as on CUDA, so its behaviour is tested here without a
//! GPU:
//!
//! ```
//! use cachalot_core::StreamId;
//! use cachalot_torch::registry::{DeviceKind, Registry, Settings};
//!
//! let registry = Registry::new(Settings { device: DeviceKind::Simulator { capacity: 1 << 30 }, ..Settings::default() });
//! let stream = StreamId(0x5a1de); // a cudaStream_t, as PyTorch passes it
//! let ptr = registry.alloc(4 << 20, 0, stream).map_err(|f| f.message().to_owned())?;
//! registry.free(ptr, 0).map_err(|f| f.message().to_owned())?;
//! let reserved = registry.with_device(0, |d| d.allocator.memory_reserved()).map_err(|f| f.message().to_owned())?;
//! assert_eq!(reserved, 20 << 20); // one cached 20 MiB segment, as PyTorch's allocator keeps
//! # Ok::<(), String>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod abi;
pub mod backend;
#[cfg(feature = "python")]
mod python;
pub mod registry;
