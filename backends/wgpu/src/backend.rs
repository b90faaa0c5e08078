//! `WgpuBackend`: segments are `wgpu::Buffer`s placed in an address space of the backend's
//! own; events are submission numbers of the one queue.

use std::collections::BTreeMap;
use std::sync::Arc;

use cachalot_core::error::format_size;
use cachalot_core::{BackendError, DeviceFacts, Pages, Segments, StreamEvents, StreamId};

use crate::context::WgpuContext;
use crate::error::KernelError;

/// Where the backend's addresses start: far from 0, so that no address is null.
const FIRST_ADDRESS: u64 = 0x1_0000_0000;

/// Addresses of consecutive segments are this far apart at least (2 MiB, the allocator's
/// small segment), so that addresses look like a device's and never touch.
const ADDRESS_GRANULE: u64 = 2 << 20;

/// An event of the wgpu backend: the submission number that was the latest when it was
/// recorded. It has completed when that submission has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueEvent(pub u64);

/// One segment: a buffer of `STORAGE | COPY_SRC | COPY_DST` usage.
#[derive(Debug)]
struct Segment {
    buffer: wgpu::Buffer,
    size: u64,
}

/// A byte range of a segment's buffer: what a kernel binds for one operand.
#[derive(Clone, Copy, Debug)]
pub struct BufferRange<'a> {
    /// The segment's buffer.
    pub buffer: &'a wgpu::Buffer,
    /// Offset of the range in the buffer.
    pub offset: u64,
    /// Length of the range.
    pub size: u64,
}

/// The wgpu device as the caching allocator sees it.
///
/// A segment is one `wgpu::Buffer`; a block is a range of it. Segment addresses come from an
/// address space of the backend's own (a bump pointer from `0x1_0000_0000`, never reused), and
/// [`WgpuBackend::resolve`] turns an allocation's address into `(buffer, offset)`. All
/// streams are the one wgpu queue: an event is a submission number of [`WgpuContext`].
///
/// Limits: a segment larger than `max_buffer_size` is refused with
/// [`BackendError::OutOfMemory`] naming that limit; so is a segment that would take the
/// bytes held above the configured capacity (wgpu cannot tell free memory). A buffer the
/// driver itself refuses (caught with an error scope) is out of memory too. Either way the
/// allocator's retry chain (free cached blocks, retry) runs before the caller sees the error.
/// Expandable segments are not offered.
#[derive(Debug)]
pub struct WgpuBackend {
    context: Arc<WgpuContext>,
    facts: DeviceFacts,
    segments: BTreeMap<u64, Segment>,
    next_address: u64,
    used: u64,
}

impl WgpuBackend {
    /// A backend over `context`, bounded by `context.config().capacity`.
    pub fn new(context: Arc<WgpuContext>) -> Self {
        let capacity = context.config().capacity;
        Self::with_capacity(context, capacity)
    }

    /// A backend over `context` bounded by `capacity` bytes instead of the context's
    /// configured capacity: the budget a web page lets its visitor choose for each run, on the
    /// one device it requested (WebGPU cannot tell free memory either).
    pub fn with_capacity(context: Arc<WgpuContext>, capacity: u64) -> Self {
        let info = context.adapter_info();
        let limits = context.limits();
        let config = context.config();
        let facts = DeviceFacts {
            backend: "wgpu".into(),
            name: info.name.clone(),
            index: config.device_index,
            total_memory: capacity,
            alignment: crate::BLOCK_ALIGNMENT,
            max_segment_size: Some(limits.max_buffer_size),
            max_binding_size: Some(limits.max_storage_buffer_binding_size),
            supports_expandable_segments: false,
            details: vec![
                ("graphics API".into(), format!("{:?}", info.backend)),
                ("adapter type".into(), format!("{:?}", info.device_type)),
                ("driver".into(), info.driver.clone()),
                ("driver info".into(), info.driver_info.clone()),
                ("max_buffer_size".into(), limits.max_buffer_size.to_string()),
                ("max_storage_buffer_binding_size".into(), limits.max_storage_buffer_binding_size.to_string()),
                ("min_storage_buffer_offset_alignment".into(), limits.min_storage_buffer_offset_alignment.to_string()),
                ("capacity".into(), format!("{capacity} (configured)")),
            ],
        };
        WgpuBackend { context, facts, segments: BTreeMap::new(), next_address: FIRST_ADDRESS, used: 0 }
    }

    /// The shared context.
    pub fn context(&self) -> &Arc<WgpuContext> {
        &self.context
    }

