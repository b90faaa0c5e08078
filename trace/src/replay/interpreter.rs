//! The replay as an interpreter of the trace: [`Interpreter::step`] reads the entry at hand and
//! hands it to the method of its action, which makes the program's call (a malloc, a free, the
//! completion of a deferred free, an `empty_cache` or a pool call), pushes that call to the
//! [`CallSink`], and says how many entries it accounted for: one, or more where the call's own
//! effects follow it in the trace (a synchronization's completions, an `empty_cache`'s
//! releases), which the allocator then makes by itself.
//!
//! The entries a call leaves no trace of are inferred where the run's `expected.json` does not
//! list the program's calls: a run of releases that the next malloc would not make, or deferred
//! completions that no malloc or release follows, were an `empty_cache` call
//! ([`super::inference`]).

use rustc_hash::FxHashMap;

use cachalot_core::error::AllocatorError;
use cachalot_core::sim::SimBackend;
use cachalot_core::trace::{TraceAction, TraceEntry};
use cachalot_core::{Allocation, CachingAllocator, OomObserver, RestoreDelta};

use super::calls::{CallSink, ReplayCall};
use super::inference::{oom_reservation_addresses, released_by_next_malloc};
use super::recording::{
    DeferredFrees, ShownReservations, completes_in_retry_chain, ends_sync_run, planned_addresses,
    synchronized_completions,
};
use super::{CallKind, Divergence, ReplayError, ReplayOom, ReplayOptions, ReplayOutcome};
use crate::pool_calls::{PoolCall, PoolCheckpoints};
use crate::snapshot::torch::TorchSnapshot;

/// One replay in progress: the allocator, what was read off the trace beforehand, and what the
/// replay has found so far.
pub(super) struct Interpreter<'a, S> {
    trace: &'a [TraceEntry],
    options: &'a ReplayOptions,
    allocator: CachingAllocator<SimBackend>,
    /// The VA reservations the trace shows, for the questions of `oom` entries.
    shown: ShownReservations,
    deferred: DeferredFrees,
    /// The allocations live in the replay, by the address PyTorch gave them: the handle and the
    /// index of the entry that made it.
    live: FxHashMap<u64, (Allocation, usize)>,
    /// Allocations the simulator refused, by address: the program freed them (PyTorch served
    /// them), and another device may serve them too, so their frees still go to the sink.
    refused: FxHashMap<u64, usize>,
    sink: S,
    ooms: Vec<ReplayOom>,
    divergences: Vec<Divergence>,
    empty_cache_points: Vec<usize>,
    /// Whether an allocation failed where PyTorch's succeeded: its free is then skipped.
    alloc_failed: bool,
    /// The first index after the current run of deferred completions (see
    /// [`Interpreter::sync_without_release`]).
    completions_end: usize,
    trial_copies: usize,
    /// The checkpoints of private pools taken so far, by the recording's numbers.
    checkpoints: PoolCheckpoints,
    /// For a search's trial ([`super::replay_trial`]): the errors after which the rest of the
    /// trace need not be replayed. `None` for a replay that reports everything.
    stop: Option<&'a dyn Fn(&ReplayOom) -> bool>,
    /// Whether `stop` said so at the last error.
    stopped: bool,
}

impl<'a, S: CallSink> Interpreter<'a, S> {
    /// Sets up the allocator for device trace `options.device` of `snapshot`: the simulated
    /// device told the addresses the recording's device gave, the run's memory fraction, history
    /// recorded with the recording's stack frames, and `observers` attached.
    pub(super) fn new(
        snapshot: &'a TorchSnapshot,
        options: &'a ReplayOptions,
        observers: &[OomObserver<SimBackend>],
        sink: S,
    ) -> Result<Self, ReplayError> {
        Self::with_stop(snapshot, options, observers, sink, None)
    }

