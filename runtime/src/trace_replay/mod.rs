//! `cachalot replay TRACE --backend cuda|wgpu`: a recorded PyTorch trace's allocation stream
//! made again on a device's memory, through the same allocator.
//!
//! The simulator's replay ([`cachalot_trace::replay::replay`]) decides what the recorded program
//! did (its allocations and frees, which frees waited for another stream, where it called
//! `empty_cache`) and keeps those calls ([`ReplayCall`]); [`make_calls`] makes them again on a
//! `CachingAllocator` of any backend. What the simulator is told by the recording — the
//! addresses of segments and, at a recorded out-of-memory error, the driver's free memory — the
//! device decides for itself here, so the result is what this device would have done.
//!
//! # Deferred frees
//!
//! A free that PyTorch deferred (the block was used on another stream, `record_stream`) waited
//! for that stream's kernels, and the recording shows where they ended (`free_completed`). The
//! replay runs no kernels, so it records such a free on a stand-in stream ([`stand_in`]) whose
//! work ends at the recorded `free_completed` ([`ReplayCall::FreeCompleted`]) or when the
//! allocator synchronizes: the free completes where it did in the recording, on every backend.
//!
//! # Streams
//!
//! On CUDA each stream of the trace gets a CUDA stream of its own (the trace's default stream,
//! 0, is the device's default stream), so segments and pools are per stream as in the recorded
//! run. wgpu has one queue: every stream of the trace keeps its own pools (the allocator keys
//! blocks by stream, whatever the backend), so blocks are never shared across trace streams, as
//! in PyTorch, but all the streams' work is the one queue's. A device limit that refuses a
//! request (wgpu's `max_buffer_size`, or the configured capacity, since wgpu cannot query free
//! memory) is named with the request and its trace entry ([`LimitHit`]).
//!
//! # Checking the events
//!
//! The device places segments at addresses of its own, so the device's events are compared with
//! the recording's with each address as (segment, offset) ([`check_events`],
//! [`cachalot_trace::normalized`]): equal sequences made the same decisions, block for block.

pub mod stand_in;

use std::collections::HashMap;
use std::sync::Arc;

use cachalot_core::error::AllocatorError;
use cachalot_core::{Allocation, Backend, CachingAllocator, StreamId, TraceAction, TraceEntry};
use cachalot_trace::normalized::{EventDiff, first_difference};
use cachalot_trace::replay::{ReplayCall, ReplayOom, ReplayOptions, replay};
use cachalot_trace::snapshot::torch::TorchSnapshot;
use cachalot_wgpu::WgpuContext;

use self::stand_in::{StandInBackend, stand_in_backend};
use crate::device::wgpu::WgpuDevice;
use crate::error::RuntimeError;
use crate::select::describe_wgpu;

/// A request a device limit refused: which limit, which request, which trace entry.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LimitHit {
    /// The trace entry of the request.
    pub index: usize,
    /// Bytes requested.
    pub size: u64,
    /// The limit, as the backend names it (e.g. `max_buffer_size: a segment of ...`).
    pub limit: String,
}

/// What the allocator did on the device, in the terms of the simulator's replay line.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DeviceReplay {
    /// The device, in words.
    pub device: String,
    /// Trace entries replayed.
    pub entries: usize,
    /// Segments at the end.
    pub segments: usize,
    /// `memory_allocated()` at the end.
    pub allocated: u64,
    /// `memory_reserved()` at the end.
    pub reserved: u64,
    /// `max_memory_allocated()`.
    pub peak_allocated: u64,
    /// `max_memory_reserved()`.
    pub peak_reserved: u64,
    /// Device allocations (`num_device_alloc`).
    pub device_allocs: u64,
    /// Device frees (`num_device_free`).
    pub device_frees: u64,
    /// Out-of-memory errors, in order (those the recording had too are `recorded`).
    pub ooms: Vec<ReplayOom>,
    /// The OOMs a device limit caused, naming the limit.
    pub limits: Vec<LimitHit>,
    /// Frees of allocations the device never made (their request failed), skipped.
    pub skipped_frees: usize,
    /// The allocator's events on the device, each on the trace's stream it stands for.
    #[serde(skip)]
    pub events: Vec<TraceEntry>,
}

