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

use crate::pool_calls::PoolCall;
use crate::snapshot::torch::TorchSnapshot;
use cachalot_core::backend::Segments;
use cachalot_core::backend::StreamId;
use cachalot_core::config::{AllocatorConfig, ConfigError, Policy};
use cachalot_core::error::{AllocatorError, OutOfMemoryError};
use cachalot_core::sim::SimBackend;
use cachalot_core::size::{MAX_REQUEST, SMALL_BUFFER, SMALL_SIZE, allocation_size, round_size};
use cachalot_core::stats::MemoryStats;
use cachalot_core::trace::{TraceAction, TraceEntry};
use cachalot_core::{Allocation, CachingAllocator, OomObserver};

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
    /// The calls of the program that leave no entry of their own in the trace, where the run's
    /// `expected.json` lists them (`calls`); `None` where it does not, and the replay infers
    /// `empty_cache` calls from the releases no allocation caused.
    pub calls: Option<Vec<ProgramCall>>,
    /// Whether to keep the allocator calls the replay made ([`ReplayOutcome::calls`]), to make
    /// them again on a device (`cachalot replay --backend wgpu`).
    pub record_calls: bool,
}

/// A call of the recorded program that the trace does not show by itself
/// (`scripts/conformance/capture.py` records a `snapshot` entry just before each).
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramCall {
    /// What was called.
    pub call: CallKind,
    /// Index of the `snapshot` entry recorded just before the call.
    pub at: usize,
}

/// The calls of [`ProgramCall`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
    /// `torch.cuda.reset_peak_memory_stats()`.
    ResetPeakMemoryStats,
    /// `torch.cuda.reset_accumulated_memory_stats()`.
    ResetAccumulatedMemoryStats,
    /// A private-pool call (`MemPool`, `use_mem_pool`, a graph capture; [`PoolCall`]).
    Pool(PoolCall),
}

/// Writes pool calls into `trace` where a capture records them, and returns the replay's list
/// of them. Each call of `calls` comes with the length the trace had when it was made; it is
/// recorded after a `snapshot` entry inserted there, as `capture_pools.py` records a program's
/// calls. For traces made in code (tests, the replay benchmarks) by an allocator whose pool
/// calls were made beside it.
pub fn record_pool_calls(trace: &mut Vec<TraceEntry>, calls: &[(usize, PoolCall)]) -> Vec<ProgramCall> {
    let mut program_calls = Vec::with_capacity(calls.len());
    for (n, &(before, call)) in calls.iter().enumerate() {
        // Each marker inserted before this one shifts the call's place by one.
        let at = before + n;
        let time_us = trace.get(at.min(trace.len().saturating_sub(1))).map_or(0, |entry| entry.time_us);
        let marker = TraceEntry {
            action: TraceAction::Snapshot,
            addr: 0,
            size: 0,
            stream: StreamId(0),
            time_us,
            context: None,
            annotation: None,
        };
        trace.insert(at.min(trace.len()), marker);
        program_calls.push(ProgramCall { call: CallKind::Pool(call), at });
    }
    program_calls
}

