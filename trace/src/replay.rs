//! Replaying a recorded PyTorch trace through the allocator on the simulator, and verifying the
//! result against what PyTorch recorded (its trace, its final segments, and the
//! `memory_stats()`, `memory_summary()` and OOM messages of the run's `expected.json`).
//!
//! What the replay feeds the allocator is only what a program would: allocations, frees,
//! `record_stream` completions and `empty_cache` calls. Everything else — segment events,
//! splits, merges, stats — must come out of the policy by itself. Two facts of the recording
//! are given to the simulator because the device, not the allocator, decided them: the
//! addresses of new segments (PyTorch 2.11 breaks best-fit ties by address) and, at a recorded
//! out-of-memory error, the free memory the driver reported.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::snapshot::torch::TorchSnapshot;
use cachalot_core::backend::StreamId;
use cachalot_core::config::{AllocatorConfig, ConfigError};
use cachalot_core::error::{AllocatorError, OutOfMemoryError};
use cachalot_core::sim::SimBackend;
use cachalot_core::size::{MAX_REQUEST, SMALL_BUFFER};
use cachalot_core::stats::MemoryStats;
use cachalot_core::trace::{TraceAction, TraceEntry};
use cachalot_core::{Allocation, CachingAllocator};

/// `total_memory` assumed when neither the run nor the caller says (the H200 of the reference
/// traces).
pub const DEFAULT_DEVICE_TOTAL: u64 = 150_109_880_320;

/// Streams the replay invents for frees that completed later than requested: one per such
/// free, ordered like their completions so simultaneous completions come out in trace order.
const SYNTHETIC_STREAMS: u64 = 1 << 62;

/// How to set up the replayed allocator.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// The allocator configuration of the recorded run.
    pub config: AllocatorConfig,
    /// `set_per_process_memory_fraction` of the run, if any.
    pub memory_fraction: Option<f64>,
    /// Total memory of the recorded device.
    pub device_total: u64,
    /// Which of the snapshot's device traces to replay.
    pub device: usize,
    /// Whether to keep the allocator calls the replay made ([`ReplayOutcome::calls`]), to make
    /// them again on a device (`cachalot replay --backend wgpu`).
    pub record_calls: bool,
}

impl ReplayOptions {
    /// Options from the snapshot's `allocator_settings` and, where given, the run's
    /// `expected.json` (which also knows the memory fraction and the device total).
    pub fn for_snapshot(snapshot: &TorchSnapshot, expected: Option<&ExpectedRun>) -> Result<Self, ConfigError> {
        let settings = match (expected, &snapshot.allocator_settings) {
            (Some(e), _) => e.settings.clone(),
            (None, Some(s)) => s.settings.clone(),
            (None, None) => String::new(),
        };
        Ok(ReplayOptions {
            config: AllocatorConfig::parse(&settings)?,
            memory_fraction: expected.and_then(|e| e.memory_fraction),
            device_total: expected.and_then(|e| e.device_total).unwrap_or(DEFAULT_DEVICE_TOTAL),
            device: 0,
            record_calls: false,
        })
    }
}

/// A trace that cannot be replayed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplayError {
    /// The snapshot has no trace for the device.
    #[error("the snapshot has no trace for device {device} (it has {available})")]
    NoTrace {
        /// Requested device.
        device: usize,
        /// Number of device traces present.
        available: usize,
    },
    /// A free of an address with no live allocation.
    #[error(
        "device_traces[{device}][{index}]: {action} of {addr:#x}, which is not allocated at that point \
         (a replay needs the whole history: was recording started after allocations, or did the \
         ring buffer of max_entries drop the oldest entries?)"
    )]
    UnknownAddress {
        /// Device trace.
        device: usize,
        /// Entry index.
        index: usize,
        /// The action name.
        action: &'static str,
        /// The address.
        addr: u64,
    },
    /// A device size no device has: above 1 EiB, the most PyTorch lets one request ask for, the
    /// simulated address space of the replay could not hold the recording's segments.
    #[error("a device of {0} bytes is larger than any device (at most 1 EiB = {MAX_REQUEST} bytes)")]
    DeviceTotal(u64),
    /// The allocator could not be set up.
    #[error("allocator setup: {0}")]
    Setup(#[from] AllocatorError),
}

