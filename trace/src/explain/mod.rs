//! Why a request ran out of memory, and what would have made it fit (`cachalot explain`).
//!
//! The replay of a recorded trace is exact, so the explainer can stop it just before the
//! request and ask the allocator itself, instead of guessing from PyTorch's one-paragraph
//! message:
//!
//! - `stop`: the replay cut short before the request's malloc, then that malloc made,
//!   its history on: the state when the request came, what the retry chain did (its releases
//!   and the deferred frees its synchronization completed) and the state it failed in;
//! - [`causes`]: every reserved but unallocated block put in the class that kept it from
//!   serving the request, before and after the retry chain; the main cause is named from the
//!   state after it, where only what the chain could not give back is left;
//! - [`fix`]: the whole trace replayed under candidate changes (`tune`'s settings,
//!   `policy:cachalot`, an `empty_cache()` before the request, a larger memory fraction), and
//!   the smallest that lets the job through, with the peak it reaches; none is searched where
//!   live memory alone leaves no room, and the stacks holding the most live memory are named.
//!
//! Nothing here re-derives a rule of the allocator: rounding, pools and the retry chain are
//! the allocator's own answers (the malloc it made, its error, its snapshot).

pub mod causes;
pub mod fix;
mod stop;
mod words;

use rustc_hash::FxHashMap;

use cachalot_core::config::ConfigError;
use cachalot_core::size::PoolKind;
use cachalot_core::trace::{ContextId, ContextTable, Frame, TraceAction, TraceEntry};
use cachalot_core::{Backend, BlockState, CachingAllocator, OutOfMemoryError, SegmentSnapshot, StreamId};

pub use causes::{Cause, ClassBytes};
pub use fix::{Change, Fix, FixSearch};

use crate::replay::{ReplayError, ReplayOptions, replay_trial};
use crate::snapshot::torch::TorchSnapshot;

/// Which request to explain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// The first out-of-memory error (the trace's first `oom` entry; without one, the first
    /// error its replay raises, e.g. on a smaller `device_total`).
    FirstOom,
    /// The allocation after which the most requested bytes were live.
    Peak,
    /// The `alloc` or `oom` entry of this index.
    Entry(usize),
}

impl At {
    fn name(self) -> &'static str {
        match self {
            At::FirstOom => "oom",
            At::Peak => "peak",
            At::Entry(_) => "entry",
        }
    }
}

/// What to explain and how far to go.
#[derive(Clone, Debug)]
pub struct ExplainOptions {
    /// The request.
    pub at: At,
    /// Whether to search for the fix (replays of the whole trace) at an out-of-memory error.
    pub search_fix: bool,
    /// How many of the stacks holding the most live memory to name.
    pub stacks: usize,
}

impl Default for ExplainOptions {
    fn default() -> Self {
        ExplainOptions { at: At::FirstOom, search_fix: true, stacks: 5 }
    }
}

/// A request that cannot be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The trace cannot be replayed.
    #[error("{0}")]
    Replay(#[from] ReplayError),
    /// No out-of-memory error to explain.
    #[error(
        "device {device}'s trace ({entries} entries) runs out of memory nowhere, recorded or replayed: \
         explain --at peak or --at ENTRY instead"
    )]
    NoOom {
        /// The device trace.
        device: usize,
        /// Its entries.
        entries: usize,
    },
    /// No allocation in the trace (for `--at peak`).
    #[error("device {device}'s trace has no allocation")]
    NoAllocation {
        /// The device trace.
        device: usize,
    },
    /// The entry is past the trace's end.
    #[error("entry {entry} is past the end of device {device}'s trace ({entries} entries)")]
    OutOfRange {
        /// The entry asked for.
        entry: usize,
        /// The device trace.
        device: usize,
        /// Its entries.
        entries: usize,
    },
    /// The entry is not a request.
    #[error("entry {entry} is a {action} entry, not a request: explain an alloc or oom entry")]
    NotARequest {
        /// The entry asked for.
        entry: usize,
        /// Its action.
        action: &'static str,
    },
    /// A candidate setting of the fix search did not parse: a bug, named so it can be reported.
    #[error("the fix search made a setting that does not parse, {settings:?}: {error}")]
    Candidate {
        /// The setting.
        settings: String,
        /// Why it does not parse.
        error: ConfigError,
    },
}

/// The request explained.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Request {
    /// Bytes asked for.
    pub size: u64,
    /// The block size the allocator rounded them to.
    pub rounded: u64,
    /// The segment a cache miss asked the device for (the "Tried to allocate" of PyTorch's
    /// message); 0 where the request was served from the cache.
    pub segment_size: u64,
    /// `small` or `large`.
    pub pool: &'static str,
    /// The stream (PyTorch's stream pointer).
    pub stream: u64,
    /// The stack that asked, innermost first, where the trace recorded one.
    pub frames: Vec<String>,
}

