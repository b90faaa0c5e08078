//! What differs between devices, as capabilities (small traits a backend composes, as CubeCL's
//! `ComputeStorage` and `VirtualStorage`):
//!
//! - [`Segments`]: the device's facts and raw segments (`cudaMalloc` / `cudaFree`).
//! - [`Pages`]: virtual-memory pages, VA reserved and pages mapped on demand (expandable
//!   segments); every method defaults to "not supported".
//! - [`StreamEvents`]: events recorded on streams, the allocator's only view of the device's work.
//! - [`Backend`]: all three, what [`crate::CachingAllocator`] runs on. Implemented for every type
//!   that has them; nobody implements it by hand.
//!
//! A backend that takes its events from somewhere else keeps the device's segments and pages and
//! swaps only the events: [`WithEvents`] puts an [`EventLayer`] over a backend (the replay's
//! stand-in streams, a test's events that lie) without another backend written by hand. All policy
//! stays in the allocator.

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

/// The device's facts and its raw segments: what every backend has.
///
/// Implementations: [`crate::SimBackend`] here, `cachalot-cuda` (CUDA driver through cudarc)
/// and `cachalot-wgpu`. Addresses are device addresses for CUDA and the simulator; the wgpu
/// backend hands out addresses in a virtual space of its own and maps them to buffers.
///
/// A backend provides segments, events and facts; every decision is the allocator's. This one
/// is the smallest: addresses from a counter, no virtual memory ([`Pages`]' defaults refuse
/// expandable segments), and work that is always done:
///
/// ```
/// use cachalot_core::{AllocatorConfig, BackendError, CachingAllocator, DeviceFacts, StreamId};
/// use cachalot_core::backend::{Pages, Segments, StreamEvents};
///
/// struct Counter {
///     facts: DeviceFacts,
///     next: u64,
///     used: u64,
/// }
///
/// impl Segments for Counter {
///     fn device(&self) -> &DeviceFacts {
///         &self.facts
///     }
///     fn allocate_segment(&mut self, size: u64, _stream: StreamId) -> Result<u64, BackendError> {
///         if self.used + size > self.facts.total_memory {
///             return Err(BackendError::out_of_memory());
///         }
///         let address = self.next;
///         self.next += size.next_multiple_of(self.facts.alignment);
///         self.used += size;
///         Ok(address)
///     }
///     fn free_segment(&mut self, _address: u64, size: u64) -> Result<(), BackendError> {
///         self.used -= size;
///         Ok(())
///     }
///     fn memory_info(&mut self) -> Result<(u64, u64), BackendError> {
///         Ok((self.facts.total_memory - self.used, self.facts.total_memory))
///     }
/// }
///
/// impl Pages for Counter {}
///
/// impl StreamEvents for Counter {
///     type Event = ();
///     fn record_event(&mut self, _stream: StreamId) -> Result<(), BackendError> {
///         Ok(())
///     }
///     fn query_event(&mut self, _event: &()) -> Result<bool, BackendError> {
///         Ok(true)
///     }
///     fn synchronize_event(&mut self, _event: &()) -> Result<(), BackendError> {
///         Ok(())
///     }
/// }
///
/// let facts = DeviceFacts {
///     backend: "counter".into(),
///     name: "a counter".into(),
///     index: 0,
///     total_memory: 1 << 30,
///     alignment: 512,
///     max_segment_size: None,
///     max_binding_size: None,
///     supports_expandable_segments: false,
///     details: Vec::new(),
/// };
/// let mut allocator = CachingAllocator::new(Counter { facts, next: 1 << 40, used: 0 }, AllocatorConfig::default())?;
/// for _ in 0..3 {
///     let x = allocator.malloc(4 << 20, StreamId::DEFAULT)?;
///     allocator.free(x)?; // cached: the next malloc takes the same block
/// }
/// assert_eq!(allocator.backend().used, 20 << 20); // one large segment
/// # Ok::<(), cachalot_core::AllocatorError>(())
/// ```
pub trait Segments {
    /// Facts about the device.
    fn device(&self) -> &DeviceFacts;