/// Something the replay did differently from the recording, found while replaying.
#[derive(Clone, Debug, PartialEq)]
pub struct Divergence {
    /// Index of the trace entry.
    pub index: usize,
    /// What differed.
    pub message: String,
}

/// An out-of-memory error the replayed allocator raised.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ReplayOom {
    /// Index of the trace entry whose request failed.
    pub index: usize,
    /// The error message, as PyTorch words it.
    pub message: String,
    /// Whether PyTorch ran out of memory there too (an `oom` entry of the recording), rather
    /// than serving the request.
    pub recorded: bool,
}

/// The result of a replay.
pub struct ReplayOutcome {
    /// The allocator after the whole trace, with its own trace recorded.
    pub allocator: CachingAllocator<SimBackend>,
    /// Out-of-memory errors the replay raised, in order: those PyTorch raised too and those
    /// where its request succeeded (which are also divergences).
    pub ooms: Vec<ReplayOom>,
    /// Differences noticed during the replay, in order.
    pub divergences: Vec<Divergence>,
    /// Where the replay called `empty_cache`.
    pub empty_cache_points: Vec<usize>,
    /// Entries replayed.
    pub entries: usize,
    /// The device trace that was replayed.
    pub device: usize,
    /// The allocator calls the replay made, in order, when [`ReplayOptions::record_calls`]
    /// asked for them (else empty).
    pub calls: Vec<ReplayCall>,
}

/// One call the replay made to the allocator: what the recorded program did, without the
/// simulator's help (planned addresses, the driver's free memory at a recorded OOM), so that
/// another backend can make the same calls. Allocations are named by the index of the trace
/// entry that made them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayCall {
    /// `malloc(size, stream)` for trace entry `index` (an `alloc`, or an `oom` entry: PyTorch's
    /// request failed there, which a larger device may serve).
    Malloc {
        /// The trace entry.
        index: usize,
        /// Bytes requested.
        size: u64,
        /// The stream of the request.
        stream: StreamId,
        /// Whether PyTorch ran out of memory here (an `oom` entry).
        recorded_oom: bool,
    },
    /// `free` of the allocation made at trace entry `malloc`, requested at trace entry `index`;
    /// `deferred` when the block was used on another stream (`record_stream`), so that the free
    /// completed later (at a `free_completed` entry) or never.
    Free {
        /// The `free_requested` entry.
        index: usize,
        /// The entry whose `Malloc` made the allocation.
        malloc: usize,
        /// Whether the free waits for another stream.
        deferred: bool,
    },
    /// `empty_cache()`, before trace entry `index`.
    EmptyCache {
        /// The trace entry it precedes.
        index: usize,
    },
}

/// What the recorded run's `expected.json` says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpectedRun {
    /// `PYTORCH_CUDA_ALLOC_CONF`.
    pub settings: String,
    /// The memory fraction, if one was set.
    pub memory_fraction: Option<f64>,
    /// `total_memory` of the device.
    pub device_total: Option<u64>,
    /// `memory_stats()` at the end.
    pub memory_stats: BTreeMap<String, i64>,
    /// `memory_summary()` at the end.
    pub memory_summary: Option<String>,
    /// Labelled marks, with OOM messages where one was raised.
    pub marks: Vec<ExpectedMark>,
}

/// A mark of [`ExpectedRun`].
#[derive(Clone, Debug, PartialEq)]
pub struct ExpectedMark {
    /// Label.
    pub label: String,
    /// `memory_allocated()` there.
    pub allocated: Option<u64>,
    /// `memory_reserved()` there.
    pub reserved: Option<u64>,
    /// The OOM message caught there.
    pub message: Option<String>,
}

