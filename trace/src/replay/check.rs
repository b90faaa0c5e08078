//! The verification of a replay against what PyTorch recorded (`cachalot replay --check`): the
//! divergences the replay noticed, every segment event in order, the final segments and blocks,
//! and, with the run's `expected.json`, its `memory_stats()`, `memory_summary()` and
//! out-of-memory messages. Each comparison is a function of its own, and the first difference
//! found, in that order, is the answer.

use cachalot_core::error::OutOfMemoryError;
use cachalot_core::sim::SimBackend;
use cachalot_core::trace::TraceAction;
use cachalot_core::{CachingAllocator, SegmentSnapshot};

use super::{ExpectedRun, ReplayOutcome};
use crate::snapshot::torch::{TorchSegment, TorchSnapshot};

/// The first thing a replay did differently from the recording (see
/// [`verify_against_recording`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RecordingMismatch {
    /// What differed, with both sides' values.
    pub message: String,
}

/// Verifies a replay against what PyTorch recorded (`cachalot replay --check`): the
/// divergences noticed while replaying, every segment event in order, the final segments and
/// blocks, and, with the run's `expected.json`, its `memory_stats()`, `memory_summary()` and
/// out-of-memory messages. `Err` holds the first difference.
pub fn verify_against_recording(
    snapshot: &TorchSnapshot,
    outcome: &ReplayOutcome,
    expected: Option<&ExpectedRun>,
) -> Result<(), RecordingMismatch> {
    first_mismatch(snapshot, outcome, expected).map_err(|message| RecordingMismatch { message })
}

fn first_mismatch(
    snapshot: &TorchSnapshot,
    outcome: &ReplayOutcome,
    expected: Option<&ExpectedRun>,
) -> Result<(), String> {
    if let Some(d) = outcome.divergences.first() {
        return Err(format!("entry {}: {}", d.index, d.message));
    }
    let allocator = &outcome.allocator;
    verify_segment_events(snapshot, outcome.device, allocator)?;
    verify_final_segments(snapshot, outcome.device, allocator)?;
    if let Some(expected) = expected {
        verify_memory_stats(allocator, expected)?;
        verify_memory_summary(allocator, expected)?;
        verify_oom_messages(outcome, expected)?;
    }
    Ok(())
}

/// Every segment event of the replay's trace against the recording's, in order.
fn verify_segment_events(
    snapshot: &TorchSnapshot,
    device: usize,
    allocator: &CachingAllocator<SimBackend>,
) -> Result<(), String> {
    let ours: Vec<(TraceAction, u64, u64)> =
        allocator.trace().iter().filter(|e| e.action.is_segment_event()).map(|e| (e.action, e.addr, e.size)).collect();
    let recorded: Vec<(usize, TraceAction, u64, u64)> = snapshot
        .device_traces
        .get(device)
        .map(|t| {
            t.iter()
                .enumerate()
                .filter(|(_, e)| e.action.is_segment_event())
                .map(|(i, e)| (i, e.action, e.addr, e.size))
                .collect()
        })
        .unwrap_or_default();
    for (n, (index, action, addr, size)) in recorded.iter().enumerate() {
        match ours.get(n) {
            Some(&(a, ad, s)) if (a, ad, s) == (*action, *addr, *size) => {}
            Some(&(a, ad, s)) => {
                return Err(format!(
                    "segment event {n} (entry {index}): PyTorch {} {addr:#x} {size} B, replay {} {ad:#x} {s} B",
                    action.name(),
                    a.name()
                ));
            }
            None => {
                return Err(format!(
                    "segment event {n} (entry {index}): PyTorch {} {addr:#x} {size} B, replay none",
                    action.name()
                ));
            }
        }
    }
    if ours.len() > recorded.len() {
        let (a, ad, s) = ours[recorded.len()];
        return Err(format!("replay has an extra segment event: {} {ad:#x} {s} B", a.name()));
    }
    Ok(())
}

/// The segments of the replay's end state against those of the recording's snapshot for the
/// device, in address order.
fn verify_final_segments(
    snapshot: &TorchSnapshot,
    device: usize,
    allocator: &CachingAllocator<SimBackend>,
) -> Result<(), String> {
    let ours = allocator.snapshot();
    let theirs: Vec<_> = snapshot.segments.iter().filter(|s| s.device == device as i64).collect();
    if ours.len() != theirs.len() {
        return Err(format!("final state: PyTorch has {} segments, replay {}", theirs.len(), ours.len()));
    }
    ours.iter().zip(theirs).try_for_each(|(o, t)| verify_final_segment(o, t))
}