impl CallKind {
    /// The call's name in `expected.json`, PyTorch's function name.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "empty_cache" => Some(CallKind::EmptyCache),
            "reset_peak_memory_stats" => Some(CallKind::ResetPeakMemoryStats),
            "reset_accumulated_memory_stats" => Some(CallKind::ResetAccumulatedMemoryStats),
            _ => None,
        }
    }
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
            calls: expected.and_then(|e| e.calls.clone()),
            record_calls: false,
        })
    }

    /// These options for device trace `device` of the same process. The settings, fraction and
    /// device total stay (a process has one `PYTORCH_CUDA_ALLOC_CONF` for all its devices); the
    /// program's calls are that device's own, from its `recorded` run, as each call was made on
    /// one device's allocator (none where its recording lists none).
    pub fn for_device(&self, device: usize, recorded: Option<&ExpectedRun>) -> ReplayOptions {
        let mut options = self.clone();
        if device != self.device {
            options.device = device;
            options.calls = recorded.and_then(|r| r.calls.clone());
        }
        options
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
    /// How many times the replay copied the allocator's live state to try a malloc, where the
    /// state alone did not tell what the malloc would do (a full release while a cross-stream
    /// free is outstanding, private pools, pages mapped in pieces; see
    /// [`CachingAllocator::releases_of_malloc`]): each copy
    /// costs the live blocks, so a shape that needed one per entry would replay in quadratic
    /// time. The tests hold it to zero for the shapes that once did.
    pub trial_copies: usize,
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
    /// The other stream's work on the block of the deferred free requested at trace entry
    /// `free` ended here (trace entry `index`, its `free_completed`): the free completes at the
    /// allocator's next call. Always before the [`ReplayCall::EmptyCache`] whose synchronization
    /// completed it. A deferred free without one never completed in the recording.
    FreeCompleted {
        /// The `free_completed` entry.
        index: usize,
        /// The `free_requested` entry of the free.
        free: usize,
    },
    /// `empty_cache()`, before trace entry `index`.
    EmptyCache {
        /// The trace entry it precedes.
        index: usize,
    },
    /// A private-pool call, before trace entry `index` ([`PoolCall::perform`] makes it).
    Pool {
        /// The trace entry it precedes.
        index: usize,
        /// The call.
        call: PoolCall,
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
    /// Every `empty_cache` and stats reset of the program, where the capture listed them.
    pub calls: Option<Vec<ProgramCall>>,
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
        Self::beside_device(trace, 0)
    }

    /// What was recorded for device `device` of a trace `NAME.pickle`, if anything was: device
    /// 0's run is `NAME.expected.json`, device N's `NAME.deviceN.expected.json`, as
    /// `scripts/conformance/capture_devices.py` writes them for a process on two GPUs.
    pub fn beside_device(trace: &std::path::Path, device: usize) -> Result<Option<Self>, String> {
        let name = trace.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let stem = name.strip_suffix(".pickle").unwrap_or(&name);
        let path = match device {
            0 => trace.with_file_name(format!("{stem}.expected.json")),
            n => trace.with_file_name(format!("{stem}.device{n}.expected.json")),
        };
        if !path.exists() {
            return Ok(None);
        }
        let bytes = crate::input::read(&path).map_err(|e| format!("{}: {}", path.display(), e.reason()))?;
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
            memory_fraction: number("memory_fraction")?
                .map(|f| match (0.0..=1.0).contains(&f) {
                    true => Ok(f),
                    false => Err(format!("memory_fraction: {f} is not within [0, 1]")),
                })
                .transpose()?,
            device_total: number("device_total_bytes")?.map(device_total_bytes).transpose()?,
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
        if let Some(calls) = object.get("calls") {
            let calls = calls.as_array().ok_or("calls: expected a list")?;
            let mut parsed = Vec::with_capacity(calls.len());
            for (i, c) in calls.iter().enumerate() {
                let name = c.get("call").and_then(|v| v.as_str()).ok_or(format!("calls[{i}].call: missing"))?;
                let call = match PoolCall::parse(name, c, i)? {
                    Some(pool_call) => CallKind::Pool(pool_call),
                    None => CallKind::parse(name).ok_or(format!(
                        "calls[{i}].call: '{name}' is not one of empty_cache, reset_peak_memory_stats, \
                         reset_accumulated_memory_stats, {}",
                        crate::pool_calls::POOL_CALL_NAMES.join(", ")
                    ))?,
                };
                let at = c
                    .get("trace_len")
                    .and_then(|v| v.as_u64())
                    .ok_or(format!("calls[{i}].trace_len: expected a non-negative integer"))?;
                parsed.push(ProgramCall { call, at: at as usize });
            }
            run.calls = Some(parsed);
        }
        Ok(run)
    }
}