impl ExpectedRun {
    /// The `NAME.expected.json` beside a trace `NAME.pickle`, if there is one; an error names
    /// that file and what is wrong with it.
    pub fn beside(trace: &std::path::Path) -> Result<Option<Self>, String> {
        let name = trace.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let stem = name.strip_suffix(".pickle").unwrap_or(&name);
        let path = trace.with_file_name(format!("{stem}.expected.json"));
        if !path.exists() {
            return Ok(None);
        }
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        Self::from_json(&bytes).map(Some).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses an `expected.json` written by `shared/traces/capture.py`; errors name the field.
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let object = value.as_object().ok_or("expected a JSON object at the top level")?;
        let number = |key: &str| -> Result<Option<f64>, String> {
            match object.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::Number(n)) => Ok(n.as_f64()),
                Some(serde_json::Value::String(s)) => {
                    s.parse().map(Some).map_err(|_| format!("{key}: '{s}' is not a number"))
                }
                Some(other) => Err(format!("{key}: expected a number, found {other}")),
            }
        };
        let mut run = ExpectedRun {
            settings: match object.get("PYTORCH_CUDA_ALLOC_CONF") {
                None | Some(serde_json::Value::Null) => String::new(),
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(other) => return Err(format!("PYTORCH_CUDA_ALLOC_CONF: expected a string, found {other}")),
            },
            memory_fraction: number("memory_fraction")?,
            device_total: number("device_total_bytes")?.map(|t| t as u64),
            ..ExpectedRun::default()
        };
        if let Some(stats) = object.get("memory_stats") {
            let stats = stats.as_object().ok_or("memory_stats: expected an object")?;
            for (key, value) in stats {
                let v = value.as_i64().ok_or_else(|| format!("memory_stats.{key}: expected an integer"))?;
                run.memory_stats.insert(key.clone(), v);
            }
        }
        run.memory_summary = object.get("memory_summary").and_then(|s| s.as_str()).map(str::to_owned);
        if let Some(marks) = object.get("marks") {
            let marks = marks.as_array().ok_or("marks: expected a list")?;
            for (i, mark) in marks.iter().enumerate() {
                let label = mark.get("label").and_then(|l| l.as_str()).ok_or(format!("marks[{i}].label: missing"))?;
                run.marks.push(ExpectedMark {
                    label: label.to_owned(),
                    allocated: mark.get("allocated").and_then(|v| v.as_u64()),
                    reserved: mark.get("reserved").and_then(|v| v.as_u64()),
                    message: mark.get("message").and_then(|v| v.as_str()).map(str::to_owned),
                });
            }
        }
        Ok(run)
    }
}

/// The frees that did not complete at once (their block was used on another stream), by the
/// index of their `free_requested` entry: the index of their `free_completed`, or `None` for
/// never. Frees that completed at once, nearly all of them, are not in it.
type DeferredFrees = FxHashMap<usize, Option<usize>>;

