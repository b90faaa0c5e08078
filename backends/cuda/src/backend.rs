//! `CudaBackend`: the [`cachalot_core::Backend`] capabilities over the CUDA driver.

use std::collections::HashMap;
use std::sync::Arc;

use cachalot_core::{BackendError, DeviceFacts, Pages, Segments, StreamEvents, StreamId};
use cudarc::driver::{CudaEvent, result, sys};

use crate::device::CudaDevice;
use crate::error::{CudaError, backend_error};
use crate::vmm::VirtualMemory;

/// Alignment of every block (PyTorch rounds block sizes to 512 bytes; `cuMemAlloc` returns
/// far more aligned segments).
pub const BLOCK_ALIGNMENT: u64 = 512;

/// The CUDA driver as a cachalot [`cachalot_core::Backend`]: real device memory, streams and events.
///
/// - Segments: `cuMemAlloc` / `cuMemFree` of raw device pointers; a block's
///   [`cachalot_core::Allocation::address`] is a `CUdeviceptr` kernels can use directly.
///   `CUDA_ERROR_OUT_OF_MEMORY` is [`BackendError::OutOfMemory`], which enters the allocator's
///   retry chain exactly where PyTorch's failed `cudaMalloc` does.
/// - Expandable segments: the driver's VMM API (see the `vmm` module): VA reserved per
///   (stream, pool), pages of the size the allocator asks for (2 MiB small, `large_segment_size`
///   large), mapped all or nothing, unmapped after the segment's stream is synchronized.
/// - Events: `cuEventRecord` on the stream at free time, `cuEventQuery` in `process_events`
///   (`CUDA_ERROR_NOT_READY` = not done), from a pool of `CU_EVENT_DISABLE_TIMING` events.
/// - Streams: those of the shared [`CudaDevice`]; a [`StreamId`] is the `CUstream` value. On a
///   device opened with [`CudaDevice::open_with_foreign_streams`], streams someone else made
///   too (PyTorch's): events are recorded on them and pages unmapped after them the same way.
///
/// Dropping the backend (with its allocator) synchronizes the device and frees every segment
/// and page it still holds: allocations must not be used afterwards.
///
/// ```no_run
/// use cachalot_core::{AllocatorConfig, CachingAllocator};
/// use cachalot_cuda::CudaBackend;
///
/// let backend = CudaBackend::new(0)?; // an error, not a panic, without CUDA
/// let stream = backend.cuda().new_stream()?;
/// let mut allocator = CachingAllocator::new(backend, AllocatorConfig::default())?;
/// let x = allocator.malloc(1 << 20, stream)?;
/// println!("{:#x}", x.address()); // a CUdeviceptr
/// allocator.free(x)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct CudaBackend {
    device: Arc<CudaDevice>,
    facts: DeviceFacts,
    /// Live segments: address -> size, so that drop can free what the allocator still holds.
    segments: HashMap<u64, u64>,
    vmm: Option<VirtualMemory>,
    /// Recycled events (PyTorch keeps a pool too: creating events is a driver call).
    event_pool: Vec<CudaEvent>,
}

