//! Errors of the runtime: one enum over the allocator, the backends and the runtime's own
//! checks, so an experiment can use `?` on every call whatever device it runs on.

use cachalot_core::AllocatorError;

/// Why a runtime call failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The caching allocator refused (out of memory, a stale handle, ...).
    #[error(transparent)]
    Allocator(#[from] AllocatorError),
    /// A CUDA call failed.
    #[error("CUDA: {0}")]
    Cuda(#[from] cachalot_cuda::CudaError),
    /// A wgpu kernel, upload or readback failed.
    #[error("wgpu: {0}")]
    Wgpu(#[from] cachalot_wgpu::KernelError),
    /// No wgpu device could be made.
    #[error(transparent)]
    WgpuDevice(#[from] cachalot_wgpu::WgpuError),
    /// A wgpu device call the allocator's backend makes failed (waiting for the queue).
    #[error("wgpu: {0}")]
    Queue(#[from] cachalot_core::BackendError),
    /// Shapes that do not fit the operation.
    #[error("shape: {0}")]
    Shape(String),
    /// The backend asked for cannot be used here.
    #[error("backend {backend} is not usable: {reason}")]
    Unavailable {
        /// `cuda`, `wgpu` or `sim`.
        backend: &'static str,
        /// Why.
        reason: String,
    },
    /// Invalid experiment parameters.
    #[error("invalid parameters: {0}")]
    Parameters(String),
    /// A tensor was dropped and freeing its block failed; the error is reported at the next
    /// runtime call because a drop cannot return it.
    #[error("freeing a dropped tensor's block failed: {0}")]
    Deferred(Box<RuntimeError>),
    /// A result computed on the device differs from the CPU reference.
    #[error("check failed: {0}")]
    Check(String),
    /// Reading an input file failed.
    #[error("{path}: {message}")]
    Input {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}
