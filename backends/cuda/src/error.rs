//! Errors of the CUDA backend.

use cachalot_core::{AllocatorError, BackendError};
use cudarc::driver::DriverError;

/// Why a CUDA call of this crate failed.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA library could not be loaded (no driver, or a toolkit library off the loader path).
    /// cudarc would panic on the first call; this crate checks first and reports it.
    #[error("the CUDA library {library} cannot be loaded ({hint})")]
    LibraryMissing {
        /// The library, e.g. `libcuda` or `libcublas`.
        library: &'static str,
        /// What provides it and how to make it visible.
        hint: &'static str,
    },
    /// The driver is there but has no device of this ordinal.
    #[error("no CUDA device {ordinal} (the driver reports {count} device(s))")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver sees.
        count: usize,
    },
    /// A driver call failed.
    #[error("{call} failed: {source}")]
    Driver {
        /// The driver function, e.g. `cuMemAlloc`.
        call: &'static str,
        /// The driver's error.
        source: DriverError,
    },
    /// NVRTC could not compile a kernel source.
    #[error("NVRTC could not compile {source_name}: {message}")]
    Compile {
        /// Which source.
        source_name: &'static str,
        /// NVRTC's error and log.
        message: String,
    },
    /// A cuBLAS or cuBLASLt call failed.
    #[error("{call} failed: {status}")]
    Blas {
        /// The function.
        call: &'static str,
        /// The library's status, as text.
        status: String,
    },
    /// The caching allocator refused (e.g. no memory for a cuBLAS workspace).
    #[error(transparent)]
    Allocator(#[from] AllocatorError),
    /// Arguments that do not fit the operands or the kernel (sizes, streams).
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// Arguments every backend refuses (`cachalot_shaders::ops`).
    #[error("invalid arguments: {0}")]
    Op(#[from] cachalot_shaders::ops::OpError),
}

impl CudaError {
    /// A driver error of `call`.
    pub(crate) fn driver(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
        move |source| CudaError::Driver { call, source }
    }

    /// Whether the driver ran out of device memory.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            CudaError::Driver { source, .. } => is_oom(source),
            CudaError::Allocator(AllocatorError::OutOfMemory(_)) => true,
            _ => false,
        }
    }
}

/// Whether a driver error is `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) fn is_oom(error: &DriverError) -> bool {
    error.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// The allocator's view of a driver error: out of memory enters its retry chain, anything else
/// is a device failure.
pub(crate) fn backend_error(call: &'static str, error: DriverError) -> BackendError {
    if is_oom(&error) { BackendError::out_of_memory() } else { BackendError::Device(format!("{call} failed: {error}")) }
}

impl From<CudaError> for BackendError {
    fn from(error: CudaError) -> Self {
        match error {
            e if e.is_out_of_memory() => BackendError::out_of_memory(),
            other => BackendError::Device(other.to_string()),
        }
    }
}
