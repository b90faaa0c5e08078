//! `CudaDevice`: one CUDA device's context and the streams cachalot knows by [`StreamId`].
//!
//! Both halves of the crate hold it through an `Arc`: the [`crate::CudaBackend`] (segments,
//! pages, events) and the [`crate::CudaKernels`] (launches, cuBLAS), so a kernel can run on any
//! stream the allocator allocates for without borrowing the allocator.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, RwLock};

use cachalot_core::StreamId;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, result, sys};

use crate::error::CudaError;

/// Whether `libcuda` can be loaded. Checked once: cudarc panics on the first driver call when
/// the library is missing, so nothing here calls the driver before this says yes.
pub fn driver_library_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library by its candidate names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Whether `libnvrtc` can be loaded (needed by [`crate::CudaKernels`]).
pub fn nvrtc_library_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: as above.
    *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

/// Whether `libcublas` and `libcublasLt` can be loaded (needed by the matrix products).
pub fn cublas_libraries_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: as above.
    *PRESENT
        .get_or_init(|| unsafe { cudarc::cublas::sys::is_culib_present() && cudarc::cublaslt::sys::is_culib_present() })
}

/// The error for a missing `libcuda`.
pub(crate) fn missing_driver() -> CudaError {
    CudaError::LibraryMissing {
        library: "libcuda",
        hint: "it comes with the NVIDIA driver, which this machine does not have or does not put on the loader path",
    }
}