/// Replays `snapshot`'s trace of `options.device`, calling `progress(done, total)` now and then.
pub fn replay(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<ReplayOutcome, ReplayError> {
    let device = options.device;
    let trace = snapshot
        .device_traces
        .get(device)
        .ok_or(ReplayError::NoTrace { device, available: snapshot.device_traces.len() })?;
    if options.device_total > MAX_REQUEST {
        return Err(ReplayError::DeviceTotal(options.device_total));
    }

    let mut sim = SimBackend::new(options.device_total);
    let (segments, reservations) = planned_addresses(trace, options);
    sim.plan_segment_addresses(segments);
    sim.plan_reservation_addresses(reservations);
    let mut allocator = CachingAllocator::new(sim, options.config.clone())?;
    if let Some(fraction) = options.memory_fraction {
        allocator.set_memory_fraction(fraction)?;
    }
    allocator.record_history(true, usize::MAX, &[], false);
    allocator.adopt_contexts(snapshot.contexts.clone());

    let deferred = deferred_frees(trace);
    let completions: FxHashMap<usize, StreamId> =
        deferred.values().flatten().map(|&j| (j, synthetic_stream(j))).collect();

    let mut live: FxHashMap<u64, (Allocation, usize)> = FxHashMap::default();
    let mut calls = Vec::new();
    // Allocations the simulator refused, by address, while calls are kept: the program freed
    // them (PyTorch served them), and another device may serve them too.
    let mut refused: FxHashMap<u64, usize> = FxHashMap::default();
    let mut call = |c: ReplayCall| {
        if options.record_calls {
            calls.push(c);
        }
    };
    let mut ooms = Vec::new();
    let mut divergences = Vec::new();
    let mut empty_cache_points = Vec::new();
    let mut i = 0;
    while i < trace.len() {
        if i % 65_536 == 0 {
            progress(i, trace.len());
        }
        let e = &trace[i];
        allocator.backend_mut().set_time_us(e.time_us);
        allocator.set_context(e.context);
        allocator.set_annotation_id(e.annotation);
        match e.action {
            TraceAction::Alloc => {
                call(ReplayCall::Malloc { index: i, size: e.size, stream: e.stream, recorded_oom: false });
                match allocator.malloc(e.size, e.stream) {
                    Ok(a) => {
                        if a.address() != e.addr {
                            divergences.push(Divergence {
                                index: i,
                                message: format!(
                                    "alloc of {} B got {:#x}, PyTorch got {:#x}",
                                    e.size,
                                    a.address(),
                                    e.addr
                                ),
                            });
                        }
                        live.insert(e.addr, (a, i));
                    }
                    Err(error) => {
                        if options.record_calls {
                            refused.insert(e.addr, i);
                        }
                        if let AllocatorError::OutOfMemory(oom) = &error {
                            ooms.push(ReplayOom { index: i, message: oom.message.clone(), recorded: false });
                        }
                        divergences.push(Divergence {
                            index: i,
                            message: format!("alloc of {} B failed where PyTorch's succeeded: {error}", e.size),
                        })
                    }
                }
            }
            TraceAction::FreeRequested => {
                let Some((allocation, malloc)) = live.remove(&e.addr) else {
                    if let Some(malloc) = refused.remove(&e.addr) {
                        call(ReplayCall::Free { index: i, malloc, deferred: deferred.contains_key(&i) });
                        i += 1;
                        continue;
                    }
                    if divergences.iter().any(|d| d.message.contains("failed where")) {
                        i += 1;
                        continue; // its alloc already diverged
                    }
                    return Err(ReplayError::UnknownAddress {
                        device,
                        index: i,
                        action: "free_requested",
                        addr: e.addr,
                    });
                };
                call(ReplayCall::Free { index: i, malloc, deferred: deferred.contains_key(&i) });
                if let Some(completion) = deferred.get(&i) {
                    let stream = completion.map_or(StreamId(u64::MAX), synthetic_stream);
                    allocator.backend_mut().hold_stream(stream);
                    allocator.record_stream(&allocation, stream).map_err(ReplayError::Setup)?;
                }
                if let Err(error) = allocator.free(allocation) {
                    divergences.push(Divergence { index: i, message: format!("free failed: {error}") });
                }
            }
            TraceAction::FreeCompleted => {
                if let Some(&stream) = completions.get(&i) {
                    // The other stream's work is done now; the free completes at the next
                    // malloc, or here if the program called empty_cache with nothing to free.
                    allocator.backend_mut().finish_stream(stream);
                    let after = (i + 1..trace.len())
                        .find(|&n| !(trace[n].action == TraceAction::FreeCompleted && completions.contains_key(&n)));
                    if after.is_none_or(|n| !ends_sync_run(trace[n].action)) {
                        let last = trace[i..].iter().take_while(|n| n.action == TraceAction::FreeCompleted).count();
                        for j in i..i + last {
                            if let Some(&s) = completions.get(&j) {
                                allocator.backend_mut().finish_stream(s);
                            }
                        }
                        i += last;
                        empty_cache_points.push(i - last);
                        call(ReplayCall::EmptyCache { index: i - last });
                        allocator.empty_cache().map_err(ReplayError::Setup)?;
                        continue;
                    }
                }
            }
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                let run = trace[i..]
                    .iter()
                    .take_while(|n| matches!(n.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap))
                    .count();
                if !released_by_next_malloc(&allocator, trace, i, run) {
                    empty_cache_points.push(i);
                    call(ReplayCall::EmptyCache { index: i });
                    if let Err(error) = allocator.empty_cache() {
                        divergences.push(Divergence { index: i, message: format!("empty_cache failed: {error}") });
                    }
                }
                i += run;
                continue;
            }
            TraceAction::Oom => {
                allocator.backend_mut().set_free_memory_override(Some(e.addr));
                call(ReplayCall::Malloc { index: i, size: e.size, stream: e.stream, recorded_oom: true });
                match allocator.malloc(e.size, e.stream) {
                    Err(AllocatorError::OutOfMemory(oom)) => {
                        ooms.push(ReplayOom { index: i, message: oom.message, recorded: true })
                    }
                    Err(other) => {
                        divergences.push(Divergence { index: i, message: format!("expected OOM, got: {other}") })
                    }
                    Ok(a) => {
                        divergences.push(Divergence {
                            index: i,
                            message: format!("PyTorch ran out of memory for {} B, the replay did not", e.size),
                        });
                        let _ = allocator.free(a);
                    }
                }
                allocator.backend_mut().set_free_memory_override(None);
            }
            // Caused by allocations, which the replay performs itself.
            TraceAction::SegmentAlloc | TraceAction::SegmentMap | TraceAction::Snapshot => {}
        }
        i += 1;
    }
    progress(trace.len(), trace.len());
    allocator.set_context(None);
    allocator.set_annotation_id(None);
    Ok(ReplayOutcome { allocator, ooms, divergences, empty_cache_points, entries: trace.len(), device, calls })
}