/// One final segment: where it is, its size, stream, pool and kind, then its blocks one by one,
/// then its byte sums.
fn verify_final_segment(o: &SegmentSnapshot, t: &TorchSegment) -> Result<(), String> {
    let at = t.address;
    let same_segment = o.address == t.address
        && o.total_size == t.total_size
        && o.stream.0 == t.stream
        && o.pool == t.segment_type
        && o.is_expandable == t.is_expandable;
    if !same_segment {
        return Err(format!(
            "final segment at {at:#x}: PyTorch {} B {} stream {:#x}{}, replay {:#x} {} B {} stream {}{}",
            t.total_size,
            t.segment_type.name(),
            t.stream,
            if t.is_expandable { " expandable" } else { "" },
            o.address,
            o.total_size,
            o.pool.name(),
            o.stream,
            if o.is_expandable { " expandable" } else { "" },
        ));
    }
    let pool_id = (o.pool_id.0 as i64, o.pool_id.1 as i64);
    if pool_id != t.segment_pool_id {
        return Err(format!(
            "final segment at {at:#x}: PyTorch's is in pool {:?}, the replay's in pool {}",
            t.segment_pool_id, o.pool_id
        ));
    }
    if o.blocks.len() != t.blocks.len() {
        return Err(format!(
            "final segment at {at:#x}: PyTorch has {} blocks, replay {}",
            t.blocks.len(),
            o.blocks.len()
        ));
    }
    for (ob, tb) in o.blocks.iter().zip(&t.blocks) {
        if (ob.address, ob.size, ob.requested_size, ob.state) != (tb.address, tb.size, tb.requested_size, tb.state) {
            return Err(format!(
                "final block at {:#x}: PyTorch {} B (requested {}) {}, replay {:#x} {} B (requested {}) {}",
                tb.address,
                tb.size,
                tb.requested_size,
                tb.state.name(),
                ob.address,
                ob.size,
                ob.requested_size,
                ob.state.name()
            ));
        }
    }
    let sums = (o.allocated_size, o.active_size, o.requested_size);
    if sums != (t.allocated_size, t.active_size, t.requested_size) {
        return Err(format!("final segment at {at:#x}: allocated/active/requested sizes differ"));
    }
    Ok(())
}

/// Every key of the recorded `memory_stats()` against the replay's. A key the replay lacks is a
/// difference, except `num_oom_rejections`, which releases newer than 2.11 add.
fn verify_memory_stats(allocator: &CachingAllocator<SimBackend>, expected: &ExpectedRun) -> Result<(), String> {
    let ours = allocator.stats().to_flat();
    for (key, value) in &expected.memory_stats {
        match ours.get(key) {
            Some(v) if v == value => {}
            Some(v) => return Err(format!("memory_stats[{key}]: PyTorch {value}, replay {v}")),
            None if key == "num_oom_rejections" => {}
            None => return Err(format!("memory_stats[{key}]: missing in the replay")),
        }
    }
    Ok(())
}

/// The recorded `memory_summary()`, where there is one, against the replay's, text for text.
fn verify_memory_summary(allocator: &CachingAllocator<SimBackend>, expected: &ExpectedRun) -> Result<(), String> {
    let Some(summary) = &expected.memory_summary else { return Ok(()) };
    let ours = allocator.memory_summary(false);
    if &ours != summary {
        let line = ours.lines().zip(summary.lines()).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!(
            "memory_summary differs at line {}: PyTorch {:?}, replay {:?}",
            line + 1,
            summary.lines().nth(line).unwrap_or(""),
            ours.lines().nth(line).unwrap_or("")
        ));
    }
    Ok(())
}

/// The out-of-memory messages the program caught against those the replay raised at
/// PyTorch's own `oom` entries, in order, on the allocator's part of the message.
fn verify_oom_messages(outcome: &ReplayOutcome, expected: &ExpectedRun) -> Result<(), String> {
    let expected_ooms: Vec<&String> = expected.marks.iter().filter_map(|m| m.message.as_ref()).collect();
    // Only the errors at PyTorch's own OOM entries: one anywhere else is already a divergence.
    let ours_at_recorded: Vec<&String> = outcome.ooms.iter().filter(|o| o.recorded).map(|o| &o.message).collect();
    if expected_ooms.len() != ours_at_recorded.len() {
        return Err(format!(
            "PyTorch raised {} OOM errors, the replay {}",
            expected_ooms.len(),
            ours_at_recorded.len()
        ));
    }
    for (theirs, ours) in expected_ooms.iter().zip(ours_at_recorded) {
        let (t, o) = (OutOfMemoryError::allocator_part(theirs), OutOfMemoryError::allocator_part(ours));
        if t != o {
            return Err(format!("OOM message: PyTorch {t:?}, replay {o:?}"));
        }
    }
    Ok(())
}
