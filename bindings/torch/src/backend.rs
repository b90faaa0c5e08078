//! `DeviceBackend`: the device under one PyTorch device's allocator — CUDA with PyTorch's own
//! streams, or the simulator for tests and machines without a GPU.
//!
//! PyTorch hands the allocator raw `cudaStream_t`s it created itself (`torch.cuda.Stream()`,
//! NCCL's streams, the legacy default stream 0). `cachalot-cuda`'s [`CudaBackend`] records its
//! events on streams of its own [`cachalot_cuda::CudaDevice`] and knows no others, so the CUDA
//! variant here keeps `CudaBackend` for segments and pages and records the events itself, with
//! the driver, on the caller's stream handle: the [`StreamId`] *is* the `cudaStream_t` value.

use cachalot_core::{Backend, BackendError, DeviceFacts, SimBackend, StreamId};
use cachalot_cuda::CudaBackend;
use cachalot_cuda::cudarc::driver::{DriverError, result, sys};

/// The device of one allocator.
#[derive(Debug)]
pub enum DeviceBackend {
    /// A CUDA device, driven through PyTorch's streams.
    Cuda(TorchCudaBackend),
    /// The simulator: streams are whatever numbers the caller passes, instantly idle unless a
    /// test holds one busy ([`SimBackend::hold_stream`]).
    Sim(SimBackend),
}

/// An event of a [`DeviceBackend`].
#[derive(Debug)]
pub enum DeviceEvent {
    /// A `CUevent` recorded on a PyTorch stream.
    Cuda(RawEvent),
    /// A simulator event.
    Sim(<SimBackend as Backend>::Event),
}

/// A `CUevent` made with `CU_EVENT_DISABLE_TIMING`, owned by the backend's pool.
#[derive(Debug)]
pub struct RawEvent(sys::CUevent);

// SAFETY: a CUevent is a handle the driver lets any thread use; the allocator that owns it is
// only ever used under its device's mutex.
unsafe impl Send for RawEvent {}

/// [`CudaBackend`] for segments and pages, with events recorded on raw PyTorch streams.
#[derive(Debug)]
pub struct TorchCudaBackend {
    inner: CudaBackend,
    /// Recycled events (creating one is a driver call; PyTorch pools them too).
    event_pool: Vec<RawEvent>,
}

impl TorchCudaBackend {
    /// Opens CUDA device `ordinal` (its primary context, the one PyTorch's runtime uses).
    pub fn new(ordinal: usize) -> Result<Self, cachalot_cuda::CudaError> {
        Ok(TorchCudaBackend { inner: CudaBackend::new(ordinal)?, event_pool: Vec::new() })
    }

    /// The segment-and-page backend underneath.
    pub fn cuda(&self) -> &CudaBackend {
        &self.inner
    }

    fn bind(&self) -> Result<(), BackendError> {
        self.inner.cuda().bind().map_err(BackendError::from)
    }

    /// Whether `stream` is capturing a CUDA graph. The legacy default stream (0) counts as
    /// capturing while another stream of the context captures in global or thread-local mode,
    /// where the driver refuses to say (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`): work on it would
    /// join the capture.
    pub fn capture_status(&self, stream: StreamId) -> Result<bool, BackendError> {
        use sys::CUresult::{CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT};
        // SAFETY: a stream handle PyTorch gave the allocator (or 0, the legacy stream).
        let query = || unsafe { result::stream::is_capturing(raw_stream(stream)) };
        let status = match query() {
            // A thread PyTorch has not yet bound to the device asks about the legacy stream.
            Err(e) if e.0 == CUDA_ERROR_INVALID_CONTEXT => {
                self.bind()?;
                query()
            }
            other => other,
        };
        match status {
            Ok(status) => Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE),
            Err(e) if e.0 == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => Ok(true),
            Err(e) => Err(driver_error("cuStreamIsCapturing", e)),
        }
    }
}