    /// Bytes held in segments.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Number of segments (buffers) held.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The buffer range behind `[address, address + size)`, which must lie in one segment.
    pub fn resolve(&self, address: u64, size: u64) -> Result<BufferRange<'_>, KernelError> {
        let (&base, segment) =
            self.segments.range(..=address).next_back().ok_or(KernelError::UnknownAddress(address))?;
        let offset = address - base;
        if offset.checked_add(size).is_none_or(|end| end > segment.size) {
            return Err(KernelError::UnknownAddress(address));
        }
        Ok(BufferRange { buffer: &segment.buffer, offset, size })
    }

    fn create_buffer(&self, address: u64, size: u64) -> Result<wgpu::Buffer, BackendError> {
        let device = self.context.device();
        let label = format!("cachalot segment {address:#x}");
        let descriptor = wgpu::BufferDescriptor {
            label: Some(&label),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        };
        // Validation scope outside, out-of-memory scope inside: scopes pop in reverse order.
        let ((buffer, oom), invalid) = self.context.scoped(wgpu::ErrorFilter::Validation, || {
            self.context.scoped(wgpu::ErrorFilter::OutOfMemory, || device.create_buffer(&descriptor))
        });
        if let Some(error) = oom {
            buffer.destroy();
            return Err(BackendError::OutOfMemory {
                limit: Some(format!("the wgpu device refused a buffer of {}: {error}", format_size(size))),
            });
        }
        if let Some(error) = invalid {
            buffer.destroy();
            return Err(BackendError::Device(format!("wgpu refused a buffer of {size} bytes: {error}")));
        }
        Ok(buffer)
    }
}

impl Segments for WgpuBackend {
    fn device(&self) -> &DeviceFacts {
        &self.facts
    }

    fn allocate_segment(&mut self, size: u64, _stream: StreamId) -> Result<u64, BackendError> {
        let max_buffer_size = self.context.limits().max_buffer_size;
        if size > max_buffer_size {
            return Err(BackendError::OutOfMemory {
                limit: Some(format!(
                    "max_buffer_size: a segment of {} ({size} bytes) is larger than the largest wgpu buffer \
                     the device allows, {} ({max_buffer_size} bytes)",
                    format_size(size),
                    format_size(max_buffer_size)
                )),
            });
        }
        let capacity = self.facts.total_memory;
        if self.used.saturating_add(size) > capacity {
            return Err(BackendError::OutOfMemory {
                limit: Some(format!(
                    "configured capacity: a segment of {} would take the wgpu backend's {} in segments past \
                     its configured capacity of {} (WgpuConfig::capacity; wgpu cannot query free memory)",
                    format_size(size),
                    format_size(self.used),
                    format_size(capacity)
                )),
            });
        }
        let address = self.next_address;
        let buffer = self.create_buffer(address, size)?;
        self.next_address = address + size.div_ceil(ADDRESS_GRANULE).max(1) * ADDRESS_GRANULE;
        self.segments.insert(address, Segment { buffer, size });
        self.used += size;
        tracing::trace!(address, size, used = self.used, "wgpu segment created");
        Ok(address)
    }

    fn free_segment(&mut self, address: u64, size: u64) -> Result<(), BackendError> {
        match self.segments.remove(&address) {
            Some(segment) if segment.size == size => {
                // wgpu keeps the memory until submissions that use it have completed.
                segment.buffer.destroy();
                self.used -= size;
                Ok(())
            }
            Some(segment) => {
                let held = segment.size;
                self.segments.insert(address, segment);
                Err(BackendError::Device(format!("free of {size} bytes at {address:#x}, but the segment has {held}")))
            }
            None => Err(BackendError::Device(format!("free of unknown segment {address:#x}"))),
        }
    }

    fn memory_info(&mut self) -> Result<(u64, u64), BackendError> {
        let total = self.facts.total_memory;
        Ok((total.saturating_sub(self.used), total))
    }

    fn now_us(&mut self) -> i64 {
        #[cfg(not(target_arch = "wasm32"))]
        {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_micros() as i64)
                .unwrap_or(0)
        }
        // `SystemTime` panics on wasm32-unknown-unknown.
        #[cfg(target_arch = "wasm32")]
        {
            0
        }
    }
}

/// wgpu has no virtual memory mapping: `expandable_segments` is refused.
impl Pages for WgpuBackend {}

impl StreamEvents for WgpuBackend {
    type Event = QueueEvent;

    fn record_event(&mut self, _stream: StreamId) -> Result<QueueEvent, BackendError> {
        Ok(QueueEvent(self.context.last_submission()))
    }

    fn query_event(&mut self, event: &QueueEvent) -> Result<bool, BackendError> {
        if self.context.is_complete(event.0) {
            return Ok(true);
        }
        self.context.poll()?;
        Ok(self.context.is_complete(event.0))
    }

    fn synchronize_event(&mut self, event: &QueueEvent) -> Result<(), BackendError> {
        self.context.wait_for(event.0)
    }
}
