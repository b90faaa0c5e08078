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
//!
//! - `recording`: what is read off the whole trace before replaying it (the addresses the
//!   device gave, the VA reservations, the frees that waited for another stream);
//! - `interpreter`: the replay proper, one method per trace action, pushing the allocator calls
//!   it makes to a [`CallSink`] ([`ReplayCall`]; a `Vec` records them, [`NoCalls`] drops them);
//! - `inference`: what the trace does not show, asked of the allocator's plan of the next
//!   malloc: which releases were an `empty_cache` call, which reservations a failure made;
//! - `check`: the comparison with the recording, [`verify_against_recording`];
//! - `expected`: the run's `expected.json` ([`ExpectedRun`]).

mod calls;
mod check;
mod expected;
mod inference;
mod interpreter;
mod recording;

pub use calls::{CallSink, NoCalls, ReplayCall};
pub use check::{RecordingMismatch, verify_against_recording};
pub use expected::{ExpectedMark, ExpectedRun};

use crate::pool_calls::PoolCall;
use crate::snapshot::torch::TorchSnapshot;
use cachalot_core::backend::StreamId;
use cachalot_core::config::{AllocatorConfig, ConfigError};
use cachalot_core::error::AllocatorError;
use cachalot_core::sim::SimBackend;
use cachalot_core::size::MAX_REQUEST;
use cachalot_core::trace::{TraceAction, TraceEntry};
use cachalot_core::{CachingAllocator, OomObserver};
use interpreter::Interpreter;

/// `total_memory` assumed when neither the run nor the caller says (the H200 of the reference
/// traces).
pub const DEFAULT_DEVICE_TOTAL: u64 = 150_109_880_320;

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
    /// asked [`replay_observed`] for them (else empty; [`replay_with_sink`] pushes them to its
    /// sink instead).
    pub calls: Vec<ReplayCall>,
    /// How many times the replay copied the allocator's live state to try a malloc, where the
    /// state alone did not tell what the malloc would do (a full release while a cross-stream
    /// free is outstanding, private pools, pages mapped in pieces; see
    /// [`CachingAllocator::releases_of_malloc`]): each copy
    /// costs the live blocks, so a shape that needed one per entry would replay in quadratic
    /// time. The tests hold it to zero for the shapes that once did.
    pub trial_copies: usize,
}

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
    progress: impl FnMut(usize, usize),
) -> Result<ReplayOutcome, ReplayError> {
    if !options.record_calls {
        return replay_with_sink(snapshot, options, observers, NoCalls, progress);
    }
    let mut calls = Vec::new();
    let mut outcome = replay_with_sink(snapshot, options, observers, &mut calls, progress)?;
    outcome.calls = calls;
    Ok(outcome)
}

/// [`replay_observed`] that pushes each allocator call the replay makes to `sink` as it makes
/// it, whatever [`ReplayOptions::record_calls`] says (the outcome's `calls` stay empty).
pub fn replay_with_sink(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    observers: &[OomObserver<SimBackend>],
    sink: impl CallSink,
    progress: impl FnMut(usize, usize),
) -> Result<ReplayOutcome, ReplayError> {
    Interpreter::new(snapshot, options, observers, sink)?.run(progress)
}

/// A replay for a search (`tune`'s candidates, `explain`'s fix): what it reports is the
/// out-of-memory errors and the allocator's stats, so no history is recorded and no divergence
/// worded, and the replay ends at the first error `stop` answers `true` for (the candidate has
/// failed there; what the rest would do no longer matters). Its outcome's `divergences` have
/// empty messages; its `entries` are the trace's.
pub fn replay_trial(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    stop: &dyn Fn(&ReplayOom) -> bool,
) -> Result<ReplayOutcome, ReplayError> {
    Interpreter::with_stop(snapshot, options, &[], NoCalls, Some(stop))?.run(|_, _| {})
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