fn driver_error(call: &str, error: DriverError) -> BackendError {
    BackendError::Device(format!("{call} failed: {error:?}"))
}

/// The stream handle PyTorch passed, back as the driver's type.
fn raw_stream(stream: StreamId) -> sys::CUstream {
    stream.0 as usize as sys::CUstream
}

impl Backend for TorchCudaBackend {
    type Event = RawEvent;

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

    fn reserve_address_space(&mut self, size: u64, page_size: u64, stream: StreamId) -> Result<u64, BackendError> {
        self.inner.reserve_address_space(size, page_size, stream)
    }

    fn map_pages(&mut self, base: u64, offset: u64, size: u64) -> Result<(), BackendError> {
        self.inner.map_pages(base, offset, size)
    }

    fn unmap_pages(&mut self, base: u64, offset: u64, size: u64, stream: StreamId) -> Result<(), BackendError> {
        // PyTorch synchronizes the segment's stream before unmapping. The inner backend only
        // knows its own streams, so the PyTorch stream is synchronized here and the inner call
        // gets the default stream, which it synchronizes too (cheap, and never too little).
        self.bind()?;
        // SAFETY: a stream handle PyTorch gave the allocator; PyTorch's streams outlive its
        // memory (pool streams are never destroyed).
        unsafe { result::stream::synchronize(raw_stream(stream)) }
            .map_err(|e| driver_error("cuStreamSynchronize", e))?;
        self.inner.unmap_pages(base, offset, size, StreamId::DEFAULT)
    }

    fn release_address_space(&mut self, base: u64, size: u64) -> Result<(), BackendError> {
        self.inner.release_address_space(base, size)
    }

    fn record_event(&mut self, stream: StreamId) -> Result<RawEvent, BackendError> {
        self.bind()?;
        let event = match self.event_pool.pop() {
            Some(event) => event,
            None => RawEvent(
                result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .map_err(|e| driver_error("cuEventCreate", e))?,
            ),
        };
        // SAFETY: our live event, and a stream handle PyTorch gave the allocator.
        match unsafe { result::event::record(event.0, raw_stream(stream)) } {
            Ok(()) => Ok(event),
            Err(e) => {
                self.event_pool.push(event);
                Err(driver_error("cuEventRecord", e))
            }
        }
    }

    fn query_event(&mut self, event: &RawEvent) -> Result<bool, BackendError> {
        // SAFETY: our live event.
        match unsafe { result::event::query(event.0) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(driver_error("cuEventQuery", e)),
        }
    }

    fn synchronize_event(&mut self, event: &RawEvent) -> Result<(), BackendError> {
        // SAFETY: our live event.
        unsafe { result::event::synchronize(event.0) }.map_err(|e| driver_error("cuEventSynchronize", e))
    }

    fn release_event(&mut self, event: RawEvent) {
        self.event_pool.push(event);
    }

    fn now_us(&mut self) -> i64 {
        self.inner.now_us()
    }

    fn process_memory_text(&mut self) -> String {
        self.inner.process_memory_text()
    }
}

impl Drop for TorchCudaBackend {
    fn drop(&mut self) {
        for event in self.event_pool.drain(..) {
            // SAFETY: pooled events are not recorded anywhere any more.
            let _ = unsafe { result::event::destroy(event.0) };
        }
    }
}

impl DeviceBackend {
    /// Whether `stream` is capturing a CUDA graph ([`TorchCudaBackend::capture_status`]); the
    /// simulator never captures.
    pub fn capture_status(&self, stream: StreamId) -> Result<bool, BackendError> {
        match self {
            DeviceBackend::Cuda(b) => b.capture_status(stream),
            DeviceBackend::Sim(_) => Ok(false),
        }
    }
}

impl Backend for DeviceBackend {
    type Event = DeviceEvent;

    fn device(&self) -> &DeviceFacts {
        match self {
            DeviceBackend::Cuda(b) => b.device(),
            DeviceBackend::Sim(b) => b.device(),
        }
    }