fn synthetic_stream(completion: usize) -> StreamId {
    StreamId(SYNTHETIC_STREAMS + completion as u64)
}

/// After the deferred completions of a synchronization, these actions mean a malloc or a
/// release follows; anything else means the program called `empty_cache` and nothing was freed.
fn ends_sync_run(action: TraceAction) -> bool {
    matches!(
        action,
        TraceAction::Alloc
            | TraceAction::SegmentAlloc
            | TraceAction::SegmentMap
            | TraceAction::Oom
            | TraceAction::SegmentFree
            | TraceAction::SegmentUnmap
    )
}

/// Decides whether the releases `trace[i..i + run]` are the work of the next malloc (garbage
/// collection, the oversize release or the full release of the retry chain) or of an
/// `empty_cache` call. Where the order of the trace leaves both possible, a copy of the
/// allocator performs the next malloc to see.
fn released_by_next_malloc(
    allocator: &CachingAllocator<SimBackend>,
    trace: &[TraceEntry],
    i: usize,
    run: usize,
) -> bool {
    let Some(next) = trace.get(i + run) else { return false };
    match next.action {
        TraceAction::Oom => true,
        TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
            let Some(request) = trace[i + run..]
                .iter()
                .find(|n| !matches!(n.action, TraceAction::SegmentAlloc | TraceAction::SegmentMap))
            else {
                return false;
            };
            if !matches!(request.action, TraceAction::Alloc) {
                return false;
            }
            let mut probe = allocator.clone();
            probe.record_history(false, 1, &[], true);
            let before = probe.stats().num_device_free;
            probe.malloc(request.size, request.stream).is_ok() && probe.stats().num_device_free - before == run as u64
        }
        _ => false,
    }
}