/// Where the device's memory was.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Memory {
    /// The device's total memory.
    pub device_total: u64,
    /// Memory outside this allocator (CUDA context, NCCL, other processes), where the trace
    /// says: the device total less the free memory the driver reported at a recorded
    /// out-of-memory error and less this allocator's reserved bytes. 0 elsewhere.
    pub outside: u64,
    /// The memory fraction's allowance, where one is set.
    pub allowed: Option<u64>,
    /// Reserved bytes when the request came.
    pub reserved: u64,
    /// Reserved bytes after its malloc (after the retry chain's releases, at an error).
    pub reserved_after: u64,
    /// Live (allocated) bytes when the request came.
    pub allocated: u64,
    /// Bytes the live blocks' owners asked for.
    pub requested: u64,
    /// Allocated less requested: what rounding to block sizes added.
    pub rounding_waste: u64,
    /// The device's free memory after the malloc.
    pub device_free_after: u64,
}

impl Memory {
    /// Bytes the allocator could still take after the malloc: the device's free memory, within
    /// what the memory fraction still allows.
    fn room(&self) -> u64 {
        match self.allowed {
            Some(allowed) => self.device_free_after.min(allowed.saturating_sub(self.reserved_after)),
            None => self.device_free_after,
        }
    }
}

/// What the request's malloc did besides taking a block: its retry chain at an error.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RetryChain {
    /// Whether the garbage collector runs at a miss (a threshold under a memory fraction).
    pub garbage_collection: bool,
    /// Segments (or mapped ranges) the malloc released: garbage collection, the oversize
    /// release and the full release of its retry chain.
    pub released_segments: u64,
    /// Bytes those held.
    pub released_bytes: u64,
    /// Deferred frees (`record_stream`) the full release's synchronization completed.
    pub completed_frees: u64,
    /// Bytes of new segments or pages the malloc got.
    pub new_bytes: u64,
    /// Room for a new segment after the releases: the device's free memory, or the allowance
    /// left where that is less.
    pub room_after: u64,
}

/// A stack holding live memory.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LiveStack {
    /// Live bytes allocated from it.
    pub bytes: u64,
    /// Live blocks.
    pub blocks: u64,
    /// Its frames, innermost first (empty where no stack was recorded).
    pub frames: Vec<String>,
}

/// The answer.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Explanation {
    /// The trace entry of the request.
    pub entry: usize,
    /// How it was chosen: `oom`, `peak` or `entry`.
    pub at: &'static str,
    /// Whether the request failed (ran out of memory).
    pub failed: bool,
    /// PyTorch's out-of-memory message, as the replayed allocator words it.
    pub message: Option<String>,
    /// Whether the malloc did what the recording shows there (an error at an `oom` entry, the
    /// recorded address at an `alloc`).
    pub matches_recording: bool,
    /// The request.
    pub request: Request,
    /// Where the memory was.
    pub memory: Memory,
    /// What the malloc's retry chain did.
    pub retry: RetryChain,
    /// The cached, unallocated bytes when the request came, by why they could not serve it,
    /// largest first.
    pub when_asked: Vec<ClassBytes>,
    /// Those still cached after the retry chain, largest first: what it could not give back.
    pub after_retry: Vec<ClassBytes>,
    /// Why the request failed; `None` where it was served.
    pub main_cause: Option<Cause>,
    /// The fix search, where one ran.
    pub fix: Option<FixSearch>,
    /// The stacks holding the most live memory at the request.
    pub live_stacks: Vec<LiveStack>,
}