/// Number of CUDA devices the driver sees, or why there are none. Never panics.
pub fn device_count() -> Result<usize, CudaError> {
    if !driver_library_present() {
        return Err(missing_driver());
    }
    match result::init() {
        Ok(()) => {}
        // A driver without a usable GPU says so at cuInit.
        Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => return Ok(0),
        Err(source) => return Err(CudaError::Driver { call: "cuInit", source }),
    }
    let count = result::device::get_count().map_err(CudaError::driver("cuDeviceGetCount"))?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// One CUDA device: its primary context and the streams known by [`StreamId`].
///
/// A [`StreamId`] is the numeric value of the `CUstream` handle, as in PyTorch (whose free
/// blocks are ordered by stream handle first); the legacy default stream is
/// [`StreamId::DEFAULT`] (0). Streams made by [`CudaDevice::new_stream`] are non-blocking (as
/// PyTorch's `torch.cuda.Stream()`s) and live as long as the device.
///
/// A device opened with [`CudaDevice::open_with_foreign_streams`] also takes streams it did not
/// make: any other [`StreamId`] is the raw handle of a stream someone else owns (PyTorch's
/// `cudaStream_t`s), which events are recorded on and which is synchronized like one of its own.
#[derive(Debug)]
pub struct CudaDevice {
    context: Arc<CudaContext>,
    ordinal: usize,
    compute_capability: (i32, i32),
    multiprocessors: u32,
    streams: RwLock<BTreeMap<StreamId, Arc<CudaStream>>>,
    /// Whether a [`StreamId`] this device did not make is a caller's raw `CUstream`.
    foreign_streams: bool,
}

impl CudaDevice {
    /// Opens device `ordinal` (retains its primary context).
    ///
    /// Without `libcuda`, or without such a device, this is an error naming the cause; it
    /// never panics.
    pub fn open(ordinal: usize) -> Result<Arc<Self>, CudaError> {
        Self::open_streams(ordinal, false)
    }

    /// Opens device `ordinal` as [`CudaDevice::open`] does, taking every [`StreamId`] it did
    /// not make as the raw `CUstream` handle of someone else's stream (PyTorch's streams,
    /// passed to its allocator as `cudaStream_t`s).
    ///
    /// # Safety
    ///
    /// Every [`StreamId`] given to this device, or to a backend or kernels on it, that the
    /// device did not make must be the value of a live stream handle of the device's primary
    /// context, or 0 (the legacy default stream); its owner must keep it alive while work
    /// recorded on it may still be waited for (PyTorch never destroys its pool streams, and
    /// its own allocator relies on the same).
    pub unsafe fn open_with_foreign_streams(ordinal: usize) -> Result<Arc<Self>, CudaError> {
        Self::open_streams(ordinal, true)
    }

    fn open_streams(ordinal: usize, foreign_streams: bool) -> Result<Arc<Self>, CudaError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let context = CudaContext::new(ordinal).map_err(CudaError::driver("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: this crate never creates `CudaSlice`s for allocator memory; ordering between
        // streams is the allocator's business (events at free time), exactly as in PyTorch.
        unsafe { context.disable_event_tracking() };
        let compute_capability = context.compute_capability().map_err(CudaError::driver("cuDeviceGetAttribute"))?;
        let multiprocessors = context
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(CudaError::driver("cuDeviceGetAttribute"))?;
        let mut streams = BTreeMap::new();
        streams.insert(StreamId::DEFAULT, context.default_stream());
        Ok(Arc::new(CudaDevice {
            context,
            ordinal,
            compute_capability,
            multiprocessors: u32::try_from(multiprocessors).unwrap_or(1).max(1),
            streams: RwLock::new(streams),
            foreign_streams,
        }))
    }

    /// The cudarc context (primary context of the device).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// `(major, minor)` compute capability, e.g. `(9, 0)` on Hopper.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// Number of streaming multiprocessors.
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// Makes the device's context current on the calling thread (cheap when it already is).
    pub fn bind(&self) -> Result<(), CudaError> {
        self.context.bind_to_thread().map_err(CudaError::driver("cuCtxSetCurrent"))
    }

    /// Creates a non-blocking stream and returns its id (the handle's value).
    pub fn new_stream(&self) -> Result<StreamId, CudaError> {
        let stream = self.context.new_stream().map_err(CudaError::driver("cuStreamCreate"))?;
        let id = StreamId(stream.cu_stream() as u64);
        self.streams.write().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(id, stream);
        Ok(id)
    }

    /// The stream with this id: one made here (or the default stream), or, on a device that
    /// takes foreign streams, the caller's stream of that handle.
    pub fn stream(&self, id: StreamId) -> Result<Arc<CudaStream>, CudaError> {
        if let Some(stream) = self.streams.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(&id) {
            return Ok(Arc::clone(stream));
        }
        if self.foreign_streams {
            // SAFETY: the caller of `open_with_foreign_streams` promised that every id this
            // device did not make is a live stream handle of its primary context; the wrapper
            // borrows it (dropping it destroys nothing).
            return Ok(unsafe { self.context.wrap_borrowed_stream(id.0 as usize as sys::CUstream) });
        }
        Err(CudaError::InvalidArguments(format!("stream {id} was not created by this device")))
    }

    /// Whether streams this device did not make are taken as raw handles
    /// ([`CudaDevice::open_with_foreign_streams`]).
    pub fn takes_foreign_streams(&self) -> bool {
        self.foreign_streams
    }

    /// Whether `id` is capturing a CUDA graph. The legacy default stream (0) counts as
    /// capturing while another stream of the context captures in global or thread-local mode,
    /// where the driver refuses to say (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`): work on it would
    /// join the capture.
    pub fn is_capturing(&self, id: StreamId) -> Result<bool, CudaError> {
        use sys::CUresult::{CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT};
        let stream = self.stream(id)?;
        // SAFETY: the handle of a stream of this device (or a foreign one the caller vouched
        // for), alive while `stream` is.
        let query = || unsafe { result::stream::is_capturing(stream.cu_stream()) };
        let status = match query() {
            // A thread not yet bound to the device asks about the legacy stream.
            Err(e) if e.0 == CUDA_ERROR_INVALID_CONTEXT => {
                self.bind()?;
                query()
            }
            other => other,
        };
        match status {
            Ok(status) => Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE),
            Err(e) if e.0 == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => Ok(true),
            Err(source) => Err(CudaError::Driver { call: "cuStreamIsCapturing", source }),
        }
    }

    /// Whether this id names a stream this device made (or the default stream).
    pub fn has_stream(&self, id: StreamId) -> bool {
        self.streams.read().unwrap_or_else(|poisoned| poisoned.into_inner()).contains_key(&id)
    }

    /// The ids of all known streams, the default stream first.
    pub fn streams(&self) -> Vec<StreamId> {
        self.streams.read().unwrap_or_else(|poisoned| poisoned.into_inner()).keys().copied().collect()
    }

    /// Waits on the host for all work queued on `id`.
    pub fn synchronize_stream(&self, id: StreamId) -> Result<(), CudaError> {
        self.stream(id)?.synchronize().map_err(CudaError::driver("cuStreamSynchronize"))
    }

    /// Waits on the host for all work on the device.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.context.synchronize().map_err(CudaError::driver("cuCtxSynchronize"))
    }

    /// Makes `waiter` wait (on the device) for the work queued on `on` so far, as PyTorch's
    /// `waiter.wait_stream(on)`.
    pub fn wait_stream(&self, waiter: StreamId, on: StreamId) -> Result<(), CudaError> {
        if waiter == on {
            return Ok(());
        }
        let event = self.record_event(on)?;
        self.stream(waiter)?.wait(&event).map_err(CudaError::driver("cuStreamWaitEvent"))
    }

    /// Records a fresh event at the current end of `stream`'s work.
    pub fn record_event(&self, stream: StreamId) -> Result<CudaEvent, CudaError> {
        let stream = self.stream(stream)?;
        stream.record_event(None).map_err(CudaError::driver("cuEventRecord"))
    }

    /// `(free, total)` device memory from `cuMemGetInfo`.
    pub fn memory_info(&self) -> Result<(u64, u64), CudaError> {
        let (free, total) = self.context.mem_get_info().map_err(CudaError::driver("cuMemGetInfo"))?;
        Ok((free as u64, total as u64))
    }
}