/// The addresses the recording's device gave new segments and new VA reservations, in order.
fn planned_addresses(trace: &[TraceEntry], options: &ReplayOptions) -> (Vec<u64>, Vec<u64>) {
    let total = options.device_total;
    let extent = |page: u64| (total + total / 8).div_ceil(page) * page;
    let va = extent(SMALL_BUFFER).max(extent(options.config.large_segment_size()));
    let mut segments = Vec::new();
    let mut bases = Vec::new();
    // Live reservations: base -> mapped bytes. A reservation whose last page is unmapped is
    // released by PyTorch at once, so its VA may come back as a new reservation.
    let mut reservations: BTreeMap<u64, u64> = BTreeMap::new();
    for e in trace {
        match e.action {
            TraceAction::SegmentAlloc => segments.push(e.addr),
            TraceAction::SegmentMap => {
                let owner =
                    reservations.range(..=e.addr).next_back().filter(|(b, _)| e.addr < *b + va).map(|(b, _)| *b);
                let base = owner.unwrap_or_else(|| {
                    bases.push(e.addr);
                    e.addr
                });
                *reservations.entry(base).or_default() += e.size;
            }
            TraceAction::SegmentUnmap => {
                let owner = reservations.range(..=e.addr).next_back().map(|(b, _)| *b);
                if let Some(base) = owner {
                    let mapped = reservations.entry(base).or_default();
                    *mapped = mapped.saturating_sub(e.size);
                    if *mapped == 0 {
                        reservations.remove(&base);
                    }
                }
            }
            _ => {}
        }
    }
    (segments, bases)
}

/// Finds the frees that completed later than requested, and when.
fn deferred_frees(trace: &[TraceEntry]) -> DeferredFrees {
    let mut deferred = DeferredFrees::default();
    let mut open: FxHashMap<u64, usize> = FxHashMap::default();
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            TraceAction::FreeRequested => {
                let immediate =
                    trace.get(i + 1).is_some_and(|n| n.action == TraceAction::FreeCompleted && n.addr == e.addr);
                if !immediate {
                    deferred.insert(i, None);
                    open.insert(e.addr, i);
                }
            }
            TraceAction::FreeCompleted => {
                if let Some(request) = open.remove(&e.addr) {
                    deferred.insert(request, Some(i));
                }
            }
            _ => {}
        }
    }
    deferred
}

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
    let allocator = &outcome.allocator;
    let device = outcome.device;
    if let Some(d) = outcome.divergences.first() {
        return Err(format!("entry {}: {}", d.index, d.message));
    }
    // Every segment event, in order.
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
    verify_final_segments(snapshot, device, allocator)?;
    if let Some(expected) = expected {
        verify_expected_run(allocator.stats(), allocator, outcome, expected)?;
    }
    Ok(())
}

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
    for (o, t) in ours.iter().zip(&theirs) {
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
        if o.blocks.len() != t.blocks.len() {
            return Err(format!(
                "final segment at {at:#x}: PyTorch has {} blocks, replay {}",
                t.blocks.len(),
                o.blocks.len()
            ));
        }
        for (ob, tb) in o.blocks.iter().zip(&t.blocks) {
            if (ob.address, ob.size, ob.requested_size, ob.state) != (tb.address, tb.size, tb.requested_size, tb.state)
            {
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
    }
    Ok(())
}

fn verify_expected_run(
    stats: &MemoryStats,
    allocator: &CachingAllocator<SimBackend>,
    outcome: &ReplayOutcome,
    expected: &ExpectedRun,
) -> Result<(), String> {
    let ours = stats.to_flat();
    for (key, value) in &expected.memory_stats {
        match ours.get(key) {
            Some(v) if v == value => {}
            Some(v) => return Err(format!("memory_stats[{key}]: PyTorch {value}, replay {v}")),
            None if key == "num_oom_rejections" => {}
            None => return Err(format!("memory_stats[{key}]: missing in the replay")),
        }
    }
    if let Some(summary) = &expected.memory_summary {
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
    }
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