/// Compares the device's events with the recording's `trace`, addresses as (segment, offset);
/// the recording's `snapshot` entries (the capture's own markers) are left out.
pub fn check_events(trace: &[TraceEntry], device: &DeviceReplay) -> EventDiff {
    let recorded: Vec<TraceEntry> = trace.iter().filter(|e| e.action != TraceAction::Snapshot).cloned().collect();
    first_difference(&recorded, &device.events)
}

/// Whether `diff` begins with the same request served by another block: a best-fit tie that
/// addresses broke (PyTorch takes the lowest-addressed of the blocks that fit equally well, so a
/// device laying segments out in another order picks another one), rather than another
/// decision of the policy.
pub fn tie_broken_by_address(diff: &EventDiff) -> bool {
    match diff {
        EventDiff::Differ { a: Some(a), b: Some(b), .. } => {
            a.action == TraceAction::Alloc && b.action == TraceAction::Alloc && a.size == b.size && a.stream == b.stream
        }
        _ => false,
    }
}

/// The stand-in stream of the deferred free requested at trace entry `free`: above every
/// stream a device or a trace uses (CUDA stream handles and trace stream ids are user-space
/// pointers or small numbers).
fn stand_in_stream(free: usize) -> StreamId {
    StreamId((1 << 63) | free as u64)
}

/// What [`make_calls`] saw: the OOMs, those a device limit caused, and the frees skipped.
pub type CallOutcome = (Vec<ReplayOom>, Vec<LimitHit>, usize);

/// Makes `calls` on `allocator`, each trace stream replaced by `stream_of(stream)`; a deferred
/// free is recorded on a stand-in stream that finishes at its [`ReplayCall::FreeCompleted`]. A
/// request that fails is an OOM of the result (with the limit named where the backend named
/// one), and the free of what it would have made is skipped; any other error stops the replay.
pub fn make_calls<B: Backend>(
    allocator: &mut CachingAllocator<StandInBackend<B>>,
    calls: &[ReplayCall],
    stream_of: impl Fn(StreamId) -> StreamId,
) -> Result<CallOutcome, RuntimeError> {
    let mut live: HashMap<usize, Allocation> = HashMap::new();
    let (mut ooms, mut limits, mut skipped) = (Vec::new(), Vec::new(), 0);
    for &call in calls {
        match call {
            ReplayCall::Malloc { index, size, stream, recorded_oom } => match allocator.malloc(size, stream_of(stream))
            {
                // PyTorch ran out of memory here and the program went on without the block.
                Ok(allocation) if recorded_oom => allocator.free(allocation)?,
                Ok(allocation) => {
                    live.insert(index, allocation);
                }
                Err(AllocatorError::OutOfMemory(oom)) => {
                    if let Some(limit) = &oom.limit {
                        limits.push(LimitHit { index, size, limit: limit.clone() });
                    }
                    ooms.push(ReplayOom { index, message: oom.message.clone(), recorded: recorded_oom });
                }
                Err(other) => return Err(other.into()),
            },
            ReplayCall::Free { index, malloc, deferred } => {
                let Some(allocation) = live.remove(&malloc) else {
                    skipped += 1;
                    continue;
                };
                if deferred {
                    let stand_in = stand_in_stream(index);
                    allocator.backend_mut().layer_mut().hold(stand_in);
                    allocator.record_stream(&allocation, stand_in)?;
                }
                allocator.free(allocation)?;
            }
            ReplayCall::FreeCompleted { free, .. } => allocator.backend_mut().layer_mut().finish(stand_in_stream(free)),
            ReplayCall::EmptyCache { .. } => allocator.empty_cache()?,
            ReplayCall::Pool { call, .. } => call.perform(allocator, &stream_of)?,
        }
    }
    Ok((ooms, limits, skipped))
}