    /// [`Interpreter::new`] for a search's trial where `stop` is given: no history recorded and
    /// no divergence worded (a trial reads only its errors and the allocator's stats), and the
    /// replay ends at the first out-of-memory error `stop` answers `true` for.
    pub(super) fn with_stop(
        snapshot: &'a TorchSnapshot,
        options: &'a ReplayOptions,
        observers: &[OomObserver<SimBackend>],
        sink: S,
        stop: Option<&'a dyn Fn(&ReplayOom) -> bool>,
    ) -> Result<Self, ReplayError> {
        let device = options.device;
        let trace = snapshot
            .device_traces
            .get(device)
            .ok_or(ReplayError::NoTrace { device, available: snapshot.device_traces.len() })?;
        if options.device_total > cachalot_core::size::MAX_REQUEST {
            return Err(ReplayError::DeviceTotal(options.device_total));
        }
        // The device's index names it in the summary and in out-of-memory messages ("GPU 1").
        let index = u32::try_from(device).unwrap_or(u32::MAX);
        let mut sim = SimBackend::new(options.device_total).with_index(index);
        let (segments, shown) = planned_addresses(trace, options);
        sim.plan_segment_addresses(segments);
        sim.plan_reservation_addresses(shown.bases());
        let mut allocator = CachingAllocator::new(sim, options.config.clone())?;
        if let Some(fraction) = options.memory_fraction {
            allocator.set_memory_fraction(fraction)?;
        }
        allocator.record_history(stop.is_none(), usize::MAX, &[], false);
        allocator.adopt_contexts(snapshot.contexts.clone());
        for observer in observers {
            allocator.attach_oom_observer(observer.clone());
        }
        Ok(Interpreter {
            trace,
            options,
            allocator,
            shown,
            deferred: DeferredFrees::of(trace),
            live: FxHashMap::default(),
            refused: FxHashMap::default(),
            sink,
            ooms: Vec::new(),
            divergences: Vec::new(),
            empty_cache_points: Vec::new(),
            alloc_failed: false,
            completions_end: 0,
            trial_copies: 0,
            checkpoints: PoolCheckpoints::default(),
            stop,
            stopped: false,
        })
    }

    /// Replays the whole trace, calling `progress(done, total)` now and then; the outcome's
    /// `calls` are left empty (they went to the sink).
    pub(super) fn run(mut self, mut progress: impl FnMut(usize, usize)) -> Result<ReplayOutcome, ReplayError> {
        let trace = self.trace;
        let len = trace.len();
        let mut i = 0;
        while let Some(e) = trace.get(i).filter(|_| !self.stopped) {
            if i % 65_536 == 0 {
                progress(i, len);
            }
            i += self.step(i, e)?;
        }
        progress(len, len);
        self.allocator.set_context(None);
        self.allocator.set_annotation_id(None);
        Ok(ReplayOutcome {
            allocator: self.allocator,
            ooms: self.ooms,
            divergences: self.divergences,
            empty_cache_points: self.empty_cache_points,
            entries: len,
            device: self.options.device,
            calls: Vec::new(),
            trial_copies: self.trial_copies,
        })
    }

    /// Replays entry `i`, `e` (and those after it that its call accounts for); returns how
    /// many entries that was, at least one.
    fn step(&mut self, i: usize, e: &TraceEntry) -> Result<usize, ReplayError> {
        self.allocator.backend_mut().set_time_us(e.time_us);
        self.allocator.set_context(e.context);
        self.allocator.set_annotation_id(e.annotation);
        Ok(match e.action {
            TraceAction::Alloc => self.alloc(i, e),
            TraceAction::FreeRequested => self.free_requested(i, e.addr)?,
            TraceAction::FreeCompleted => self.free_completed(i)?,
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => self.segment_alloc_or_map(i),
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => self.segment_free_or_unmap(i),
            TraceAction::Oom => self.oom(i, e),
            TraceAction::Snapshot => self.snapshot_mark(i)?,
        })
    }

    /// Notes a divergence at `index`, worded by `message` unless this is a search's trial
    /// (where wording one for each moved address would cost more than the malloc).
    fn diverged(&mut self, index: usize, message: impl FnOnce() -> String) {
        let message = if self.stop.is_some() { String::new() } else { message() };
        self.divergences.push(Divergence { index, message });
    }

    /// Records an out-of-memory error, and whether the replay stops at it.
    fn raised(&mut self, oom: ReplayOom) {
        self.stopped = self.stop.is_some_and(|stop| stop(&oom));
        self.ooms.push(oom);
    }