/// Explains the request `how.at` of `snapshot`'s trace of `options.device`, replayed under
/// `options`.
pub fn explain(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    how: &ExplainOptions,
) -> Result<Explanation, ExplainError> {
    let device = options.device;
    let trace = snapshot
        .device_traces
        .get(device)
        .ok_or(ReplayError::NoTrace { device, available: snapshot.device_traces.len() })?;
    let entry = match how.at {
        At::FirstOom => first_oom(snapshot, options, trace)?,
        At::Peak => peak_entry(trace).ok_or(ExplainError::NoAllocation { device })?,
        At::Entry(entry) => {
            let e = trace.get(entry).ok_or(ExplainError::OutOfRange { entry, device, entries: trace.len() })?;
            if !matches!(e.action, TraceAction::Alloc | TraceAction::Oom) {
                return Err(ExplainError::NotARequest { entry, action: e.action.name() });
            }
            entry
        }
    };
    let e = trace[entry];
    let stopped = stop::stop_at(snapshot, options, entry)?;
    let allocator = &stopped.allocator;
    let config = allocator.config();

    let (rounded, segment_size, message, device_free_after) = match &stopped.result {
        Err(oom) => (oom.rounded, oom.allocation_size, Some(oom.message.clone()), oom.device_free),
        Ok(allocation) => {
            let new: u64 = stopped
                .made
                .iter()
                .filter(|m| matches!(m.action, TraceAction::SegmentAlloc | TraceAction::SegmentMap))
                .map(|m| m.size)
                .sum();
            let sim = allocator.backend();
            (allocation.size(), new, None, allocator.device().total_memory.saturating_sub(sim.used()))
        }
    };
    let failed = stopped.result.is_err();
    let matches_recording = match (&stopped.result, e.action) {
        (Err(_), TraceAction::Oom) => true,
        (Ok(allocation), TraceAction::Alloc) => allocation.address() == e.addr,
        _ => false,
    };
    let pool = PoolKind::for_size(rounded);
    let asked = causes::Asked { rounded, pool, stream: e.stream, pool_id: allocator.routed_pool(e.stream) };
    let after = allocator.snapshot();
    let (when_asked, _) = causes::classify(config, &asked, &stopped.before, &[]);
    let pending = causes::pending_ranges(&stopped.before);
    let (after_retry, _) = causes::classify(config, &asked, &after, if failed { &pending } else { &[] });

    let device_total = allocator.device().total_memory;
    let reserved_after = allocator.memory_reserved();
    let outside = device_total.saturating_sub(device_free_after).saturating_sub(reserved_after);
    let allowed = allocator.allowed_memory_maximum();
    let (allocated, requested) = live_bytes(&stopped.before);
    let memory = Memory {
        device_total,
        outside,
        allowed,
        reserved: stopped.reserved_before,
        reserved_after,
        allocated: stopped.allocated_before,
        requested,
        rounding_waste: allocated.saturating_sub(requested),
        device_free_after,
    };
    let count = |actions: &[TraceAction]| -> (u64, u64) {
        let matching = stopped.made.iter().filter(|m| actions.contains(&m.action));
        matching.fold((0, 0), |(n, bytes), m| (n + 1, bytes + m.size))
    };
    let (released_segments, released_bytes) = count(&[TraceAction::SegmentFree, TraceAction::SegmentUnmap]);
    let room_after = memory.room();
    let retry = RetryChain {
        garbage_collection: config.garbage_collection_threshold() > 0.0 && allowed.is_some(),
        released_segments,
        released_bytes,
        completed_frees: count(&[TraceAction::FreeCompleted]).0,
        new_bytes: count(&[TraceAction::SegmentAlloc, TraceAction::SegmentMap]).1,
        room_after,
    };
    let main_cause = failed.then(|| main_cause(&memory, rounded, segment_size, &after_retry));

    let live_stacks = live_stacks(&after, allocator.contexts(), how.stacks);
    let fix = match main_cause {
        Some(cause) if how.search_fix && cause != Cause::LiveExceedsDevice => {
            let stats = allocator.stats();
            let target = fix::Target {
                entry,
                cut: stopped.cut,
                outside: memory.outside,
                rounded,
                peaks: (stats.max_memory_allocated(), stats.max_memory_reserved()),
            };
            Some(fix::search(snapshot, options, &target)?)
        }
        _ => None,
    };
    Ok(Explanation {
        entry,
        at: how.at.name(),
        failed,
        message,
        matches_recording,
        request: Request {
            size: e.size,
            rounded,
            segment_size,
            pool: pool.name(),
            stream: e.stream.0,
            frames: e.context.map(|c| frames(&snapshot.contexts, c)).unwrap_or_default(),
        },
        memory,
        retry,
        when_asked,
        after_retry,
        main_cause,
        fix,
        live_stacks,
    })
}

/// The main cause of an out-of-memory error, in one line (`main cause: …`, sizes written by
/// `size`), where it happens in a program running on cachalot (the PyTorch plug-in appends it
/// to PyTorch's message): the rule [`explain`] applies, on the error's own figures and the
/// cached bytes the retry chain left in `allocator`, which the error has just left as it is. No
/// trace is needed, and none is replayed: the fix is `cachalot explain`'s, on a snapshot.
pub fn cause_at_error<B: Backend>(
    allocator: &CachingAllocator<B>,
    oom: &OutOfMemoryError,
    stream: StreamId,
    size: impl Fn(u64) -> String,
) -> String {
    let pool = PoolKind::for_size(oom.rounded);
    let asked = causes::Asked { rounded: oom.rounded, pool, stream, pool_id: allocator.routed_pool(stream) };
    let (after_retry, _) = causes::classify(allocator.config(), &asked, &allocator.snapshot(), &[]);
    let memory = Memory {
        device_total: oom.device_total,
        outside: oom.device_total.saturating_sub(oom.device_free).saturating_sub(oom.reserved),
        allowed: oom.allowed,
        reserved: oom.reserved,
        reserved_after: oom.reserved,
        allocated: oom.allocated,
        requested: 0,
        rounding_waste: 0,
        device_free_after: oom.device_free,
    };
    let room_after = memory.room();
    let request = Request {
        size: oom.requested,
        rounded: oom.rounded,
        segment_size: oom.allocation_size,
        pool: pool.name(),
        stream: stream.0,
        frames: Vec::new(),
    };
    let cause = main_cause(&memory, oom.rounded, oom.allocation_size, &after_retry);
    words::cause_line(cause, &request, &memory, room_after, &after_retry, size)
}