impl CudaBackend {
    /// A backend for device `ordinal`. Errors (never panics) without `libcuda` or the device.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        Self::with_device(CudaDevice::open(ordinal)?)
    }

    /// A backend on an already opened device (shared with [`crate::CudaKernels`]).
    pub fn with_device(device: Arc<CudaDevice>) -> Result<Self, CudaError> {
        device.bind()?;
        let context = device.context();
        let ordinal = device.ordinal();
        let name = context.name().map_err(CudaError::driver("cuDeviceGetName"))?;
        let total_memory = context.total_mem().map_err(CudaError::driver("cuDeviceTotalMem"))? as u64;
        let vmm_attribute = context
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)
            .map_err(CudaError::driver("cuDeviceGetAttribute"))?;
        let vmm = if vmm_attribute != 0 {
            match VirtualMemory::new(ordinal as i32) {
                Ok(vmm) => Some(vmm),
                Err(error) => {
                    tracing::warn!("virtual memory management unavailable, expandable segments off: {error}");
                    None
                }
            }
        } else {
            None
        };
        let (major, minor) = device.compute_capability();
        let mut details = vec![
            ("compute capability".to_string(), format!("{major}.{minor}")),
            ("multiprocessors".to_string(), device.multiprocessors().to_string()),
        ];
        let mut driver_version = 0;
        // SAFETY: valid out-pointer; the library is loaded (the device opened).
        if unsafe { sys::cuDriverGetVersion(&mut driver_version) }.result().is_ok() {
            details.push((
                "driver CUDA version".into(),
                format!("{}.{}", driver_version / 1000, driver_version % 1000 / 10),
            ));
        }
        if let Some(vmm) = &vmm {
            details.push(("VMM granularity".into(), vmm.granularity().to_string()));
        }
        let facts = DeviceFacts {
            backend: "cuda".into(),
            name,
            index: ordinal as u32,
            total_memory,
            alignment: BLOCK_ALIGNMENT,
            max_segment_size: None,
            max_binding_size: None,
            supports_expandable_segments: vmm.is_some(),
            details,
        };
        Ok(CudaBackend { device, facts, segments: HashMap::new(), vmm, event_pool: Vec::new() })
    }

    /// The shared device: context and streams.
    pub fn cuda(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// Bytes this backend holds on the device: live segments plus mapped pages. Equals the
    /// allocator's `memory_reserved()` (the test of expandable segments checks it).
    pub fn device_bytes(&self) -> u64 {
        self.segments.values().sum::<u64>() + self.mapped_bytes()
    }

    /// Bytes of physical pages mapped in expandable segments.
    pub fn mapped_bytes(&self) -> u64 {
        self.vmm.as_ref().map_or(0, VirtualMemory::mapped_bytes)
    }

    /// Number of live `cuMemAlloc` segments.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Base addresses of every VA reservation made so far, in order (to plan a simulator's
    /// addresses for a replay of the same ops).
    pub fn reservation_bases(&self) -> &[u64] {
        self.vmm.as_ref().map_or(&[], VirtualMemory::history)
    }

    /// Live VA reservations as `(base, size, mapped bytes)`.
    pub fn reservations(&self) -> Vec<(u64, u64, u64)> {
        self.vmm.as_ref().map_or_else(Vec::new, VirtualMemory::reservations)
    }

    fn bind(&self) -> Result<(), BackendError> {
        self.device.bind().map_err(BackendError::from)
    }

    fn vmm(&mut self) -> Result<&mut VirtualMemory, BackendError> {
        match self.vmm.as_mut() {
            Some(vmm) => Ok(vmm),
            None => Err(BackendError::Unsupported {
                backend: "cuda".into(),
                what: format!("virtual memory management on {}", self.facts.name),
            }),
        }
    }
}

impl Segments for CudaBackend {
    fn device(&self) -> &DeviceFacts {
        &self.facts
    }

    fn allocate_segment(&mut self, size: u64, _stream: StreamId) -> Result<u64, BackendError> {
        // cudaMalloc is not stream-ordered: the stream only keys the allocator's pools. cudarc's
        // safe allocation would go through the stream-ordered pool (cuMemAllocAsync) and attach
        // a CudaSlice; PyTorch's native allocator uses plain cudaMalloc, so this does too.
        self.bind()?;
        // SAFETY: a plain device allocation; the pointer is owned by this backend until freed.
        let ptr = unsafe { result::malloc_sync(size as usize) }.map_err(|e| backend_error("cuMemAlloc", e))?;
        self.segments.insert(ptr, size);
        Ok(ptr)
    }

