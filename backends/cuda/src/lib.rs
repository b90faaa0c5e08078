//! # cachalot-cuda
//!
//! The CUDA backend of cachalot: PyTorch 2.11's caching-allocator policy (from
//! `cachalot-core`) over real device memory, and the kernels of the experiments on it.
//!
//! - [`CudaDevice`]: a device's primary context and the streams known by [`StreamId`] (the
//!   numeric `CUstream` value, as PyTorch orders blocks; the default stream is 0), those it made
//!   and, opened with [`CudaDevice::open_with_foreign_streams`], those someone else made
//!   (PyTorch's `cudaStream_t`s). Shared by:
//! - [`CudaBackend`]: implements [`cachalot_core::Backend`] — `cuMemAlloc`/`cuMemFree`
//!   segments (out of memory enters the allocator's retry chain), expandable segments through
//!   the VMM API, events recorded at free time and queried by `process_events`.
//! - [`CudaKernels`]: NVRTC-compiled element-wise, loss and optimiser kernels (the CUDA C of
//!   `cachalot-shaders` plus this crate's), and matrix products / the linear layer through
//!   cuBLAS and cuBLASLt, with PyTorch 2.11's persistent workspaces taken from the allocator
//!   ([`WorkspaceSizes`]).
//!
//! Built with cudarc's `dynamic-loading`, the crate compiles without a CUDA toolkit, and every
//! library is looked for at run time: without `libcuda` (or a GPU) [`CudaBackend::new`] returns
//! [`CudaError::LibraryMissing`] / [`CudaError::NoDevice`] instead of panicking, so a caller
//! can fall back to another backend ([`probe`] says why CUDA is not usable).
//!
//! ```no_run
//! use cachalot_core::{AllocatorConfig, StreamId};
//! use cachalot_cuda::{CudaKernels, caching_allocator};
//! use cachalot_shaders::ops::{Activation, ActivationForward};
//!
//! let mut allocator = caching_allocator(0, AllocatorConfig::default())?;
//! let kernels = CudaKernels::new(allocator.backend().cuda())?;
//! let x = allocator.malloc(1024 * 4, StreamId::DEFAULT)?;
//! kernels.fill(StreamId::DEFAULT, &x, 1024, 0.5)?;
//! kernels.activation(StreamId::DEFAULT, ActivationForward { act: Activation::Gelu, x: &x, y: &x, n: 1024 })?;
//! let y: Vec<f32> = kernels.read(StreamId::DEFAULT, &x, 1024)?;
//! println!("{}", y[0]);
//! allocator.free(x)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod backend;
mod device;
mod error;
mod kernels;
mod vmm;

use cachalot_core::{AllocatorConfig, CachingAllocator};

pub use backend::{BLOCK_ALIGNMENT, CudaBackend};
pub use cachalot_core::StreamId;
/// The cudarc this crate is built on (its events are the backend's `Event` type).
pub use cudarc;
pub use device::{CudaDevice, cublas_libraries_present, device_count, driver_library_present, nvrtc_library_present};
pub use error::CudaError;
pub use kernels::{
    BACKEND_KERNELS, CUBLAS_WORKSPACE_DEFAULT, CUBLAS_WORKSPACE_LARGE, CUBLASLT_WORKSPACE_DEFAULT, CudaKernels,
    DeviceSpan, SUM_PARTIALS, Workspace, WorkspaceKind, WorkspaceSizes, parse_cublas_workspace_config, pattern_word,
};

/// The variable that makes GPU tests fail instead of skipping when no CUDA device is usable.
pub const REQUIRE_CUDA_ENV: &str = "CACHALOT_REQUIRE_CUDA";

/// Whether a CUDA device is required (`CACHALOT_REQUIRE_CUDA` set to anything but empty or
/// `0`): then tests must fail, not skip, without one. `CACHALOT_REQUIRE_GPU` asks for any GPU
/// adapter (lavapipe counts) and is set on CI, where there is no CUDA device, so it does not
/// require CUDA.
pub fn cuda_required() -> bool {
    std::env::var(REQUIRE_CUDA_ENV).is_ok_and(|v| flag_set(&v))
}

fn flag_set(value: &str) -> bool {
    !value.is_empty() && value != "0"
}

/// A ready PyTorch-exact caching allocator on CUDA device `ordinal`: one call.
///
/// Use `CudaKernels::new(allocator.backend().cuda())` for kernels on its memory and streams.
pub fn caching_allocator(ordinal: usize, config: AllocatorConfig) -> Result<CachingAllocator<CudaBackend>, CudaError> {
    Ok(CachingAllocator::new(CudaBackend::new(ordinal)?, config)?)
}

/// Checks that CUDA device `ordinal` is usable and describes it (name, memory, compute
/// capability), or says why not — for `--backend auto` to report before moving on. Never
/// panics.
pub fn probe(ordinal: usize) -> Result<String, CudaError> {
    let backend = CudaBackend::new(ordinal)?;
    let facts = cachalot_core::Segments::device(&backend);
    let (major, minor) = backend.cuda().compute_capability();
    Ok(format!(
        "CUDA device {ordinal}: {} ({:.1} GiB, compute capability {major}.{minor})",
        facts.name,
        facts.total_memory as f64 / (1u64 << 30) as f64
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn movable<T: Send>() {}

    #[test]
    fn allocator_and_kernels_can_move_between_threads() {
        movable::<CudaBackend>();
        movable::<CachingAllocator<CudaBackend>>();
        movable::<CudaKernels>();
        movable::<std::sync::Arc<CudaDevice>>();
    }

    #[test]
    fn a_requirement_is_any_value_but_empty_or_zero() {
        assert!(flag_set("1") && flag_set("yes") && !flag_set("0") && !flag_set(""));
    }
}
