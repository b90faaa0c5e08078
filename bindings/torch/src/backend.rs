//! `DeviceBackend`: the device under one PyTorch device's allocator — CUDA on PyTorch's own
//! streams, or the simulator for tests and machines without a GPU.
//!
//! PyTorch hands the allocator raw `cudaStream_t`s it created itself (`torch.cuda.Stream()`,
//! NCCL's streams, the legacy default stream 0). The CUDA variant is `cachalot-cuda`'s
//! [`CudaBackend`] on a device that takes foreign streams
//! ([`CudaDevice::open_with_foreign_streams`]): the [`StreamId`] *is* the `cudaStream_t` value,
//! and the backend's own events are recorded on it.

use cachalot_core::{BackendError, DeviceFacts, Pages, Segments, SimBackend, StreamEvents, StreamId};
use cachalot_cuda::cudarc::driver::CudaEvent;
use cachalot_cuda::{CudaBackend, CudaDevice, CudaError};

/// The device of one allocator. The choice is made at run time (the settings say which), so
/// each capability is passed to the variant's.
#[derive(Debug)]
pub enum DeviceBackend {
    /// A CUDA device, driven through PyTorch's streams.
    Cuda(CudaBackend),
    /// The simulator: streams are whatever numbers the caller passes, instantly idle unless a
    /// test holds one busy ([`SimBackend::hold_stream`]).
    Sim(SimBackend),
}

/// An event of a [`DeviceBackend`].
#[derive(Debug)]
pub enum DeviceEvent {
    /// A `CUevent` recorded on a PyTorch stream.
    Cuda(CudaEvent),
    /// A simulator event.
    Sim(<SimBackend as StreamEvents>::Event),
}

impl DeviceBackend {
    /// CUDA device `ordinal` (its primary context, the one PyTorch's runtime uses), taking the
    /// streams PyTorch passes.
    pub fn cuda(ordinal: usize) -> Result<Self, CudaError> {
        // SAFETY: the allocator is only given PyTorch's `cudaStream_t`s for this device (its
        // current stream at each call, or the stream of `record_stream`), handles of the
        // primary context that PyTorch keeps alive while memory used on them may be waited for
        // (its pool streams are never destroyed), as PyTorch's own allocator assumes.
        let device = unsafe { CudaDevice::open_with_foreign_streams(ordinal) }?;
        Ok(DeviceBackend::Cuda(CudaBackend::with_device(device)?))
    }

    /// Whether `stream` is capturing a CUDA graph ([`CudaDevice::is_capturing`]); the simulator
    /// never captures.
    pub fn capture_status(&self, stream: StreamId) -> Result<bool, BackendError> {
        match self {
            DeviceBackend::Cuda(b) => b.cuda().is_capturing(stream).map_err(BackendError::from),
            DeviceBackend::Sim(_) => Ok(false),
        }
    }
}

impl Segments for DeviceBackend {
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

impl Pages for DeviceBackend {
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
}

impl StreamEvents for DeviceBackend {
    type Event = DeviceEvent;

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
}

fn mismatched_event() -> BackendError {
    BackendError::Device("an event of another kind of device".into())
}