    /// An `alloc`: the program's malloc, which must get the address PyTorch's got.
    fn alloc(&mut self, i: usize, e: &TraceEntry) -> usize {
        self.sink.call(ReplayCall::Malloc { index: i, size: e.size, stream: e.stream, recorded_oom: false });
        match self.allocator.malloc(e.size, e.stream) {
            Ok(a) => {
                if a.address() != e.addr {
                    let got = a.address();
                    self.diverged(i, || format!("alloc of {} B got {got:#x}, PyTorch got {:#x}", e.size, e.addr));
                }
                self.live.insert(e.addr, (a, i));
            }
            Err(error) => {
                self.refused.insert(e.addr, i);
                self.alloc_failed = true;
                self.diverged(i, || format!("alloc of {} B failed where PyTorch's succeeded: {error}", e.size));
                if let AllocatorError::OutOfMemory(oom) = error {
                    self.raised(ReplayOom { index: i, message: oom.message, recorded: false });
                }
            }
        }
        1
    }

    /// A `free_requested`: the program's free, after `record_stream` on a stream of the
    /// replay's own where the free completed later (or never).
    fn free_requested(&mut self, i: usize, addr: u64) -> Result<usize, ReplayError> {
        let waits_for = self.deferred.stream_of_request(i);
        let Some((allocation, malloc)) = self.live.remove(&addr) else {
            if let Some(malloc) = self.refused.remove(&addr) {
                self.sink.call(ReplayCall::Free { index: i, malloc, deferred: waits_for.is_some() });
                return Ok(1);
            }
            if self.alloc_failed {
                return Ok(1); // its alloc already diverged
            }
            let device = self.options.device;
            return Err(ReplayError::UnknownAddress { device, index: i, action: "free_requested", addr });
        };
        self.sink.call(ReplayCall::Free { index: i, malloc, deferred: waits_for.is_some() });
        if let Some(stream) = waits_for {
            self.allocator.backend_mut().hold_stream(stream);
            self.allocator.record_stream(&allocation, stream).map_err(ReplayError::Setup)?;
        }
        if let Err(error) = self.allocator.free(allocation) {
            self.diverged(i, || format!("free failed: {error}"));
        }
        Ok(1)
    }

    /// A `free_completed`: of a deferred free, the other stream's work on its block ended; it
    /// completes at the allocator's next call. (One right after its `free_requested` is that
    /// free's own doing.)
    fn free_completed(&mut self, i: usize) -> Result<usize, ReplayError> {
        let Some((free, stream)) = self.deferred.completion(i) else { return Ok(1) };
        let calls_known = self.options.calls.is_some();
        if calls_known && completes_in_retry_chain(self.trace, i) {
            // The next malloc's release synchronizes the stream itself (as it does a device
            // replay's stand-in stream: no call needed).
            return Ok(1);
        }
        // The other stream's work is done now; the free completes at the next malloc, or here
        // if the program called empty_cache with nothing to free.
        self.allocator.backend_mut().finish_stream(stream);
        self.sink.call(ReplayCall::FreeCompleted { index: i, free });
        if calls_known {
            return Ok(1); // the program's empty_cache calls are known
        }
        Ok(self.sync_without_release(i)?.unwrap_or(1))
    }

    /// Where the program's calls are not known, after the deferred completion `trace[i]`: if
    /// its run of completions is followed by no malloc and no release, they were the
    /// synchronization of an `empty_cache` call that found nothing to free, which is made here,
    /// completing the rest of the run first. Returns the entries that accounts for (the run),
    /// or `None` where the run ends in a malloc or a release.
    fn sync_without_release(&mut self, i: usize) -> Result<Option<usize>, ReplayError> {
        let trace = self.trace;
        // The end of this run of deferred completions, found once per run rather than once per
        // completion (which was quadratic in the run's length).
        if self.completions_end <= i {
            self.completions_end = (i + 1..trace.len())
                .find(|&n| !(trace[n].action == TraceAction::FreeCompleted && self.deferred.completion(n).is_some()))
                .unwrap_or(trace.len());
        }
        let after = (self.completions_end < trace.len()).then_some(self.completions_end);
        if after.is_some_and(|n| ends_sync_run(trace[n].action)) {
            return Ok(None);
        }
        let last = trace[i..].iter().take_while(|n| n.action == TraceAction::FreeCompleted).count();
        for j in i..i + last {
            if let Some((free, stream)) = self.deferred.completion(j) {
                self.allocator.backend_mut().finish_stream(stream);
                if j != i {
                    self.sink.call(ReplayCall::FreeCompleted { index: j, free });
                }
            }
        }
        self.empty_cache_points.push(i);
        self.sink.call(ReplayCall::EmptyCache { index: i });
        self.allocator.empty_cache().map_err(ReplayError::Setup)?;
        Ok(Some(last))
    }