/// The allocator's trace, each entry on the trace stream its device stream stands for.
fn events_on_trace_streams<B: Backend>(
    allocator: &CachingAllocator<B>,
    trace_stream_of: impl Fn(StreamId) -> StreamId,
) -> Vec<TraceEntry> {
    let mut events = allocator.trace();
    for e in &mut events {
        e.stream = trace_stream_of(e.stream);
    }
    events
}

/// Replays `snapshot` on a wgpu adapter (`adapter`: its index in wgpu's enumeration, `None`:
/// the best) configured with `options.device_total` bytes, under `options`' allocator settings
/// and memory fraction. The device's memory is given back before returning.
pub fn replay_on_wgpu(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    adapter: Option<usize>,
) -> Result<DeviceReplay, RuntimeError> {
    let context: Arc<WgpuContext> = WgpuDevice::request(adapter, options.device_total)
        .map_err(|e| RuntimeError::Unavailable { backend: "wgpu", reason: e.to_string() })?;
    let device = describe_wgpu(&context, options.device_total);
    let recorded = ReplayOptions { record_calls: true, ..options.clone() };
    let sim = replay(snapshot, &recorded, |_, _| {}).map_err(|e| RuntimeError::Parameters(e.to_string()))?;
    let backend = stand_in_backend(cachalot_wgpu::WgpuBackend::new(Arc::clone(&context)));
    let mut allocator = CachingAllocator::new(backend, options.config.clone())?;
    if let Some(fraction) = options.memory_fraction {
        allocator.set_memory_fraction(fraction)?;
    }
    allocator.record_history(true, usize::MAX, &[], false);
    let outcome = make_calls(&mut allocator, &sim.calls, |stream| stream)?;
    let events = events_on_trace_streams(&allocator, |stream| stream);
    let result = summary(device, sim.entries, &allocator, outcome, events);
    context.wait_idle()?;
    allocator.empty_cache()?;
    Ok(result)
}

/// Replays `snapshot` on CUDA device `ordinal` (its own memory: `options.device_total` is not
/// used), under `options`' allocator settings and memory fraction, one CUDA stream per trace
/// stream. The device's memory is given back before returning.
pub fn replay_on_cuda(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    ordinal: usize,
) -> Result<DeviceReplay, RuntimeError> {
    let device = cachalot_cuda::probe(ordinal)
        .map_err(|e| RuntimeError::Unavailable { backend: "cuda", reason: e.to_string() })?;
    let recorded = ReplayOptions { record_calls: true, ..options.clone() };
    let sim = replay(snapshot, &recorded, |_, _| {}).map_err(|e| RuntimeError::Parameters(e.to_string()))?;
    let backend = stand_in_backend(cachalot_cuda::CudaBackend::new(ordinal)?);
    let mut allocator = CachingAllocator::new(backend, options.config.clone())?;
    if let Some(fraction) = options.memory_fraction {
        allocator.set_memory_fraction(fraction)?;
    }
    allocator.record_history(true, usize::MAX, &[], false);
    let cuda = Arc::clone(allocator.backend().inner().cuda());
    let mut streams: HashMap<StreamId, StreamId> = HashMap::from([(StreamId::DEFAULT, StreamId::DEFAULT)]);
    for call in &sim.calls {
        if let ReplayCall::Malloc { stream, .. } = call
            && !streams.contains_key(stream)
        {
            streams.insert(*stream, cuda.new_stream()?);
        }
    }
    let outcome = make_calls(&mut allocator, &sim.calls, |stream| streams.get(&stream).copied().unwrap_or(stream))?;
    let trace_streams: HashMap<StreamId, StreamId> = streams.iter().map(|(&t, &d)| (d, t)).collect();
    let events = events_on_trace_streams(&allocator, |s| trace_streams.get(&s).copied().unwrap_or(s));
    let result = summary(device, sim.entries, &allocator, outcome, events);
    cuda.synchronize()?;
    allocator.empty_cache()?;
    Ok(result)
}