/// The main cause of a failed request of `rounded` bytes (a segment of `segment` bytes on a
/// miss): live memory against the device, then the allowance, then the largest class of what
/// the retry chain left cached.
fn main_cause(memory: &Memory, rounded: u64, segment: u64, after_retry: &[ClassBytes]) -> Cause {
    let needed = memory.allocated.saturating_add(rounded);
    if needed > memory.device_total.saturating_sub(memory.outside) {
        return Cause::LiveExceedsDevice;
    }
    if let Some(allowed) = memory.allowed {
        let refused_what_the_device_had =
            memory.reserved_after.saturating_add(segment) > allowed && memory.device_free_after >= segment;
        if needed > allowed || refused_what_the_device_had {
            return Cause::FractionCap;
        }
    }
    after_retry.first().map_or(Cause::SegmentSize, |c| c.cause)
}

/// Allocated bytes and the bytes their owners asked for.
fn live_bytes(segments: &[SegmentSnapshot]) -> (u64, u64) {
    let live = segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state == BlockState::ActiveAllocated);
    live.fold((0, 0), |(size, requested), b| (size + b.size, requested + b.requested_size))
}

/// The `limit` stacks holding the most live bytes, most first.
fn live_stacks(segments: &[SegmentSnapshot], contexts: &ContextTable, limit: usize) -> Vec<LiveStack> {
    let mut by_stack: FxHashMap<Option<ContextId>, (u64, u64)> = FxHashMap::default();
    for block in segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state == BlockState::ActiveAllocated) {
        let slot = by_stack.entry(block.context).or_default();
        slot.0 += block.size;
        slot.1 += 1;
    }
    let mut stacks: Vec<(Option<ContextId>, (u64, u64))> = by_stack.into_iter().collect();
    stacks.sort_by_key(|&(context, (bytes, _))| (std::cmp::Reverse(bytes), context));
    stacks
        .into_iter()
        .take(limit)
        .map(|(context, (bytes, blocks))| LiveStack {
            bytes,
            blocks,
            frames: context.map(|c| frames(contexts, c)).unwrap_or_default(),
        })
        .collect()
}

fn frames(contexts: &ContextTable, id: ContextId) -> Vec<String> {
    let frames: &[Frame] = if (id.0 as usize) < contexts.stacks().len() { contexts.frames(id) } else { &[] };
    frames.iter().map(|f| format!("{} {}:{}", f.name, f.filename, f.line)).collect()
}

/// The first out-of-memory error: the trace's first `oom` entry, else the first error of its
/// replay under `options`.
fn first_oom(snapshot: &TorchSnapshot, options: &ReplayOptions, trace: &[TraceEntry]) -> Result<usize, ExplainError> {
    if let Some(index) = trace.iter().position(|e| e.action == TraceAction::Oom) {
        // A replay under other options may fail earlier; the recording's error is the one the
        // user saw, and under the recorded options the replay raises no earlier one.
        return Ok(index);
    }
    let outcome = replay_trial(snapshot, options, &|_| true)?;
    outcome.ooms.first().map(|o| o.index).ok_or(ExplainError::NoOom { device: options.device, entries: trace.len() })
}

/// The `alloc` entry after which the most requested bytes were live (the first, at a tie).
fn peak_entry(trace: &[TraceEntry]) -> Option<usize> {
    let mut live: FxHashMap<u64, u64> = FxHashMap::default();
    let (mut now, mut best): (u64, Option<(u64, usize)>) = (0, None);
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            TraceAction::Alloc => {
                now += e.size;
                if let Some(old) = live.insert(e.addr, e.size) {
                    now -= old;
                }
                if best.is_none_or(|(peak, _)| now > peak) {
                    best = Some((now, i));
                }
            }
            TraceAction::FreeRequested => now -= live.remove(&e.addr).unwrap_or(0),
            _ => {}
        }
    }
    best.map(|(_, i)| i)
}