    /// A `segment_alloc` or `segment_map`: the doing of the malloc that follows, which the
    /// replay makes itself.
    fn segment_alloc_or_map(&mut self, _i: usize) -> usize {
        1
    }

    /// A run of `segment_free` and `segment_unmap` entries, starting at `i`: the doing of the
    /// next malloc (its garbage collection or retry chain), or of an `empty_cache` call. Where
    /// the program's calls are known, a release no call explains is the next malloc's (and a
    /// difference shows as an extra or a missing segment event); where they are not, the
    /// allocator's plan for the next malloc tells which, and an `empty_cache` is made here if
    /// the malloc would not release the run itself.
    fn segment_free_or_unmap(&mut self, i: usize) -> usize {
        let run = self.trace[i..]
            .iter()
            .take_while(|n| matches!(n.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap))
            .count();
        if self.options.calls.is_none() {
            // Cross-stream frees whose work is done complete first under either explanation
            // (the malloc's first step, or empty_cache's synchronization), so they are completed
            // before asking what the malloc would release.
            if let Err(error) = self.allocator.process_events() {
                self.diverged(i, || format!("event query failed: {error}"));
            }
            if !released_by_next_malloc(&self.allocator, self.trace, i, run, &mut self.trial_copies) {
                self.empty_cache_points.push(i);
                self.sink.call(ReplayCall::EmptyCache { index: i });
                if let Err(error) = self.allocator.empty_cache() {
                    self.diverged(i, || format!("empty_cache failed: {error}"));
                }
            }
        }
        run
    }

    /// An `oom`: the program's malloc that PyTorch could not serve, made on a device that
    /// reports the free memory PyTorch's driver reported, with the VA reservations the failure
    /// makes placed where the trace later shows them. It must fail as PyTorch's did.
    fn oom(&mut self, i: usize, e: &TraceEntry) -> usize {
        self.allocator.backend_mut().set_free_memory_override(Some(e.addr));
        self.sink.call(ReplayCall::Malloc { index: i, size: e.size, stream: e.stream, recorded_oom: true });
        // The malloc's first step, taken before asking what it reserves (the plan takes the
        // frees still outstanding after it as pending). No event is queried while allocations
        // are routed to a pool, nor by the malloc then.
        if self.allocator.routed_pools().is_empty()
            && let Err(error) = self.allocator.process_events()
        {
            self.diverged(i, || format!("event query failed: {error}"));
        }
        // The reservations a failing request makes are never mapped by it; the first one may be
        // by a later request, which shows its address.
        for address in oom_reservation_addresses(&self.allocator, self.trace, &self.shown, i, &mut self.trial_copies) {
            self.allocator.backend_mut().plan_reservation_next(address);
        }
        self.allocator.backend_mut().set_reservations_unplanned(true);
        let result = self.allocator.malloc(e.size, e.stream);
        self.allocator.backend_mut().set_reservations_unplanned(false);
        match result {
            Err(AllocatorError::OutOfMemory(oom)) => {
                self.raised(ReplayOom { index: i, message: oom.message, recorded: true })
            }
            Err(other) => self.diverged(i, || format!("expected OOM, got: {other}")),
            Ok(a) => {
                self.diverged(i, || format!("PyTorch ran out of memory for {} B, the replay did not", e.size));
                let _ = self.allocator.free(a);
            }
        }
        self.allocator.backend_mut().set_free_memory_override(None);
        1
    }

    /// A `snapshot` entry: where the run's `expected.json` lists the program's calls, those
    /// made after it (an `empty_cache`, a stats reset, a pool call), and the entries that are
    /// their own doing; a plain mark otherwise.
    fn snapshot_mark(&mut self, i: usize) -> Result<usize, ReplayError> {
        let options = self.options;
        let Some(calls) = options.calls.as_deref() else { return Ok(1) };
        let mut skip = 0;
        for program_call in calls.iter().filter(|c| c.at == i) {
            if matches!(program_call.call, CallKind::EmptyCache | CallKind::Pool(PoolCall::EmptyCache(_))) {
                // Its synchronization completes the deferred frees that follow it.
                for j in synchronized_completions(self.trace, i) {
                    if let Some((free, _)) = self.deferred.completion(j) {
                        self.sink.call(ReplayCall::FreeCompleted { index: j, free });
                    }
                }
            }
            if program_call.call == CallKind::EmptyCache {
                self.sink.call(ReplayCall::EmptyCache { index: i });
            }
            if let CallKind::Pool(pool_call) = program_call.call {
                self.sink.call(ReplayCall::Pool { index: i, call: pool_call });
            }
            skip = skip.max(self.perform_call(program_call.call, i)?);
        }
        Ok(1 + skip)
    }