    fn free_segment(&mut self, address: u64, size: u64) -> Result<(), BackendError> {
        match self.segments.get(&address) {
            Some(&len) if len == size => {}
            Some(&len) => {
                return Err(BackendError::Device(format!(
                    "free of {size} bytes at {address:#x}, but the segment has {len}"
                )));
            }
            None => return Err(BackendError::Device(format!("free of unknown segment {address:#x}"))),
        }
        self.bind()?;
        // SAFETY: a live segment of ours. Like the cudaFree PyTorch calls here, cuMemFree
        // synchronizes implicitly with the device's outstanding work.
        unsafe { result::free_sync(address) }.map_err(|e| backend_error("cuMemFree", e))?;
        self.segments.remove(&address);
        Ok(())
    }

    fn memory_info(&mut self) -> Result<(u64, u64), BackendError> {
        self.device.memory_info().map_err(BackendError::from)
    }

    fn now_us(&mut self) -> i64 {
        // PyTorch stamps trace entries with microseconds since the Unix epoch.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
    }
}

impl Pages for CudaBackend {
    fn reserve_address_space(&mut self, size: u64, page_size: u64, _stream: StreamId) -> Result<u64, BackendError> {
        self.bind()?;
        self.vmm()?.reserve(size, page_size)
    }

    fn map_pages(&mut self, base: u64, offset: u64, size: u64) -> Result<(), BackendError> {
        self.bind()?;
        self.vmm()?.map(base, offset, size)
    }

    fn unmap_pages(&mut self, base: u64, offset: u64, size: u64, stream: StreamId) -> Result<(), BackendError> {
        self.bind()?;
        // PyTorch synchronizes the segment's stream before unmapping; a stream this device
        // neither made nor takes as foreign is covered by synchronizing the whole device.
        let synchronized = match self.device.stream(stream) {
            Ok(s) => s.synchronize().map_err(|e| backend_error("cuStreamSynchronize", e)),
            Err(_) => self.device.synchronize().map_err(BackendError::from),
        };
        synchronized?;
        self.vmm()?.unmap(base, offset, size)
    }

    fn release_address_space(&mut self, base: u64, size: u64) -> Result<(), BackendError> {
        self.bind()?;
        self.vmm()?.release(base, size)
    }
}

impl StreamEvents for CudaBackend {
    type Event = CudaEvent;

    fn record_event(&mut self, stream: StreamId) -> Result<CudaEvent, BackendError> {
        let cuda_stream = self.device.stream(stream).map_err(BackendError::from)?;
        let event = match self.event_pool.pop() {
            Some(event) => event,
            None => self.device.context().new_event(None).map_err(|e| backend_error("cuEventCreate", e))?,
        };
        match event.record(&cuda_stream) {
            Ok(()) => Ok(event),
            Err(e) => {
                self.event_pool.push(event);
                Err(backend_error("cuEventRecord", e))
            }
        }
    }

    fn query_event(&mut self, event: &CudaEvent) -> Result<bool, BackendError> {
        // The allocator may be driven from another thread than the one that made the event.
        self.bind()?;
        // Ok(false) exactly for CUDA_ERROR_NOT_READY; other errors (of earlier launches too)
        // are reported.
        event.try_is_complete().map_err(|e| backend_error("cuEventQuery", e))
    }

    fn synchronize_event(&mut self, event: &CudaEvent) -> Result<(), BackendError> {
        event.synchronize().map_err(|e| backend_error("cuEventSynchronize", e))
    }

    fn release_event(&mut self, event: CudaEvent) {
        self.event_pool.push(event);
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if self.device.bind().is_err() {
            return;
        }
        // Work queued on any stream may still use the memory.
        let _ = self.device.synchronize();
        for (&ptr, _) in self.segments.iter() {
            // SAFETY: our live segments; the device is idle.
            let _ = unsafe { result::free_sync(ptr) };
        }
        self.segments.clear();
        if let Some(vmm) = self.vmm.as_mut() {
            vmm.release_all();
        }
    }
}
