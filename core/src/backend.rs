//! What differs between devices: raw segments, optional VA reservations with page mapping,
//! stream events and device facts. All policy stays in the allocator.

use std::fmt;

/// A stream, identified the way PyTorch orders blocks: by the numeric value of its handle
/// (`cudaStream_t` as an integer; the default stream is 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct StreamId(pub u64);

impl StreamId {
    /// The default (legacy) stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Facts about the device a backend drives.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeviceFacts {
    /// Backend family: `"cuda"`, `"wgpu"` or `"sim"`.
    pub backend: String,
    /// Device name, e.g. `"NVIDIA H200"` or `"llvmpipe (LLVM 15.0.6, 256 bits)"`.
    pub name: String,
    /// Device ordinal (`GPU N` in out-of-memory messages).
    pub index: u32,
    /// Total device memory in bytes (`totalGlobalMem`), or the configured capacity where the
    /// API cannot tell (wgpu).
    pub total_memory: u64,
    /// Alignment every segment address and block offset satisfies.
    pub alignment: u64,
    /// Largest single segment the device can create, if limited (wgpu `max_buffer_size`).
    pub max_segment_size: Option<u64>,
    /// Largest range one kernel binding may cover, if limited (wgpu
    /// `max_storage_buffer_binding_size`).
    pub max_binding_size: Option<u64>,
    /// Whether the backend can reserve VA and map pages (needed by `expandable_segments`).
    pub supports_expandable_segments: bool,
    /// Free-form details (driver version, adapter type, ...), shown by tools.
    pub details: Vec<(String, String)>,
}

/// A device call that failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// The device could not provide the memory. `limit` names a device limit that was hit,
    /// when the cause is a limit rather than exhausted memory (e.g. wgpu's `max_buffer_size`).
    #[error("out of device memory{}", .limit.as_ref().map(|l| format!(" ({l})")).unwrap_or_default())]
    OutOfMemory {
        /// The limit that refused the request, if any.
        limit: Option<String>,
    },
    /// The backend does not offer this capability.
    #[error("not supported by the {backend} backend: {what}")]
    Unsupported {
        /// Backend family.
        backend: String,
        /// The capability.
        what: String,
    },
    /// Any other device or driver error.
    #[error("{0}")]
    Device(String),
}

impl BackendError {
    /// A plain out-of-memory error.
    pub fn out_of_memory() -> Self {
        BackendError::OutOfMemory { limit: None }
    }
}

/// The device operations the caching allocator needs.
///
/// Implementations: [`crate::SimBackend`] here, `cachalot-cuda` (CUDA driver through cudarc)
/// and `cachalot-wgpu`. Addresses are device addresses for CUDA and the simulator; the wgpu
/// backend hands out addresses in a virtual space of its own and maps them to buffers.
///
/// A backend provides segments, events and facts; every decision is the allocator's. This one
/// wraps the simulator and counts the device allocations it is asked for (expandable segments'
/// page calls have defaults that say the backend does not support them):
///
/// ```
/// use cachalot_core::{AllocatorConfig, Backend, BackendError, CachingAllocator, DeviceFacts, SimBackend, StreamId};
///
/// struct Counting {
///     device: SimBackend,
///     segments: u64,
/// }
///
/// impl Backend for Counting {
///     type Event = <SimBackend as Backend>::Event;
///     fn device(&self) -> &DeviceFacts {
///         self.device.device()
///     }
///     fn allocate_segment(&mut self, size: u64, stream: StreamId) -> Result<u64, BackendError> {
///         self.segments += 1;
///         self.device.allocate_segment(size, stream)
///     }
///     fn free_segment(&mut self, address: u64, size: u64) -> Result<(), BackendError> {
///         self.device.free_segment(address, size)
///     }
///     fn memory_info(&mut self) -> Result<(u64, u64), BackendError> {
///         self.device.memory_info()
///     }
///     fn record_event(&mut self, stream: StreamId) -> Result<Self::Event, BackendError> {
///         self.device.record_event(stream)
///     }
///     fn query_event(&mut self, event: &Self::Event) -> Result<bool, BackendError> {
///         self.device.query_event(event)
///     }
///     fn synchronize_event(&mut self, event: &Self::Event) -> Result<(), BackendError> {
///         self.device.synchronize_event(event)
///     }
/// }
///
/// let backend = Counting { device: SimBackend::new(1 << 30), segments: 0 };
/// let mut allocator = CachingAllocator::new(backend, AllocatorConfig::default())?;
/// for _ in 0..3 {
///     let x = allocator.malloc(4 << 20, StreamId::DEFAULT)?;
///     allocator.free(x)?; // cached: the next malloc takes the same block
/// }
/// assert_eq!(allocator.backend().segments, 1);
/// # Ok::<(), cachalot_core::AllocatorError>(())
/// ```
pub trait Backend {
    /// A recorded point in a stream's work (CUDA event, wgpu submission index, ...).
    type Event;