    fn allocate_segment(&mut self, size: u64, stream: StreamId) -> Result<u64, BackendError> {
        match self {
            DeviceBackend::Cuda(b) => b.allocate_segment(size, stream),
            DeviceBackend::Sim(b) => b.allocate_segment(size, stream),
        }
    }

    fn free_segment(&mut self, address: u64, size: u64) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cuda(b) => b.free_segment(address, size),
            DeviceBackend::Sim(b) => b.free_segment(address, size),
        }
    }

    fn memory_info(&mut self) -> Result<(u64, u64), BackendError> {
        match self {
            DeviceBackend::Cuda(b) => b.memory_info(),
            DeviceBackend::Sim(b) => b.memory_info(),
        }
    }

    fn reserve_address_space(&mut self, size: u64, page_size: u64, stream: StreamId) -> Result<u64, BackendError> {
        match self {
            DeviceBackend::Cuda(b) => b.reserve_address_space(size, page_size, stream),
            DeviceBackend::Sim(b) => b.reserve_address_space(size, page_size, stream),
        }
    }

    fn map_pages(&mut self, base: u64, offset: u64, size: u64) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cuda(b) => b.map_pages(base, offset, size),
            DeviceBackend::Sim(b) => b.map_pages(base, offset, size),
        }
    }

    fn unmap_pages(&mut self, base: u64, offset: u64, size: u64, stream: StreamId) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cuda(b) => b.unmap_pages(base, offset, size, stream),
            DeviceBackend::Sim(b) => b.unmap_pages(base, offset, size, stream),
        }
    }

    fn release_address_space(&mut self, base: u64, size: u64) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cuda(b) => b.release_address_space(base, size),
            DeviceBackend::Sim(b) => b.release_address_space(base, size),
        }
    }

    fn record_event(&mut self, stream: StreamId) -> Result<DeviceEvent, BackendError> {
        match self {
            DeviceBackend::Cuda(b) => b.record_event(stream).map(DeviceEvent::Cuda),
            DeviceBackend::Sim(b) => b.record_event(stream).map(DeviceEvent::Sim),
        }
    }

    fn query_event(&mut self, event: &DeviceEvent) -> Result<bool, BackendError> {
        match (self, event) {
            (DeviceBackend::Cuda(b), DeviceEvent::Cuda(e)) => b.query_event(e),
            (DeviceBackend::Sim(b), DeviceEvent::Sim(e)) => b.query_event(e),
            _ => Err(mismatched_event()),
        }
    }

    fn synchronize_event(&mut self, event: &DeviceEvent) -> Result<(), BackendError> {
        match (self, event) {
            (DeviceBackend::Cuda(b), DeviceEvent::Cuda(e)) => b.synchronize_event(e),
            (DeviceBackend::Sim(b), DeviceEvent::Sim(e)) => b.synchronize_event(e),
            _ => Err(mismatched_event()),
        }
    }

    fn release_event(&mut self, event: DeviceEvent) {
        match (self, event) {
            (DeviceBackend::Cuda(b), DeviceEvent::Cuda(e)) => b.release_event(e),
            (DeviceBackend::Sim(b), DeviceEvent::Sim(e)) => b.release_event(e),
            // Cannot happen (each backend only sees its own events); dropping is safe.
            _ => {}
        }
    }

    fn now_us(&mut self) -> i64 {
        match self {
            DeviceBackend::Cuda(b) => b.now_us(),
            DeviceBackend::Sim(b) => b.now_us(),
        }
    }

    fn process_memory_text(&mut self) -> String {
        match self {
            DeviceBackend::Cuda(b) => b.process_memory_text(),
            DeviceBackend::Sim(b) => b.process_memory_text(),
        }
    }
}

fn mismatched_event() -> BackendError {
    BackendError::Device("an event of another kind of device".into())
}
