//! PyTorch's snapshot, as `torch.cuda.memory._snapshot()` returns it (`docs/allocator-rules.md` §18.3), in typed
//! form. Stacks are interned in a [`ContextTable`] so that the frame lists PyTorch shares
//! between thousands of entries stay shared here.

use cachalot_core::BlockState;
use cachalot_core::config::{AllocatorConfig, ConfigError};
use cachalot_core::size::{PoolKind, ROUNDUP_INTERVALS, RoundupDivisions};
use cachalot_core::trace::{ContextId, ContextTable, TraceEntry};

/// A whole PyTorch snapshot.
#[derive(Clone, Debug, Default)]
pub struct TorchSnapshot {
    /// Segments of all devices, sorted by address per device.
    pub segments: Vec<TorchSegment>,
    /// One trace per device, oldest entry first.
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// The allocator configuration PyTorch parsed; `None` in a bare list of segments
    /// (`torch.cuda.memory_snapshot()`) or very old snapshots.
    pub allocator_settings: Option<TorchAllocatorSettings>,
    /// `record_function` annotations recorded with the history.
    pub external_annotations: Vec<ExternalAnnotation>,
    /// The stacks and annotation strings referenced by segments, blocks and entries.
    pub contexts: ContextTable,
}

/// One `record_function` annotation of `external_annotations` (recorded when the profiler's
/// record-function hooks run while history is recorded, e.g. `Optimizer.step#SGD.step`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExternalAnnotation {
    /// `"START"` or `"END"`.
    pub stage: String,
    /// The annotated region, e.g. `Optimizer.zero_grad#AdamW.zero_grad`.
    pub name: String,
    /// Device ordinal.
    pub device: i64,
    /// Wall-clock microseconds.
    pub time_us: i64,
}

/// One segment of a snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct TorchSegment {
    /// Device ordinal.
    pub device: i64,
    /// Address of the first block.
    pub address: u64,
    /// Bytes in the segment.
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of allocated and pending-free blocks.
    pub active_size: u64,
    /// Requested bytes of active blocks.
    pub requested_size: u64,
    /// `cudaStream_t` as an integer.
    pub stream: u64,
    /// `"small"` or `"large"`.
    pub segment_type: PoolKind,
    /// `(0, 0)` for the default pools, else the private pool.
    pub segment_pool_id: (i64, i64),
    /// Whether it is a mapped range of an expandable segment.
    pub is_expandable: bool,
    /// Stack of the segment's creation.
    pub frames: Option<ContextId>,
    /// Blocks in address order.
    pub blocks: Vec<TorchBlock>,
}

/// One block of a [`TorchSegment`].
#[derive(Clone, Debug, PartialEq)]
pub struct TorchBlock {
    /// Address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Requested size (stale for free blocks).
    pub requested_size: u64,
    /// `active_allocated`, `active_pending_free` or `inactive`.
    pub state: BlockState,
    /// Stack of the allocation.
    pub frames: Option<ContextId>,
}

/// `allocator_settings` of a snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct TorchAllocatorSettings {
    /// The raw `PYTORCH_CUDA_ALLOC_CONF` string ("" if none).
    pub settings: String,
    /// `max_split_size`, `-1` when unlimited.
    pub max_split_size: i64,
    /// `garbage_collection_threshold`.
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// `pinned_num_register_threads`.
    pub pinned_num_register_threads: i64,
    /// `release_lock_on_cudamalloc`.
    pub release_lock_on_cudamalloc: bool,
    /// `pinned_use_cuda_host_register`.
    pub pinned_use_cuda_host_register: bool,
    /// `graph_capture_record_stream_reuse`.
    pub graph_capture_record_stream_reuse: bool,
    /// `roundup_power2_divisions`, keyed `"1"`, `"2"`, ... `"32768"` (MB) in the pickle.
    pub roundup_power2_divisions: RoundupDivisions,
}

impl TorchAllocatorSettings {
    /// The settings PyTorch would report for `config`.
    pub fn from_config(config: &AllocatorConfig) -> Self {
        TorchAllocatorSettings {
            settings: config.settings().to_owned(),
            max_split_size: config.max_split_size().map_or(-1, |s| s as i64),
            garbage_collection_threshold: config.garbage_collection_threshold(),
            expandable_segments: config.expandable_segments(),
            pinned_num_register_threads: config.pinned_num_register_threads() as i64,
            release_lock_on_cudamalloc: config.release_lock_on_cudamalloc(),
            pinned_use_cuda_host_register: config.pinned_use_cuda_host_register(),
            graph_capture_record_stream_reuse: config.graph_capture_record_stream_reuse(),
            roundup_power2_divisions: *config.roundup_power2_divisions(),
        }
    }

    /// The MB key of interval `i` in the pickle's `roundup_power2_divisions` dict.
    pub fn interval_key(i: usize) -> String {
        debug_assert!(i < ROUNDUP_INTERVALS);
        (1u64 << i).to_string()
    }
}

impl TorchSegment {
    /// PyTorch's form of one of our segments, on device `device`.
    pub fn from_segment(segment: &cachalot_core::SegmentSnapshot, device: i64) -> Self {
        TorchSegment {
            device,
            address: segment.address,
            total_size: segment.total_size,
            allocated_size: segment.allocated_size,
            active_size: segment.active_size,
            requested_size: segment.requested_size,
            stream: segment.stream.0,
            segment_type: segment.pool,
            // Pool ids are PyTorch's counters, far below i64::MAX.
            segment_pool_id: (segment.pool_id.0 as i64, segment.pool_id.1 as i64),
            is_expandable: segment.is_expandable,
            frames: segment.context,
            blocks: segment
                .blocks
                .iter()
                .map(|b| TorchBlock {
                    address: b.address,
                    size: b.size,
                    requested_size: b.requested_size,
                    state: b.state,
                    frames: b.context,
                })
                .collect(),
        }
    }
}

/// What `torch.cuda.memory._snapshot()` would return for this allocator: its segments, its
/// trace as the only device trace, its stacks, and `settings` (default: its configuration's).
pub fn from_allocator<B: cachalot_core::backend::Backend>(
    allocator: &cachalot_core::CachingAllocator<B>,
    settings: Option<TorchAllocatorSettings>,
) -> TorchSnapshot {
    let device = i64::from(allocator.device().index);
    TorchSnapshot {
        segments: allocator.snapshot().iter().map(|s| TorchSegment::from_segment(s, device)).collect(),
        device_traces: vec![allocator.trace()],
        allocator_settings: Some(settings.unwrap_or_else(|| TorchAllocatorSettings::from_config(allocator.config()))),
        external_annotations: Vec::new(),
        contexts: allocator.contexts().clone(),
    }
}

/// PyTorch's form of a cachalot snapshot file.
pub fn from_snapshot(snapshot: &crate::snapshot::Snapshot) -> Result<TorchSnapshot, ConfigError> {
    let device = i64::from(snapshot.device.index);
    let config = AllocatorConfig::parse(&snapshot.settings)?;
    Ok(TorchSnapshot {
        segments: snapshot.segments.iter().map(|s| TorchSegment::from_segment(s, device)).collect(),
        device_traces: vec![snapshot.trace.clone()],
        allocator_settings: Some(TorchAllocatorSettings::from_config(&config)),
        external_annotations: Vec::new(),
        contexts: snapshot.context_table(),
    })
}