    /// Performs the program's `call`, recorded after the `snapshot` entry `trace[at]`; returns
    /// how many entries after it are the call's own doing (an `empty_cache`'s completions of
    /// deferred frees and its releases), which the replay then skips.
    fn perform_call(&mut self, call: CallKind, at: usize) -> Result<usize, ReplayError> {
        match call {
            CallKind::ResetPeakMemoryStats => {
                self.allocator.reset_peak_stats();
                Ok(0)
            }
            CallKind::ResetAccumulatedMemoryStats => {
                self.allocator.reset_accumulated_stats();
                Ok(0)
            }
            CallKind::Pool(pool_call) => {
                // emptyCache(pool) of a freeable pool synchronizes and releases as empty_cache
                // does.
                let skip = match pool_call {
                    PoolCall::EmptyCache(_) => self.finish_sync_run(at),
                    _ => 0,
                };
                let before = self.allocator.trace_len_total();
                let delta = pool_call
                    .perform_with(&mut self.allocator, |s| s, &mut self.checkpoints)
                    .map_err(ReplayError::Setup)?;
                if let PoolCall::Checkpoint(..) | PoolCall::Restore(..) = pool_call {
                    return Ok(self.checkpoint_entries(at, before, delta));
                }
                Ok(skip)
            }
            CallKind::EmptyCache => {
                // empty_cache synchronizes first: every deferred free whose completion follows
                // completes now, then the cached segments are released.
                let skip = self.finish_sync_run(at);
                self.allocator.empty_cache().map_err(ReplayError::Setup)?;
                Ok(skip)
            }
        }
    }

    /// After a checkpoint or a restore made after the `snapshot` entry `trace[at]`: the entries
    /// the replay's allocator recorded for it from number `before` on must be the recording's
    /// next ones (the same frees and allocations, in any order: PyTorch walks the pool's blocks
    /// in its hash set's order), which are its doing and skipped; the allocations a restore
    /// handed out are the program's from then on, each named by the recording's `alloc` entry
    /// of it. Returns how many entries are skipped.
    fn checkpoint_entries(&mut self, at: usize, before: u64, delta: Option<RestoreDelta>) -> usize {
        let ours = self.allocator.trace_since(before);
        let end = (at + 1 + ours.len()).min(self.trace.len());
        let recorded = &self.trace[at + 1..end];
        let key = |e: &TraceEntry| (e.action.name(), e.addr, e.size);
        let mut theirs: Vec<_> = recorded.iter().map(key).collect();
        let mut mine: Vec<_> = ours.iter().map(key).collect();
        theirs.sort_unstable();
        mine.sort_unstable();
        if theirs != mine {
            let first = mine.iter().zip(&theirs).find(|(m, t)| m != t);
            let message = match first {
                Some((m, t)) => format!("replay {} {:#x} {} B, PyTorch {} {:#x} {} B", m.0, m.1, m.2, t.0, t.1, t.2),
                None => format!("the replay made {} entries, PyTorch {}", mine.len(), theirs.len()),
            };
            self.diverged(at, || format!("a pool checkpoint's or restore's frees and allocations differ: {message}"));
        }
        if let Some(delta) = delta {
            for address in &delta.freed {
                self.live.remove(address);
            }
            for allocation in delta.allocated {
                let address = allocation.address();
                let made_at = recorded
                    .iter()
                    .position(|e| e.action == TraceAction::Alloc && e.addr == address)
                    .map_or(at, |k| at + 1 + k);
                self.live.insert(address, (allocation, made_at));
            }
        }
        recorded.len()
    }

    /// For a call after the `snapshot` entry `trace[at]` that synchronizes and releases:
    /// completes the deferred frees whose completions follow, and returns how many entries after
    /// `at` (those completions and the releases after them) are the call's doing.
    fn finish_sync_run(&mut self, at: usize) -> usize {
        let completed = synchronized_completions(self.trace, at);
        for j in completed.clone() {
            if let Some((_, stream)) = self.deferred.completion(j) {
                self.allocator.backend_mut().finish_stream(stream);
            }
        }
        let released = self.trace[completed.end..]
            .iter()
            .take_while(|n| matches!(n.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap))
            .count();
        completed.len() + released
    }
}
