//! # cachalot-wgpu
//!
//! The wgpu backend of cachalot: the same caching-allocator policy as on CUDA (PyTorch 2.11's,
//! from `cachalot-core`) on every GPU wgpu reaches — Vulkan, Metal, DX12, and WebGPU in the
//! browser — plus the WGSL kernels of `cachalot-shaders` run on the allocations.
//!
//! - [`WgpuContext`]: device, queue, limits, the submission clock and the compiled kernels,
//!   shared through `Arc` by the two halves below.
//! - [`WgpuBackend`]: implements [`cachalot_core::Backend`]. A segment is a `wgpu::Buffer`
//!   (`STORAGE | COPY_SRC | COPY_DST`) and a block a range of it; addresses live in an address
//!   space of the backend's own and [`WgpuBackend::resolve`] maps them to `(buffer, offset)`.
//!   Events are submission numbers: a block freed while a submission may still use it
//!   returns to the cache only once that submission has completed.
//! - [`Kernels`] / [`KernelBatch`]: matmul (tiled, vectorised; NN/NT/TN with bias and
//!   accumulation), the linear layer's forward and backward passes, ReLU, GELU, MSE, softmax
//!   cross-entropy, SGD, Adam, fill, copy, uploads and asynchronous [`Readback`]s, dispatched
//!   on [`cachalot_core::Allocation`]s.
//!
//! Limits are the adapter's (requested in full): a segment must fit `max_buffer_size`, a
//! bound operand `max_storage_buffer_binding_size` (element-wise kernels work in chunks,
//! the others fail with an error naming the limit), and wgpu cannot tell free memory, so a
//! configured capacity ([`WgpuConfig::capacity`]) bounds the device.
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use cachalot_core::{AllocatorConfig, StreamId};
//! use cachalot_shaders::ops::{Activation, ActivationForward};
//! use cachalot_wgpu::{Kernels, WgpuConfig, WgpuContext};
//!
//! let context = WgpuContext::request_blocking(WgpuConfig::with_capacity(1 << 30))?;
//! let mut allocator = cachalot_wgpu::caching_allocator(&context, AllocatorConfig::default())?;
//! let kernels = Kernels::new(context);
//! let x = allocator.malloc(1024 * 4, StreamId::DEFAULT)?;
//! let mut batch = kernels.batch(&mut allocator);
//! batch.fill(&x, 1024, 0.5)?;
//! batch.activation(ActivationForward { act: Activation::Gelu, x: &x, y: &x, n: 1024 })?;
//! let y = batch.read_f32(&x, 1024)?;
//! batch.submit()?;
//! println!("{}", y.wait_f32()?[0]);
//! allocator.free(x)?;
//! # Ok(())
//! # }
//! ```

mod backend;
mod context;
mod error;
mod kernels;
mod pipelines;
mod readback;
mod waiting;

use std::sync::Arc;

use cachalot_core::{AllocatorConfig, AllocatorError, CachingAllocator};

pub use backend::{BufferRange, QueueEvent, WgpuBackend};
pub use context::{DEFAULT_CAPACITY, WgpuConfig, WgpuContext};
pub use error::{KernelError, WgpuError};
pub use kernels::{EncodedBatch, KernelBatch, Kernels, QUEUE_STREAM};
pub use readback::Readback;

/// Alignment of every block address (PyTorch rounds block sizes to 512 bytes), which the
/// adapter's `min_storage_buffer_offset_alignment` must divide.
pub const BLOCK_ALIGNMENT: u64 = 512;

/// A PyTorch-exact caching allocator on `context`'s device.
pub fn caching_allocator(
    context: &Arc<WgpuContext>,
    config: AllocatorConfig,
) -> Result<CachingAllocator<WgpuBackend>, AllocatorError> {
    CachingAllocator::new(WgpuBackend::new(Arc::clone(context)), config)
}
