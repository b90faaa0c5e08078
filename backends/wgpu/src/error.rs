//! Errors of the wgpu crate: getting a device, and running kernels.

use cachalot_core::AllocatorError;

/// Why no [`crate::WgpuContext`] could be made.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WgpuError {
    /// No adapter was found (no GPU, no Vulkan driver such as Mesa's lavapipe, no WebGPU).
    #[error("no wgpu adapter: {0}")]
    NoAdapter(String),
    /// The adapter refused the device (e.g. limits it cannot provide).
    #[error("the wgpu adapter refused a device: {0}")]
    RequestDevice(String),
    /// The device cannot run cachalot.
    #[error("the wgpu device cannot run cachalot: {0}")]
    Unsupported(String),
}

/// Why a kernel, upload or readback could not run. The allocator and the device stay usable.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KernelError {
    /// The handle is not a live allocation of this allocator (stale, freed, foreign).
    #[error(transparent)]
    Allocator(#[from] AllocatorError),
    /// An allocation is smaller than the tensor the kernel would read or write there.
    #[error("operand `{operand}` needs {needed} bytes, but its allocation holds {size}")]
    TooSmall {
        /// The operand's name in the kernel call.
        operand: &'static str,
        /// Bytes the shape needs.
        needed: u64,
        /// Bytes of the block.
        size: u64,
    },
    /// One operand is larger than one binding may be and the kernel cannot work in chunks.
    #[error(
        "operand `{operand}` needs a binding of {bytes} bytes, over the device's \
         max_storage_buffer_binding_size of {limit} bytes: split the tensor, or request a \
         device with a larger limit"
    )]
    BindingTooLarge {
        /// The operand's name in the kernel call.
        operand: &'static str,
        /// Bytes the operand needs bound at once.
        bytes: u64,
        /// The device's `max_storage_buffer_binding_size`.
        limit: u64,
    },
    /// The address lies in no segment of this backend.
    #[error("address {0:#x} is in no segment of this wgpu backend")]
    UnknownAddress(u64),
    /// The allocation was made on [`crate::QUEUE_STREAM`], which stands for the GPU queue.
    #[error(
        "the allocation at {0:#x} was made on QUEUE_STREAM; allocate on another stream (e.g. \
         StreamId::DEFAULT) so that kernel use can be recorded against the queue"
    )]
    QueueStream(u64),
    /// Shapes or arguments that do not fit together.
    #[error("invalid kernel arguments: {0}")]
    InvalidArguments(String),
    /// Arguments every backend refuses (`cachalot_shaders::ops`).
    #[error("invalid kernel arguments: {0}")]
    Op(#[from] cachalot_shaders::ops::OpError),
    /// wgpu reported an error (shader compilation, validation, out of memory for a temporary
    /// buffer).
    #[error("wgpu error: {0}")]
    Wgpu(String),
    /// A readback's buffer could not be mapped.
    #[error("readback failed: {0}")]
    Readback(String),
}