    /// Allocates a segment of `size` bytes for use on `stream` (`cudaMalloc`).
    /// A device that is out of memory answers [`BackendError::OutOfMemory`].
    fn allocate_segment(&mut self, size: u64, stream: StreamId) -> Result<u64, BackendError>;

    /// Frees a segment returned by [`Segments::allocate_segment`] (`cudaFree`).
    fn free_segment(&mut self, address: u64, size: u64) -> Result<(), BackendError>;

    /// `(free, total)` device memory (`cudaMemGetInfo`), for out-of-memory messages.
    fn memory_info(&mut self) -> Result<(u64, u64), BackendError>;

    /// Wall-clock time in microseconds for trace entries.
    fn now_us(&mut self) -> i64 {
        0
    }

    /// The per-process memory sentence of PyTorch's OOM message ("Including non-PyTorch memory,
    /// this process has ... memory in use. "), where the backend can tell; empty otherwise.
    fn process_memory_text(&mut self) -> String {
        String::new()
    }

    /// The error of a capability this backend does not offer.
    fn unsupported(&self, what: &str) -> BackendError {
        BackendError::Unsupported { backend: self.device().backend.clone(), what: what.to_owned() }
    }
}

/// Virtual-memory pages: VA reserved once, physical pages mapped into it on demand (what
/// `expandable_segments` needs). Every method defaults to [`BackendError::Unsupported`], so a
/// backend without virtual memory writes `impl Pages for MyBackend {}`; the allocator asks
/// only when [`DeviceFacts::supports_expandable_segments`] says yes.
pub trait Pages: Segments {
    /// Reserves `size` bytes of virtual address space whose pages of `page_size` bytes will be
    /// mapped on demand (`cuMemAddressReserve`).
    fn reserve_address_space(&mut self, size: u64, page_size: u64, stream: StreamId) -> Result<u64, BackendError> {
        let _ = (size, page_size, stream);
        Err(self.unsupported(NO_PAGES))
    }

    /// Backs `[base + offset, base + offset + size)` of a reservation with physical pages
    /// (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`). All or nothing: on failure nothing stays
    /// mapped.
    fn map_pages(&mut self, base: u64, offset: u64, size: u64) -> Result<(), BackendError> {
        let _ = (base, offset, size);
        Err(self.unsupported(NO_PAGES))
    }

    /// Unmaps and releases the pages of a range after the work of `stream` is done
    /// (`cudaStreamSynchronize` + `cuMemUnmap` + `cuMemRelease`).
    fn unmap_pages(&mut self, base: u64, offset: u64, size: u64, stream: StreamId) -> Result<(), BackendError> {
        let _ = (base, offset, size, stream);
        Err(self.unsupported(NO_PAGES))
    }

    /// Releases a reservation with nothing mapped in it (`cuMemAddressFree`).
    fn release_address_space(&mut self, base: u64, size: u64) -> Result<(), BackendError> {
        let _ = (base, size);
        Err(self.unsupported(NO_PAGES))
    }
}

const NO_PAGES: &str = "expandable segments (virtual memory mapping)";

/// Events on streams: how the allocator learns that work which used a block has finished (a
/// block freed after use on another stream waits for them).
pub trait StreamEvents {
    /// A recorded point in a stream's work (CUDA event, wgpu submission index, ...).
    type Event;

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
}

/// Everything the caching allocator needs of a device: segments, pages and stream events.
///
/// Implemented for every type with the three capabilities; implement those instead.
pub trait Backend: Pages + StreamEvents {}

impl<T: Pages + StreamEvents> Backend for T {}

