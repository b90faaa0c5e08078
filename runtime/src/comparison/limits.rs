//! The device limits of the runs that know their device: what a segment, a binding and an offset
//! may be, and whether the run stayed within them.

use cachalot_core::TraceAction;

use super::columns::Column;

/// One run's device limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// The run (index into the compared runs).
    pub column: usize,
    /// The allocator's block alignment.
    pub alignment: u64,
    /// wgpu's `min_storage_buffer_offset_alignment`, as the device reported it.
    pub storage_offset_alignment: Option<String>,
    /// Largest segment the device allows (`max_buffer_size`).
    pub max_segment_size: Option<u64>,
    /// Largest segment the run's trace allocated (0 without a trace).
    pub largest_segment: u64,
    /// Largest kernel binding (`max_storage_buffer_binding_size`).
    pub max_binding_size: Option<u64>,
}

impl DeviceLimits {
    /// Whether the run's largest segment is within the device's limit (true without a limit).
    pub fn largest_segment_fits(&self) -> bool {
        self.max_segment_size.is_none_or(|max| self.largest_segment <= max)
    }
}

/// The limits of every run with device facts.
pub(super) fn device_limits(columns: &[Column]) -> Vec<DeviceLimits> {
    let limits = |(column, c): (usize, &Column)| {
        let facts = c.facts.as_ref()?;
        let largest_segment = c
            .trace
            .as_ref()
            .and_then(|t| t.iter().filter(|e| e.action == TraceAction::SegmentAlloc).map(|e| e.size).max())
            .unwrap_or(0);
        Some(DeviceLimits {
            column,
            alignment: facts.alignment,
            storage_offset_alignment: facts
                .details
                .iter()
                .find(|(k, _)| k == "min_storage_buffer_offset_alignment")
                .map(|(_, v)| v.clone()),
            max_segment_size: facts.max_segment_size,
            largest_segment,
            max_binding_size: facts.max_binding_size,
        })
    };
    columns.iter().enumerate().filter_map(limits).collect()
}
