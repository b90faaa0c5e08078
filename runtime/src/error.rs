//! Errors of the runtime: one enum over the allocator, the backends and the runtime's own
//! checks, so an experiment can use `?` on every call whatever device it runs on.

use cachalot_core::AllocatorError;
use cachalot_shaders::ops::OpError;

/// Why a runtime call failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The caching allocator refused (out of memory, a stale handle, ...).
    #[error(transparent)]
    Allocator(#[from] AllocatorError),
    /// A CUDA call failed.
    #[cfg(not(target_arch = "wasm32"))]
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
    /// Kernel arguments every backend refuses (`cachalot_shaders::ops`), reported by a device
    /// that checks them itself (the simulator; the mean of the CUDA and wgpu devices).
    #[error("{}{}", op_category(.0), .0)]
    Op(#[from] OpError),
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
    /// The run's watcher asked it to stop ([`crate::stream::TraceSink::stop_requested`]).
    #[error("stopped by its watcher")]
    Stopped,
    /// Reading an input file failed.
    #[error("{path}: {message}")]
    Input {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// The prefix an op's refusal has always had in the runtime's messages: a step number is a
/// parameter, every other refusal a shape (as [`RuntimeError::Parameters`] and
/// [`RuntimeError::Shape`] print).
fn op_category(error: &OpError) -> &'static str {
    match error {
        OpError::AdamStepZero => "invalid parameters: ",
        OpError::EmptyMean | OpError::EmptyCrossEntropy | OpError::MissingMomentumBuffer => "shape: ",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_refusals_read_as_before() {
        assert_eq!(RuntimeError::from(OpError::EmptyMean).to_string(), "shape: the mean of no elements is undefined");
        assert_eq!(
            RuntimeError::from(OpError::MissingMomentumBuffer).to_string(),
            "shape: SGD with momentum needs a momentum buffer"
        );
        assert_eq!(
            RuntimeError::from(OpError::AdamStepZero).to_string(),
            "invalid parameters: Adam steps are counted from 1"
        );
    }
}