/// Stream events layered over a backend's own: a layer answers for the streams it takes over
/// and passes the others to the backend underneath ([`WithEvents`]).
pub trait EventLayer<B: StreamEvents> {
    /// The layer's events (typically its own, or one of the backend's).
    type Event;

    /// Records an event at the current end of `stream`'s work.
    fn record_event(&mut self, device: &mut B, stream: StreamId) -> Result<Self::Event, BackendError>;

    /// Whether the work before `event` has finished.
    fn query_event(&mut self, device: &mut B, event: &Self::Event) -> Result<bool, BackendError>;

    /// Waits for the work before `event`.
    fn synchronize_event(&mut self, device: &mut B, event: &Self::Event) -> Result<(), BackendError>;

    /// Returns an event that is no longer needed.
    fn release_event(&mut self, device: &mut B, event: Self::Event) {
        let _ = device;
        drop(event);
    }
}

/// A backend's segments and pages with the stream events of a layer over its own: the way to
/// change how events are made without writing another backend.
#[derive(Clone, Debug)]
pub struct WithEvents<B, L> {
    inner: B,
    layer: L,
}

impl<B, L> WithEvents<B, L> {
    /// `inner`'s memory, with `layer` over its events.
    pub fn new(inner: B, layer: L) -> Self {
        WithEvents { inner, layer }
    }

    /// The backend underneath.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The backend underneath, mutably.
    pub fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// The event layer.
    pub fn layer(&self) -> &L {
        &self.layer
    }

    /// The event layer, mutably.
    pub fn layer_mut(&mut self) -> &mut L {
        &mut self.layer
    }

    /// The backend and the layer, apart again.
    pub fn into_parts(self) -> (B, L) {
        (self.inner, self.layer)
    }
}

impl<B: Segments, L> Segments for WithEvents<B, L> {
    fn device(&self) -> &DeviceFacts {
        self.inner.device()
    }
    fn allocate_segment(&mut self, size: u64, stream: StreamId) -> Result<u64, BackendError> {
        self.inner.allocate_segment(size, stream)
    }
    fn free_segment(&mut self, address: u64, size: u64) -> Result<(), BackendError> {
        self.inner.free_segment(address, size)
    }
    fn memory_info(&mut self) -> Result<(u64, u64), BackendError> {
        self.inner.memory_info()
    }
    fn now_us(&mut self) -> i64 {
        self.inner.now_us()
    }
    fn process_memory_text(&mut self) -> String {
        self.inner.process_memory_text()
    }
}

impl<B: Pages, L> Pages for WithEvents<B, L> {
    fn reserve_address_space(&mut self, size: u64, page_size: u64, stream: StreamId) -> Result<u64, BackendError> {
        self.inner.reserve_address_space(size, page_size, stream)
    }
    fn map_pages(&mut self, base: u64, offset: u64, size: u64) -> Result<(), BackendError> {
        self.inner.map_pages(base, offset, size)
    }
    fn unmap_pages(&mut self, base: u64, offset: u64, size: u64, stream: StreamId) -> Result<(), BackendError> {
        self.inner.unmap_pages(base, offset, size, stream)
    }
    fn release_address_space(&mut self, base: u64, size: u64) -> Result<(), BackendError> {
        self.inner.release_address_space(base, size)
    }
}

impl<B: StreamEvents, L: EventLayer<B>> StreamEvents for WithEvents<B, L> {
    type Event = L::Event;

    fn record_event(&mut self, stream: StreamId) -> Result<L::Event, BackendError> {
        self.layer.record_event(&mut self.inner, stream)
    }
    fn query_event(&mut self, event: &L::Event) -> Result<bool, BackendError> {
        self.layer.query_event(&mut self.inner, event)
    }
    fn synchronize_event(&mut self, event: &L::Event) -> Result<(), BackendError> {
        self.layer.synchronize_event(&mut self.inner, event)
    }
    fn release_event(&mut self, event: L::Event) {
        self.layer.release_event(&mut self.inner, event);
    }
}