/// `device_total_bytes` of an `expected.json`: a whole number of bytes from 1 to 1 EiB. A
/// negative, fractional, NaN or larger value is an error instead of a cast that would make it 0
/// or saturate.
fn device_total_bytes(total: f64) -> Result<u64, String> {
    // MAX_REQUEST is a power of two, exactly representable as f64.
    if total.is_finite() && total >= 1.0 && total <= MAX_REQUEST as f64 && total.fract() == 0.0 {
        Ok(total as u64)
    } else {
        Err(format!("device_total_bytes: {total} is not a whole number of bytes from 1 to 1 EiB ({MAX_REQUEST})"))
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
    progress: impl FnMut(usize, usize),
) -> Result<ReplayOutcome, ReplayError> {
    replay_observed(snapshot, options, &[], progress)
}

/// [`replay`] with `observers` attached to the replayed allocator: each is called at every
/// out-of-memory error the replay raises, with the allocator as that error left it (e.g. to
/// write a snapshot, as `cachalot replay --oom-snapshot` does).
pub fn replay_observed(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    observers: &[OomObserver<SimBackend>],
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

    // The device's index names it in the summary and in out-of-memory messages ("GPU 1").
    let index = u32::try_from(device).unwrap_or(u32::MAX);
    let mut sim = SimBackend::new(options.device_total).with_index(index);
    let (segments, reservations) = planned_addresses(trace, options);
    let shown = ShownReservations::new(trace, &reservations);
    sim.plan_segment_addresses(segments);
    sim.plan_reservation_addresses(reservations.iter().map(|r| r.base));
    let mut allocator = CachingAllocator::new(sim, options.config.clone())?;
    if let Some(fraction) = options.memory_fraction {
        allocator.set_memory_fraction(fraction)?;
    }
    allocator.record_history(true, usize::MAX, &[], false);
    allocator.adopt_contexts(snapshot.contexts.clone());
    for observer in observers {
        allocator.attach_oom_observer(observer.clone());
    }

    let deferred = deferred_frees(trace);
    let completions: FxHashMap<usize, StreamId> =
        deferred.values().flatten().map(|&j| (j, synthetic_stream(j))).collect();
    // The free each completion belongs to, for the calls another backend makes.
    let freed_by: FxHashMap<usize, usize> =
        deferred.iter().filter_map(|(&request, &completion)| Some((completion?, request))).collect();

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
    // Whether an allocation failed where PyTorch's succeeded: its free is then skipped.
    let mut alloc_failed = false;
    // The first index after the current run of deferred completions (see FreeCompleted).
    let mut completions_end = 0;
    let mut trial_copies = 0;
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
                        alloc_failed = true;
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
                    if alloc_failed {
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
                    if options.calls.is_some() && completes_in_retry_chain(trace, i) {
                        i += 1;
                        // The next malloc's release synchronizes the stream itself (as it
                        // does a device replay's stand-in stream: no call needed).
                        continue;
                    }
                    // The other stream's work is done now; the free completes at the next
                    // malloc, or here if the program called empty_cache with nothing to free.
                    allocator.backend_mut().finish_stream(stream);
                    if let Some(&free) = freed_by.get(&i) {
                        call(ReplayCall::FreeCompleted { index: i, free });
                    }
                    if options.calls.is_some() {
                        i += 1;
                        continue; // the program's empty_cache calls are known
                    }
                    // The end of this run of deferred completions, found once per run rather
                    // than once per completion (which was quadratic in the run's length).
                    if completions_end <= i {
                        completions_end = (i + 1..trace.len())
                            .find(|&n| !(trace[n].action == TraceAction::FreeCompleted && completions.contains_key(&n)))
                            .unwrap_or(trace.len());
                    }
                    let after = (completions_end < trace.len()).then_some(completions_end);
                    if after.is_none_or(|n| !ends_sync_run(trace[n].action)) {
                        let last = trace[i..].iter().take_while(|n| n.action == TraceAction::FreeCompleted).count();
                        for j in i..i + last {
                            if let Some(&s) = completions.get(&j) {
                                allocator.backend_mut().finish_stream(s);
                                if let Some(&free) = freed_by.get(&j).filter(|_| j != i) {
                                    call(ReplayCall::FreeCompleted { index: j, free });
                                }
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
                // Where the program's calls are known, a release no call explains is the next
                // malloc's (and a difference shows as an extra or a missing segment event).
                if options.calls.is_none() {
                    // Cross-stream frees whose work is done complete first under either
                    // explanation (the malloc's first step, or empty_cache's synchronization),
                    // so they are completed before asking what the malloc would release.
                    if let Err(error) = allocator.process_events() {
                        divergences.push(Divergence { index: i, message: format!("event query failed: {error}") });
                    }
                    if !released_by_next_malloc(&allocator, trace, i, run, &mut trial_copies) {
                        empty_cache_points.push(i);
                        call(ReplayCall::EmptyCache { index: i });
                        if let Err(error) = allocator.empty_cache() {
                            divergences.push(Divergence { index: i, message: format!("empty_cache failed: {error}") });
                        }
                    }
                }
                i += run;
                continue;
            }
            TraceAction::Oom => {
                allocator.backend_mut().set_free_memory_override(Some(e.addr));
                call(ReplayCall::Malloc { index: i, size: e.size, stream: e.stream, recorded_oom: true });
                // The malloc's first step, taken before asking what it reserves (the plan takes
                // the frees still outstanding after it as pending). No event is queried while
                // allocations are routed to a pool, nor by the malloc then.
                if allocator.routed_pools().is_empty()
                    && let Err(error) = allocator.process_events()
                {
                    divergences.push(Divergence { index: i, message: format!("event query failed: {error}") });
                }
                // The reservations a failing request makes are never mapped by it; the first
                // one may be by a later request, which shows its address.
                for address in oom_reservation_addresses(&allocator, trace, &shown, i, &mut trial_copies) {
                    allocator.backend_mut().plan_reservation_next(address);
                }
                allocator.backend_mut().set_reservations_unplanned(true);
                let result = allocator.malloc(e.size, e.stream);
                allocator.backend_mut().set_reservations_unplanned(false);
                match result {
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
            TraceAction::Snapshot if options.calls.is_some() => {
                let calls = options.calls.as_deref().unwrap_or_default();
                let mut skip = 0;
                for program_call in calls.iter().filter(|c| c.at == i) {
                    if matches!(program_call.call, CallKind::EmptyCache | CallKind::Pool(PoolCall::EmptyCache(_))) {
                        // Its synchronization completes the deferred frees that follow it.
                        for j in synchronized_completions(trace, i) {
                            if let Some(&free) = freed_by.get(&j) {
                                call(ReplayCall::FreeCompleted { index: j, free });
                            }
                        }
                    }
                    if program_call.call == CallKind::EmptyCache {
                        call(ReplayCall::EmptyCache { index: i });
                    }
                    if let CallKind::Pool(pool_call) = program_call.call {
                        call(ReplayCall::Pool { index: i, call: pool_call });
                    }
                    skip = skip.max(perform_call(&mut allocator, program_call.call, trace, i, &completions)?);
                }
                i += 1 + skip;
                continue;
            }
            // Caused by allocations, which the replay performs itself.
            TraceAction::SegmentAlloc | TraceAction::SegmentMap | TraceAction::Snapshot => {}
        }
        i += 1;
    }
    progress(trace.len(), trace.len());
    allocator.set_context(None);
    allocator.set_annotation_id(None);
    Ok(ReplayOutcome {
        allocator,
        ooms,
        divergences,
        empty_cache_points,
        entries: trace.len(),
        device,
        calls,
        trial_copies,
    })
}

/// Replays every device trace of `snapshot` at once, each on an allocator of its own (PyTorch
/// keeps one per device, sharing nothing but the configuration), on a thread per device; the
/// outcomes are by device index, ready for a [`cachalot_core::DeviceAllocators`]. `options` are
/// device 0's; every other device takes them with its own program calls, from its recorded run
/// in `recorded` (by device index; [`ReplayOptions::for_device`]).
pub fn replay_devices(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    recorded: &[Option<ExpectedRun>],
) -> Result<Vec<ReplayOutcome>, ReplayError> {
    std::thread::scope(|scope| {
        let runs: Vec<_> = (0..snapshot.device_traces.len())
            .map(|device| {
                let options = options.for_device(device, recorded.get(device).and_then(Option::as_ref));
                scope.spawn(move || replay(snapshot, &options, |_, _| {}))
            })
            .collect();
        runs.into_iter().map(|run| run.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

/// Performs the program's `call`, recorded after the `snapshot` entry `trace[at]`; returns how
/// many entries after it are the call's own doing (an `empty_cache`'s completions of deferred
/// frees and its releases), which the replay then skips.
fn perform_call(
    allocator: &mut CachingAllocator<SimBackend>,
    call: CallKind,
    trace: &[TraceEntry],
    at: usize,
    completions: &FxHashMap<usize, StreamId>,
) -> Result<usize, ReplayError> {
    match call {
        CallKind::ResetPeakMemoryStats => {
            allocator.reset_peak_stats();
            Ok(0)
        }
        CallKind::ResetAccumulatedMemoryStats => {
            allocator.reset_accumulated_stats();
            Ok(0)
        }
        CallKind::Pool(pool_call) => {
            // emptyCache(pool) of a freeable pool synchronizes and releases as empty_cache does.
            let skip = match pool_call {
                PoolCall::EmptyCache(_) => finish_sync_run(allocator, trace, at, completions),
                _ => 0,
            };
            pool_call.perform(allocator, |s| s).map_err(ReplayError::Setup)?;
            Ok(skip)
        }
        CallKind::EmptyCache => {
            // empty_cache synchronizes first: every deferred free whose completion follows
            // completes now, then the cached segments are released.
            let skip = finish_sync_run(allocator, trace, at, completions);
            allocator.empty_cache().map_err(ReplayError::Setup)?;
            Ok(skip)
        }
    }
}

/// The `free_completed` entries right after the `snapshot` entry `trace[at]` of a call that
/// synchronizes (`empty_cache`): the deferred frees its synchronization completed.
fn synchronized_completions(trace: &[TraceEntry], at: usize) -> std::ops::Range<usize> {
    let completed = trace[at + 1..].iter().take_while(|n| n.action == TraceAction::FreeCompleted).count();
    at + 1..at + 1 + completed
}

/// For a call after the `snapshot` entry `trace[at]` that synchronizes and releases: completes
/// the deferred frees whose completions follow, and returns how many entries after `at` (those
/// completions and the releases after them) are the call's doing.
fn finish_sync_run(
    allocator: &mut CachingAllocator<SimBackend>,
    trace: &[TraceEntry],
    at: usize,
    completions: &FxHashMap<usize, StreamId>,
) -> usize {
    let completed = synchronized_completions(trace, at);
    for j in completed.clone() {
        if let Some(&stream) = completions.get(&j) {
            allocator.backend_mut().finish_stream(stream);
        }
    }
    let released = trace[completed.end..]
        .iter()
        .take_while(|n| matches!(n.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap))
        .count();
    completed.len() + released
}

/// The addresses of the VA reservations that the failing request `trace[at]` makes, where the
/// trace shows them. PyTorch's `find_expandable_block` reserves a new segment when no segment of
/// the stream and pool has room, whether or not mapping it then fails, and each step of the
/// retry chain tries again; the new reservations stay, unmapped, and the trace first shows one
/// when a later request of that stream and pool maps a page there. Such a request takes the
/// lowest of the stream's unmapped reservations, so later failures of the same stream and pool
/// (whose reservations may lie lower) interleave theirs with these: a reservation the trace
/// starts after `at`, for the stream and pool, is one of these only if its range stayed free of
/// every other reservation the trace shows from `at` on (one of a later failure may have taken
/// an address that was in use at `at`), and lies outside every reservation that was live before
/// the failure and outlives it (an earlier failure's, still unshown). Those never shown take
/// addresses of the simulator's own.
///
/// How many reservations the request makes is read off the allocator's state
/// ([`CachingAllocator::reservations_of_failing_malloc`]); only where it does not tell is the
/// request tried on a copy of the live state (counted in `trial_copies`).
fn oom_reservation_addresses(
    allocator: &CachingAllocator<SimBackend>,
    trace: &[TraceEntry],
    shown: &ShownReservations,
    at: usize,
    trial_copies: &mut usize,
) -> Vec<u64> {
    let e = &trace[at];
    let small = e.size <= SMALL_SIZE;
    let Some(later) = shown.of_stream_and_pool(e.stream, small, at) else { return Vec::new() };
    let sim = allocator.backend();
    let (made, outlived) = match allocator.reservations_of_failing_malloc(e.size, e.stream) {
        Some(made) => (made as usize, None),
        None => {
            *trial_copies += 1;
            let mut probe = allocator.trial_copy(sim.trial_copy());
            probe.backend_mut().set_reservations_unplanned(true);
            let before = probe.backend().reservations_made();
            let _ = probe.malloc(e.size, e.stream);
            ((probe.backend().reservations_made() - before) as usize, Some(probe))
        }
    };
    // A reservation live before the failure and after it; the failure's own new ones, at
    // addresses of the simulator's own, are those the answer places.
    let outlives = |base: u64| {
        sim.is_reserved(base)
            && match &outlived {
                Some(probe) => probe.backend().is_reserved(base),
                None => allocator.reservation_outlives_release(base),
            }
    };
    let mut addresses = Vec::new();
    for &n in later {
        if addresses.len() == made {
            break;
        }
        let r = &shown.all[n];
        if shown.blocked_until[n] <= at && !outlives(r.base) {
            addresses.push(r.base);
        }
    }
    addresses
}

/// The trace's VA reservations, indexed for [`oom_reservation_addresses`], which asks at every
/// out-of-memory entry: by the stream and pool of the request that started them, and when each
/// one's range was last taken by an earlier one.
struct ShownReservations<'a> {
    all: &'a [TraceReservation],
    /// Indices into `all` by (stream of the first `segment_map`, small pool), in trace order.
    by_owner: FxHashMap<(StreamId, bool), Vec<usize>>,
    /// For each reservation, the last entry at which a reservation started before it and
    /// overlapping its range was still live (0 if none): its range was free of others from
    /// every later entry on until it started.
    blocked_until: Vec<usize>,
}

impl<'a> ShownReservations<'a> {
    fn new(trace: &[TraceEntry], all: &'a [TraceReservation]) -> Self {
        let mut by_owner: FxHashMap<(StreamId, bool), Vec<usize>> = FxHashMap::default();
        for (n, r) in all.iter().enumerate() {
            by_owner.entry((trace[r.from].stream, r.small)).or_default().push(n);
        }
        // Earlier reservations by base and pool (which fixes their extent): the latest end.
        let longest = all.iter().map(|r| r.end - r.base).max().unwrap_or(0);
        let mut earlier: BTreeMap<(u64, bool), (u64, usize)> = BTreeMap::new();
        let mut blocked_until = Vec::with_capacity(all.len());
        for r in all {
            let mut blocked = 0;
            for (&(base, _), &(end, until)) in earlier.range(..(r.end, false)).rev() {
                if base.saturating_add(longest) <= r.base {
                    break;
                }
                if end > r.base {
                    blocked = blocked.max(until);
                }
            }
            blocked_until.push(blocked);
            let slot = earlier.entry((r.base, r.small)).or_insert((r.end, 0));
            slot.1 = slot.1.max(r.until);
        }
        ShownReservations { all, by_owner, blocked_until }
    }

    /// The reservations of `stream` and the pool (small or not) that the trace starts after
    /// entry `at`, in order; `None` if there are none.
    fn of_stream_and_pool(&self, stream: StreamId, small: bool, at: usize) -> Option<&[usize]> {
        let list = self.by_owner.get(&(stream, small))?;
        let first = list.partition_point(|&n| self.all[n].from <= at);
        (first < list.len()).then(|| &list[first..])
    }
}

/// Whether the deferred completion `trace[i]` follows a release of the same malloc (garbage
/// collection, or the one oversize block the retry chain frees first): then the stream's work
/// was still pending when the malloc searched its pool, and only the retry chain's
/// `release_cached_blocks`, which synchronizes first, completed it. Where the program's calls
/// are known, no `empty_cache` call explains such a release.
fn completes_in_retry_chain(trace: &[TraceEntry], i: usize) -> bool {
    trace[..i]
        .iter()
        .rev()
        .find(|n| n.action != TraceAction::FreeCompleted)
        .is_some_and(|n| matches!(n.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap))
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
/// collection, the oversize release or the full release of the retry chain, `policy:cachalot`'s
/// return of cached memory before a new peak, after which that policy may serve the request in
/// the pages it kept, so the allocation follows the releases directly) or of an `empty_cache`
/// call: the malloc's, when it would release exactly `run` segments itself. That count is read off the allocator's state
/// ([`CachingAllocator::releases_of_malloc`]); only where the state does not tell is the malloc
/// tried on a copy of the live state (counted in `trial_copies`).
fn released_by_next_malloc(
    allocator: &CachingAllocator<SimBackend>,
    trace: &[TraceEntry],
    i: usize,
    run: usize,
    trial_copies: &mut usize,
) -> bool {
    let Some(next) = trace.get(i + run) else { return false };
    match next.action {
        TraceAction::Oom => true,
        // A miss may release (`policy:cachalot`'s give-backs, the garbage collector) and then be
        // served in mapped memory, with nothing allocated or mapped: its releases are followed
        // by the allocation itself. Otherwise this is read as an `empty_cache` call before the
        // allocation; that is also how the full release of a refused device allocation reads
        // when its synchronization frees the block the retry then takes (the same release).
        TraceAction::Alloc => {
            let device_free = unbacked_bytes(allocator.backend());
            allocator.releases_of_malloc_served_in_place(next.size, next.stream, device_free) == Some(run as u64)
        }
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
            if first_device_allocation_succeeds(allocator, request.size) {
                // The malloc's first device allocation succeeds, so it releases nothing: no
                // copy of the allocator is needed to see that (a copy per release run made
                // replay quadratic in the trace's length on traces that churn segments).
                return false;
            }
            // Garbage collection or a refusal would run: how much the malloc would release is
            // read off the state, in the time of the releases themselves (a copy of the live
            // state per release run made replay quadratic where many blocks stay live).
            let device_free = unbacked_bytes(allocator.backend());
            if let Some(releases) = allocator.releases_of_malloc(request.size, request.stream, device_free) {
                return releases == run as u64;
            }
            // The state does not tell: the malloc is tried on a copy of the live state (not of
            // the history or the address plan, which grow with the trace).
            *trial_copies += 1;
            let mut probe = allocator.trial_copy(allocator.backend().trial_copy());
            let before = probe.stats().num_device_free;
            probe.malloc(request.size, request.stream).is_ok() && probe.stats().num_device_free - before == run as u64
        }
        _ => false,
    }
}

/// Whether a malloc of `size` bytes that finds no cached block gets its memory from the device
/// at the first try, so that it releases no cached segment. It follows the steps of `malloc`
/// before that first try, each of which could release: the garbage collector (on with a memory
/// fraction and a threshold) releases nothing while the reserved bytes are within its
/// threshold; the fraction refuses a segment that would take the reserved bytes past the
/// allowance; the device refuses what it has no room for. With expandable segments the first
/// try maps pages for the request, at most its size rounded up to whole pages of its pool
/// (a page more is asked for, to be sure); under `policy:cachalot` their size is the policy's,
/// so that case is left to the trial.
fn first_device_allocation_succeeds(allocator: &CachingAllocator<SimBackend>, size: u64) -> bool {
    let config = allocator.config();
    let reserved = allocator.memory_reserved();
    let rounded = round_size(size, config.roundup_power2_divisions());
    let segment = allocation_size(rounded, config.large_segment_size());
    if let Some(allowed) = allocator.allowed_memory_maximum() {
        let threshold = config.garbage_collection_threshold();
        if threshold > 0.0 && reserved > (threshold * allowed as f64) as u64 {
            return false;
        }
        if reserved.saturating_add(segment) > allowed {
            return false;
        }
    }
    let needed = if config.expandable_segments() {
        if config.policy() != Policy::PyTorch {
            return false;
        }
        let page = if rounded <= SMALL_SIZE { SMALL_BUFFER } else { config.large_segment_size() };
        rounded.div_ceil(page).saturating_add(1).saturating_mul(page)
    } else {
        segment
    };
    unbacked_bytes(allocator.backend()) >= needed
}

/// The simulated device's bytes that back nothing (its total less its segments and mapped
/// pages): what a device allocation made now could get, the recorded free memory of an `oom`
/// entry aside.
fn unbacked_bytes(sim: &SimBackend) -> u64 {
    sim.device().total_memory.saturating_sub(sim.used())
}

/// A VA reservation as the trace shows it: from the `segment_map` that started it to the
/// `segment_unmap` that left nothing mapped in it (when PyTorch released it).
#[derive(Clone, Copy, Debug)]
struct TraceReservation {
    /// Its base address.
    base: u64,
    /// The end of its extent.
    end: u64,
    /// Whether it serves the small pool (else the large one).
    small: bool,
    /// Index of its first `segment_map`.
    from: usize,
    /// Index of the `segment_unmap` that released it; the trace's length if it outlived it.
    until: usize,
}

/// The addresses the recording's device gave new segments, and the VA reservations it shows,
/// in order.
///
/// A `segment_map` inside a live reservation extends it; any other starts a new one. Like
/// PyTorch's `ExpandableSegment`, each reservation spans 1 1/8 of the device in pages of its
/// pool (2 MiB for the small pool, `large_segment_size` for the large one), so the extents of a
/// small and a large reservation differ, and the driver may place the next reservation closer
/// to a small one than a large one's extent: which pool a reservation serves is told by the
/// request that mapped its first page.
fn planned_addresses(trace: &[TraceEntry], options: &ReplayOptions) -> (Vec<u64>, Vec<TraceReservation>) {
    let total = options.device_total;
    let extent = |page: u64| (total + total / 8).div_ceil(page) * page;
    let (small_extent, large_extent) = (extent(SMALL_BUFFER), extent(options.config.large_segment_size()));
    let mut segments = Vec::new();
    let mut shown: Vec<TraceReservation> = Vec::new();
    // Live reservations: base -> (mapped bytes, index in `shown`). A reservation whose last
    // page is unmapped is released by PyTorch at once, so its VA may come back as a new one.
    let mut live: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            TraceAction::SegmentAlloc => segments.push(e.addr),
            TraceAction::SegmentMap => {
                let owner =
                    live.range(..=e.addr).next_back().filter(|(_, (_, n))| e.addr < shown[*n].end).map(|(b, _)| *b);
                let base = owner.unwrap_or_else(|| {
                    let request =
                        trace[i + 1..].iter().find(|n| matches!(n.action, TraceAction::Alloc | TraceAction::Oom));
                    let small = request.is_some_and(|r| r.size <= SMALL_SIZE);
                    let end = e.addr.saturating_add(if small { small_extent } else { large_extent });
                    shown.push(TraceReservation { base: e.addr, end, small, from: i, until: trace.len() });
                    live.insert(e.addr, (0, shown.len() - 1));
                    e.addr
                });
                if let Some((mapped, _)) = live.get_mut(&base) {
                    *mapped = mapped.saturating_add(e.size);
                }
            }
            TraceAction::SegmentUnmap => {
                let owner = live.range(..=e.addr).next_back().map(|(b, _)| *b);
                if let Some(base) = owner
                    && let Some((mapped, n)) = live.get_mut(&base)
                {
                    *mapped = mapped.saturating_sub(e.size);
                    if *mapped == 0 {
                        shown[*n].until = i;
                        live.remove(&base);
                    }
                }
            }
            _ => {}
        }
    }
    (segments, shown)
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
        verify_expected_run(&allocator.stats(), allocator, outcome, expected)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `device_total_bytes` and `memory_fraction` out of range are errors naming the field,
    /// where a cast once made -1 and NaN a device of 0 bytes.
    #[test]
    fn expected_values_out_of_range_are_named() {
        for (json, field) in [
            (r#"{"device_total_bytes": -1}"#, "device_total_bytes"),
            (r#"{"device_total_bytes": "NaN"}"#, "device_total_bytes"),
            (r#"{"device_total_bytes": 1.5}"#, "device_total_bytes"),
            (r#"{"device_total_bytes": 1e30}"#, "device_total_bytes"),
            (r#"{"memory_fraction": 7}"#, "memory_fraction"),
            (r#"{"memory_fraction": "NaN"}"#, "memory_fraction"),
        ] {
            let err = ExpectedRun::from_json(json.as_bytes()).unwrap_err();
            assert!(err.starts_with(field), "{json}: {err}");
        }
        let run = ExpectedRun::from_json(br#"{"device_total_bytes": 150754820096, "memory_fraction": 0.5}"#).unwrap();
        assert_eq!((run.device_total, run.memory_fraction), (Some(150_754_820_096), Some(0.5)));
    }
}