    /// Facts about the device.
    fn device(&self) -> &DeviceFacts;

    /// Allocates a segment of `size` bytes for use on `stream` (`cudaMalloc`).
    /// A device that is out of memory answers [`BackendError::OutOfMemory`].
    fn allocate_segment(&mut self, size: u64, stream: StreamId) -> Result<u64, BackendError>;

    /// Frees a segment returned by [`Backend::allocate_segment`] (`cudaFree`).
    fn free_segment(&mut self, address: u64, size: u64) -> Result<(), BackendError>;

    /// `(free, total)` device memory (`cudaMemGetInfo`), for out-of-memory messages.
    fn memory_info(&mut self) -> Result<(u64, u64), BackendError>;

    /// Reserves `size` bytes of virtual address space whose pages of `page_size` bytes will be
    /// mapped on demand (`cuMemAddressReserve`).
    fn reserve_address_space(&mut self, size: u64, page_size: u64, stream: StreamId) -> Result<u64, BackendError> {
        let _ = (size, page_size, stream);
        Err(self.unsupported("expandable segments (virtual memory mapping)"))
    }

    /// Backs `[base + offset, base + offset + size)` of a reservation with physical pages
    /// (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`). All or nothing: on failure nothing stays
    /// mapped.
    fn map_pages(&mut self, base: u64, offset: u64, size: u64) -> Result<(), BackendError> {
        let _ = (base, offset, size);
        Err(self.unsupported("expandable segments (virtual memory mapping)"))
    }

    /// Unmaps and releases the pages of a range after the work of `stream` is done
    /// (`cudaStreamSynchronize` + `cuMemUnmap` + `cuMemRelease`).
    fn unmap_pages(&mut self, base: u64, offset: u64, size: u64, stream: StreamId) -> Result<(), BackendError> {
        let _ = (base, offset, size, stream);
        Err(self.unsupported("expandable segments (virtual memory mapping)"))
    }

    /// Releases a reservation with nothing mapped in it (`cuMemAddressFree`).
    fn release_address_space(&mut self, base: u64, size: u64) -> Result<(), BackendError> {
        let _ = (base, size);
        Err(self.unsupported("expandable segments (virtual memory mapping)"))
    }

    /// Records an event at the current end of `stream`'s work (`cudaEventRecord`).
    fn record_event(&mut self, stream: StreamId) -> Result<Self::Event, BackendError>;

    /// Whether the work before `event` has finished (`cudaEventQuery`).
    fn query_event(&mut self, event: &Self::Event) -> Result<bool, BackendError>;

    /// Waits for the work before `event` (`cudaEventSynchronize`).
    fn synchronize_event(&mut self, event: &Self::Event) -> Result<(), BackendError>;

    /// Returns an event that is no longer needed (to a pool, or drops it).
    fn release_event(&mut self, event: Self::Event) {
        drop(event);
    }

    /// Wall-clock time in microseconds for trace entries.
    fn now_us(&mut self) -> i64 {
        0
    }

    /// The per-process memory sentence of PyTorch's OOM message ("Including non-PyTorch memory,
    /// this process has ... memory in use. "), where the backend can tell; empty otherwise.
    fn process_memory_text(&mut self) -> String {
        String::new()
    }

    /// Helper for the default methods.
    fn unsupported(&self, what: &str) -> BackendError {
        BackendError::Unsupported { backend: self.device().backend.clone(), what: what.to_owned() }
    }
}
