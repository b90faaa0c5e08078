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
//! # Streams on wgpu
//!
//! wgpu has one queue. Every stream of the trace keeps its own pools (the allocator keys blocks
//! by stream, whatever the backend), so blocks are never shared across trace streams, as in
//! PyTorch; but all the streams' work is the one queue's. A free that PyTorch deferred
//! (`record_stream` on another stream) is recorded on the queue ([`QUEUE_STREAM`]) and completes
//! when the queue has passed it — with no kernels submitted, at the next allocator call — not at
//! the trace's `free_completed` entry. A device limit that refuses a request (wgpu's
//! `max_buffer_size`, or the configured capacity, since wgpu cannot query free memory) is named
//! with the request and its trace entry ([`LimitHit`]).
//!
//! # Streams on CUDA
//!
//! Each stream of the trace gets a CUDA stream of its own (the trace's default stream, 0, is
//! the device's default stream), so segments and pools are per stream as in the recorded run.
//! A deferred free is recorded on one more stream, a side stream with no work on it: its event
//! has completed by the next allocator call, so, as on wgpu, the free completes there rather
//! than at the trace's `free_completed` entry.

use std::collections::HashMap;
use std::sync::Arc;

use cachalot_core::error::AllocatorError;
use cachalot_core::{Allocation, Backend, CachingAllocator, StreamId};
use cachalot_trace::replay::{ReplayCall, ReplayOom, ReplayOptions, replay};
use cachalot_trace::snapshot::torch::TorchSnapshot;
use cachalot_wgpu::WgpuContext;

use crate::device::QUEUE_STREAM;
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
}

/// What [`make_calls`] saw: the OOMs, those a device limit caused, and the frees skipped.
pub type CallOutcome = (Vec<ReplayOom>, Vec<LimitHit>, usize);

/// Makes `calls` on `allocator`, each trace stream replaced by `stream_of(stream)`; deferred
/// frees are recorded on `deferred_stream` first. A request that fails is an OOM of the result
/// (with the limit named where the backend named one), and the free of what it would have made
/// is skipped; any other error stops the replay.
pub fn make_calls<B: Backend>(
    allocator: &mut CachingAllocator<B>,
    calls: &[ReplayCall],
    stream_of: impl Fn(StreamId) -> StreamId,
    deferred_stream: StreamId,
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
            ReplayCall::Free { malloc, deferred, .. } => {
                let Some(allocation) = live.remove(&malloc) else {
                    skipped += 1;
                    continue;
                };
                if deferred {
                    allocator.record_stream(&allocation, deferred_stream)?;
                }
                allocator.free(allocation)?;
            }
            ReplayCall::EmptyCache { .. } => allocator.empty_cache()?,
            ReplayCall::Pool { call, .. } => call.perform(allocator, &stream_of)?,
        }
    }
    Ok((ooms, limits, skipped))
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
    let mut allocator = cachalot_wgpu::caching_allocator(&context, options.config.clone())?;
    if let Some(fraction) = options.memory_fraction {
        allocator.set_memory_fraction(fraction)?;
    }
    let outcome = make_calls(&mut allocator, &sim.calls, |stream| stream, QUEUE_STREAM)?;
    let result = summary(device, sim.entries, &allocator, outcome);
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
    let mut allocator = cachalot_cuda::caching_allocator(ordinal, options.config.clone())?;
    if let Some(fraction) = options.memory_fraction {
        allocator.set_memory_fraction(fraction)?;
    }
    let cuda = Arc::clone(allocator.backend().cuda());
    let mut streams: HashMap<StreamId, StreamId> = HashMap::from([(StreamId::DEFAULT, StreamId::DEFAULT)]);
    for call in &sim.calls {
        if let ReplayCall::Malloc { stream, .. } = call
            && !streams.contains_key(stream)
        {
            streams.insert(*stream, cuda.new_stream()?);
        }
    }
    let side = cuda.new_stream()?;
    let outcome =
        make_calls(&mut allocator, &sim.calls, |stream| streams.get(&stream).copied().unwrap_or(stream), side)?;
    let result = summary(device, sim.entries, &allocator, outcome);
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
            let mut allocator =
                CachingAllocator::new(SimBackend::new(options.device_total), options.config.clone()).unwrap();
            let (ooms, limits, skipped) = make_calls(&mut allocator, &replayed.calls, |s| s, QUEUE_STREAM).unwrap();
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
        let mut allocator =
            CachingAllocator::new(SimBackend::new(options.device_total), options.config.clone()).unwrap();
        let (ooms, _, skipped) = make_calls(&mut allocator, &replayed.calls, |s| s, QUEUE_STREAM).unwrap();
        let indices = |o: &[ReplayOom]| o.iter().map(|o| o.index).collect::<Vec<_>>();
        assert!(!ooms.is_empty());
        assert_eq!(indices(&ooms), indices(&replayed.ooms));
        assert_eq!(skipped, ooms.len());
        assert_eq!(allocator.memory_allocated(), replayed.allocator.memory_allocated());
    }

    /// Without `record_calls` the replay keeps none (tune's hundreds of replays pay nothing).
    #[test]
    fn calls_are_kept_only_when_asked() {
        let snapshot = snapshot("multistream");
        let options = ReplayOptions::for_snapshot(&snapshot, None).unwrap();
        assert!(replay(&snapshot, &options, |_, _| {}).unwrap().calls.is_empty());
    }
}