/// The result's figures from the allocator after the calls.
fn summary<B: Backend>(
    device: String,
    entries: usize,
    allocator: &CachingAllocator<B>,
    (ooms, limits, skipped_frees): CallOutcome,
    events: Vec<TraceEntry>,
) -> DeviceReplay {
    let stats = allocator.stats();
    DeviceReplay {
        device,
        entries,
        segments: allocator.snapshot().len(),
        allocated: allocator.memory_allocated(),
        reserved: allocator.memory_reserved(),
        peak_allocated: stats.max_memory_allocated(),
        peak_reserved: stats.max_memory_reserved(),
        device_allocs: stats.num_device_alloc,
        device_frees: stats.num_device_free,
        ooms,
        limits,
        skipped_frees,
        events,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test")]

    use super::*;
    use cachalot_core::SimBackend;

    fn snapshot(name: &str) -> TorchSnapshot {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/traces/pytorch-2.11-h200")
            .join(format!("{name}.pickle"));
        cachalot_trace::snapshot::pickle::read_snapshot(&std::fs::read(path).unwrap()).unwrap()
    }

    /// A simulator with addresses of its own (none planned from the recording), as a device has.
    fn plain_simulator(options: &ReplayOptions) -> CachingAllocator<StandInBackend<SimBackend>> {
        let backend = stand_in_backend(SimBackend::new(options.device_total));
        let mut allocator = CachingAllocator::new(backend, options.config.clone()).unwrap();
        if let Some(fraction) = options.memory_fraction {
            allocator.set_memory_fraction(fraction).unwrap();
        }
        allocator.record_history(true, usize::MAX, &[], false);
        allocator
    }

    /// The calls made again on a plain simulator (no planned addresses, no driver figures) give
    /// the simulator replay's stats: the calls are the whole program, deferred frees included
    /// (multistream has them; the simulator completes an unheld stream's events at once).
    #[test]
    fn the_calls_made_again_give_the_replays_stats() {
        for name in ["multistream", "convnet_train", "kvcache_infer"] {
            let snapshot = snapshot(name);
            let options = ReplayOptions { record_calls: true, ..ReplayOptions::for_snapshot(&snapshot, None).unwrap() };
            let replayed = replay(&snapshot, &options, |_, _| {}).unwrap();
            assert!(!replayed.calls.is_empty(), "{name}");
            let deferred = replayed.calls.iter().any(|c| matches!(c, ReplayCall::Free { deferred: true, .. }));
            assert_eq!(deferred, name == "multistream", "{name}: frees that wait for another stream");
            let mut allocator = plain_simulator(&options);
            let (ooms, limits, skipped) = make_calls(&mut allocator, &replayed.calls, |s| s).unwrap();
            assert_eq!((ooms.len(), limits.len(), skipped), (0, 0, 0), "{name}");
            let (want, got) = (replayed.allocator.stats(), allocator.stats());
            assert_eq!(got.max_memory_reserved(), want.max_memory_reserved(), "{name}");
            assert_eq!(got.max_memory_allocated(), want.max_memory_allocated(), "{name}");
            assert_eq!(got.num_device_alloc, want.num_device_alloc, "{name}");
            assert_eq!(allocator.memory_reserved(), replayed.allocator.memory_reserved(), "{name}");
            assert_eq!(allocator.memory_allocated(), replayed.allocator.memory_allocated(), "{name}");
        }
    }

    /// On a device too small for the job, every refused request is an OOM of the result and the
    /// free of its block is skipped; the simulator replay refuses the same requests.
    #[test]
    fn refused_requests_are_ooms_and_their_frees_are_skipped() {
        let snapshot = snapshot("convnet_train");
        let options = ReplayOptions {
            record_calls: true,
            device_total: 150 << 20,
            ..ReplayOptions::for_snapshot(&snapshot, None).unwrap()
        };
        let replayed = replay(&snapshot, &options, |_, _| {}).unwrap();
        let mut allocator = plain_simulator(&options);
        let (ooms, _, skipped) = make_calls(&mut allocator, &replayed.calls, |s| s).unwrap();
        let indices = |o: &[ReplayOom]| o.iter().map(|o| o.index).collect::<Vec<_>>();
        assert!(!ooms.is_empty());
        assert_eq!(indices(&ooms), indices(&replayed.ooms));
        assert_eq!(skipped, ooms.len());
        assert_eq!(allocator.memory_allocated(), replayed.allocator.memory_allocated());
    }

    /// The calls made again on a plain simulator give the recorded events, addresses as
    /// (segment, offset), deferred frees completing where they did (multistream has 40): what
    /// `replay --check` on a device compares. Where the recording's decisions depended on
    /// addresses, they differ, and the check says so: best-fit ties between blocks of equal
    /// size are broken by address, and the simulator lays segments out upwards where CUDA's
    /// driver went downwards; `oom_probe_fraction`'s OOM came from the driver's free memory.
    #[test]
    fn the_calls_made_again_give_the_recorded_events() {
        for name in ["multistream", "gpt_train_expandable", "seeds", "convnet_train", "oom_probe_fraction"] {
            let snapshot = snapshot(name);
            let options = ReplayOptions { record_calls: true, ..ReplayOptions::for_snapshot(&snapshot, None).unwrap() };
            let replayed = replay(&snapshot, &options, |_, _| {}).unwrap();
            let mut allocator = plain_simulator(&options);
            let outcome = make_calls(&mut allocator, &replayed.calls, |s| s).unwrap();
            let events = events_on_trace_streams(&allocator, |s| s);
            let device = summary("simulator".into(), replayed.entries, &allocator, outcome, events);
            let diff = check_events(&snapshot.device_traces[0], &device);
            match name {
                "convnet_train" => assert!(tie_broken_by_address(&diff), "{name}: {diff}"),
                "oom_probe_fraction" => assert!(!tie_broken_by_address(&diff), "{name}: {diff}"),
                _ => assert!(matches!(diff, EventDiff::Identical { .. }), "{name}: {diff}"),
            }
        }
    }

    /// Without their completion calls, multistream's deferred frees stay pending until a
    /// synchronization: the check sees it.
    #[test]
    fn deferred_frees_complete_at_the_recorded_point_only_with_stand_ins() {
        let snapshot = snapshot("multistream");
        let options = ReplayOptions { record_calls: true, ..ReplayOptions::for_snapshot(&snapshot, None).unwrap() };
        let calls = replay(&snapshot, &options, |_, _| {}).unwrap().calls;
        let without: Vec<ReplayCall> =
            calls.iter().copied().filter(|c| !matches!(c, ReplayCall::FreeCompleted { .. })).collect();
        let completed: std::collections::HashSet<usize> = calls
            .iter()
            .filter_map(|c| if let ReplayCall::FreeCompleted { free, .. } = c { Some(*free) } else { None })
            .collect();
        let deferred = calls.iter().filter(|c| matches!(c, ReplayCall::Free { deferred: true, .. })).count();
        assert_eq!(completed.len(), calls.len() - without.len(), "each deferred free completes once");
        // One of multistream's 40 deferred frees never completed in the recording.
        assert_eq!((deferred, completed.len()), (40, 39));
        let mut allocator = plain_simulator(&options);
        let outcome = make_calls(&mut allocator, &without, |s| s).unwrap();
        let device = summary("simulator".into(), 0, &allocator, outcome, events_on_trace_streams(&allocator, |s| s));
        let diff = check_events(&snapshot.device_traces[0], &device);
        assert!(!matches!(diff, EventDiff::Identical { .. }), "{diff}");
    }

    /// Without `record_calls` the replay keeps none (tune's hundreds of replays pay nothing).
    #[test]
    fn calls_are_kept_only_when_asked() {
        let snapshot = snapshot("multistream");
        let options = ReplayOptions::for_snapshot(&snapshot, None).unwrap();
        assert!(replay(&snapshot, &options, |_, _| {}).unwrap().calls.is_empty());
    }
}
