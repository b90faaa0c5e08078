//! The replay stopped just before one entry's malloc, and that malloc then made by the
//! explainer on the allocator the replay left, its history on, so that what the retry chain
//! did shows in the entries it records.
//!
//! The replay has no "stop at entry N" of its own: it replays a trace whole. Replaying the
//! trace cut short before the malloc gives the same allocator, because the replay decides
//! nothing from entries after the one it is at, but for two look-aheads, which the cut is
//! placed to keep out of: a release run is explained by the request after it (the cut is made
//! before every release, completion and new segment the malloc itself recorded), and a
//! deferred free's completion is found later in the trace (one after the cut has not happened
//! yet at the cut, so the free is still pending there, as it was).

use cachalot_core::error::{AllocatorError, OutOfMemoryError};
use cachalot_core::sim::SimBackend;
use cachalot_core::trace::{TraceAction, TraceEntry};
use cachalot_core::{Allocation, CachingAllocator, SegmentSnapshot};

use crate::replay::{ReplayError, ReplayOptions, replay};
use crate::snapshot::torch::TorchSnapshot;

/// The state at one request, before and after its malloc.
pub(crate) struct Stopped {
    /// Index of the first entry the malloc recorded (releases, completions, new memory before
    /// its `alloc` or `oom` entry): the replay stopped there.
    pub cut: usize,
    /// The segments and blocks when the request came.
    pub before: Vec<SegmentSnapshot>,
    /// `memory_allocated()` and `memory_reserved()` when the request came.
    pub allocated_before: u64,
    /// `memory_reserved()` when the request came.
    pub reserved_before: u64,
    /// The allocator after the malloc.
    pub allocator: CachingAllocator<SimBackend>,
    /// What the malloc returned.
    pub result: Result<Allocation, Box<OutOfMemoryError>>,
    /// The entries the malloc recorded, its `alloc` or `oom` last.
    pub made: Vec<TraceEntry>,
}

/// The first of the entries right before `trace[entry]` that its malloc recorded: releases
/// (garbage collection, the oversize and the full release), the completions of deferred frees
/// the full release synchronized, and the segments or pages it got. Where a program's
/// `empty_cache` stands right before a request with nothing recorded between them, its entries
/// are counted with the malloc's (the trace alone cannot tell them apart; the full release the
/// malloc makes then releases the same).
pub(crate) fn malloc_start(trace: &[TraceEntry], entry: usize) -> usize {
    let mut start = entry;
    while start > 0 {
        let e = &trace[start - 1];
        let the_mallocs = match e.action {
            TraceAction::SegmentFree
            | TraceAction::SegmentUnmap
            | TraceAction::SegmentAlloc
            | TraceAction::SegmentMap => true,
            // The completion of a free that completed at once is the free's own.
            TraceAction::FreeCompleted => {
                !(start >= 2
                    && trace[start - 2].action == TraceAction::FreeRequested
                    && trace[start - 2].addr == e.addr)
            }
            _ => false,
        };
        if !the_mallocs {
            break;
        }
        start -= 1;
    }
    start
}

/// Replays `snapshot`'s trace up to the malloc of `trace[entry]` (an `alloc` or an `oom`), and
/// makes that malloc. Where the entry is a recorded `oom`, the device's free memory is the
/// driver's at that moment, as in the replay.
pub(crate) fn stop_at(snapshot: &TorchSnapshot, options: &ReplayOptions, entry: usize) -> Result<Stopped, ReplayError> {
    let device = options.device;
    let trace = snapshot
        .device_traces
        .get(device)
        .ok_or(ReplayError::NoTrace { device, available: snapshot.device_traces.len() })?;
    let e = trace[entry];
    let cut = malloc_start(trace, entry);
    let prefix = TorchSnapshot {
        device_traces: (0..=device).map(|d| if d == device { trace[..cut].to_vec() } else { Vec::new() }).collect(),
        allocator_settings: snapshot.allocator_settings.clone(),
        contexts: snapshot.contexts.clone(),
        ..TorchSnapshot::default()
    };
    let mut options = options.clone();
    options.record_calls = false;
    if let Some(calls) = &mut options.calls {
        calls.retain(|c| c.at < cut);
    }
    let outcome = replay(&prefix, &options, |_, _| {})?;
    let mut allocator = outcome.allocator;
    let before = allocator.snapshot();
    let (allocated_before, reserved_before) = (allocator.memory_allocated(), allocator.memory_reserved());

    allocator.backend_mut().set_time_us(e.time_us);
    allocator.set_context(e.context);
    allocator.set_annotation_id(e.annotation);
    if e.action == TraceAction::Oom {
        allocator.backend_mut().set_free_memory_override(Some(e.addr));
    }
    let recorded = allocator.trace_len_total();
    // A reservation the malloc makes takes an address of the simulator's own, as in the replay
    // at an `oom` entry (where none was planned there is no difference).
    allocator.backend_mut().set_reservations_unplanned(true);
    let result = allocator.malloc(e.size, e.stream);
    allocator.backend_mut().set_reservations_unplanned(false);
    allocator.backend_mut().set_free_memory_override(None);
    let made = allocator.trace_since(recorded);
    let result = match result {
        Ok(allocation) => Ok(allocation),
        Err(AllocatorError::OutOfMemory(oom)) => Err(oom),
        Err(other) => return Err(ReplayError::Setup(other)),
    };
    Ok(Stopped { cut, before, allocated_before, reserved_before, allocator, result, made })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachalot_core::StreamId;

    fn entry(action: TraceAction) -> TraceEntry {
        TraceEntry { action, addr: 0, size: 0, stream: StreamId(0), time_us: 0, context: None, annotation: None }
    }

    /// The cut stops at the last entry that is not the malloc's own.
    #[test]
    fn the_malloc_starts_after_the_last_entry_of_another_call() {
        use TraceAction::*;
        let trace: Vec<TraceEntry> =
            [Alloc, FreeRequested, FreeCompleted, SegmentFree, SegmentUnmap, Oom].into_iter().map(entry).collect();
        // The completion right after its free is the free's: the cut keeps it.
        assert_eq!(malloc_start(&trace, 5), 3);
        assert_eq!(malloc_start(&trace, 1), 1);
        assert_eq!(malloc_start(&[entry(SegmentAlloc), entry(Alloc)], 1), 0);
        // A deferred completion (another free's) before the releases is the full release's.
        let trace: Vec<TraceEntry> = [Alloc, FreeCompleted, SegmentFree, Oom].into_iter().map(entry).collect();
        assert_eq!(malloc_start(&trace, 3), 1);
    }
}
