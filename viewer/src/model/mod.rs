//! A loaded run: its trace, and the allocator's state at any point of it, fast.
//!
//! The state of one moment ([`PoolState`]: segments, blocks, `memory_stats()`) and the rules
//! that take it from one trace entry to the next are `cachalot_trace::rebuild`'s, shared with
//! the command line's tests and checked against the allocator there; this module adds what
//! makes a whole run browsable: checkpoints, seeking, the byte series, the markers of
//! `empty_cache` calls and retries, and the check of the rebuilt end state against the file's.
//!
//! # How the state at a moment is found
//!
//! Loading applies the trace once ([`PoolState::apply_entry`]: PyTorch's split, merge and
//! stat rules on a map of segments and blocks) and keeps:
//!
//! - the allocated, active and reserved bytes after every entry ([`Series`]: 24 bytes per
//!   entry, with a min/max pyramid for drawing);
//! - a checkpoint — a full copy of the segments, blocks and `memory_stats()` — every
//!   `max(4096, blocks / 2)` entries, so that checkpoints cost memory in proportion to the
//!   trace rather than to blocks × entries;
//! - the few entries where the heuristic counters (`num_alloc_retries`,
//!   `num_sync_all_streams`, which no trace entry records) move.
//!
//! [`Run::seek`] then clones the nearest checkpoint before the cursor and replays at most one
//! interval of entries; moving forward from the previous cursor position replays only the
//! difference. Both are a few hundred microseconds for typical traces.
//!
//! # Traces that do not start from an empty allocator
//!
//! PyTorch's history is a ring buffer: once full, the oldest entries are gone and the trace
//! starts from a state it does not describe. Like PyTorch's memory_viz, the state before the
//! first entry is then found by walking the trace backwards from the snapshot's end state
//! ([`PoolState::before`]); the sizes of blocks that were allocated before the trace began and
//! freed during it are estimated from their requested sizes. The run then says so
//! ([`Run::initial_inferred`]).
//! Replaying through `cachalot_trace::replay` instead was not chosen: it needs a complete trace
//! too, and it shows cachalot's decisions rather than what the recording says happened.

pub mod lifetimes;
pub mod peak;
pub mod series;

use cachalot_core::{BlockState, DeviceFacts, Mark, MemoryStats, SegmentSnapshot, TraceAction, TraceEntry};

use cachalot_core::trace::ContextTable;

pub use series::{Band, Outline, Series};
// The state of one moment is the trace crate's rebuild; re-exported because it is the
// model's vocabulary (what `Run::seek` returns, what the panels draw).
pub use cachalot_trace::rebuild::{Anomaly, Block, NO_EVENT, PoolState, Rules, Segment};

/// Fewest entries between two checkpoints. A seek replays at most this many entries (a fraction
/// of a millisecond); with 1024, opening the 3M-entry pickle took 0.24 GB more memory and 15-25 %
/// more CPU time, copying states for checkpoints (docs/journal/benchmarks-2026-11.md §12).
const CHECKPOINT_MIN: usize = 4096;
/// Entries to replay beyond which a seek to the newest moment copies the head state instead.
const HEAD_COPY_ENTRIES: usize = 256;
/// Anomalies kept (the count goes on).
const ANOMALIES_KEPT: usize = 100;

/// Where a run came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunKind {
    /// A cachalot snapshot file.
    Cachalot,
    /// A PyTorch snapshot pickle (device trace number `device`).
    Torch {
        /// Device index.
        device: usize,
    },
    /// An op file replayed on the simulator.
    Ops,
    /// A live experiment.
    Live,
    /// A trace replayed through cachalot's allocator.
    Replay,
}

/// Why the state is where the cursor is: markers drawn on the timeline.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Markers {
    /// Entries of out-of-memory errors.
    pub ooms: Vec<u32>,
    /// First entries of runs of segment releases that no allocation caused (`empty_cache`).
    pub empty_cache: Vec<u32>,
    /// Entries where an allocation released the whole cache and retried.
    pub retries: Vec<u32>,
    /// First entries of releases by the garbage collector.
    pub collections: Vec<u32>,
}

/// Whether the rebuilt end state agrees with the end state the file recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verification {
    /// The file has no end state to compare with (a live run still going, an op file).
    Unavailable,
    /// Every segment and block matches.
    Matches {
        /// Segments compared.
        segments: usize,
        /// Blocks compared.
        blocks: usize,
    },
    /// The first difference.
    Differs(String),
}

/// A heuristic counter increment at one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Extra {
    index: u32,
    sync: bool,
    retry: bool,
}

/// A copy of the state after `index` entries.
#[derive(Clone, Debug)]
struct Checkpoint {
    index: usize,
    state: PoolState,
}

/// The state at one cursor position, kept between frames so that small moves are cheap.
#[derive(Clone, Debug, Default)]
pub struct StateCache {
    index: usize,
    state: Option<PoolState>,
}

impl StateCache {
    /// The cursor position of the state held, if any.
    pub fn index(&self) -> Option<usize> {
        self.state.as_ref().map(|_| self.index)
    }

    /// The state held (after [`Run::seek`]).
    pub fn state(&self) -> Option<&PoolState> {
        self.state.as_ref()
    }

    /// Forgets the state (e.g. when the run was rebuilt).
    pub fn clear(&mut self) {
        self.state = None;
    }
}

/// A loaded or live run.
#[derive(Clone, Debug)]
pub struct Run {
    /// Display name (file name, experiment name).
    pub name: String,
    /// Where it came from.
    pub kind: RunKind,
    /// What produced it (`Snapshot::source`, the pickle's path, ...).
    pub source: String,
    /// The device, where the file says.
    pub device: Option<DeviceFacts>,
    /// The allocator configuration string.
    pub settings: String,
    /// Rules derived from the configuration.
    pub rules: Rules,
    /// The trace, oldest first.
    pub trace: Vec<TraceEntry>,
    /// Stacks and annotations referenced by the trace.
    pub contexts: ContextTable,
    /// Labelled marks.
    pub marks: Vec<Mark>,
    /// `memory_allocated()` at every cursor position.
    pub allocated: Series,
    /// Active bytes (allocated + pending free) at every cursor position.
    pub active: Series,
    /// `memory_reserved()` at every cursor position.
    pub reserved: Series,
    /// OOMs, `empty_cache` calls and full releases of the retry chain.
    pub markers: Markers,
    /// Entries that did not fit the rebuilt state (kept: the first hundred).
    pub anomalies: Vec<Anomaly>,
    /// Number of such entries.
    pub anomaly_count: usize,
    /// Whether the state before the first entry was inferred (the trace did not start empty).
    pub initial_inferred: bool,
    /// The end state as the file recorded it, to verify against.
    pub recorded_end: Option<Vec<SegmentSnapshot>>,
    /// `memory_stats()` at the end as the file recorded it.
    pub recorded_stats: Option<MemoryStats>,
    /// The result of comparing the rebuilt end state with [`Run::recorded_end`].
    pub verification: Verification,
    /// Whether more entries may still arrive (a live run).
    pub live: bool,
    /// `set_per_process_memory_fraction`, where the file says.
    pub memory_fraction: Option<f64>,
    checkpoints: Vec<Checkpoint>,
    extras: Vec<Extra>,
    /// The state after `processed` entries.
    head: PoolState,
    processed: usize,
}

impl Run {
    /// An empty run to which entries are added with [`Run::extend`].
    pub fn new(name: impl Into<String>, kind: RunKind, rules: Rules) -> Self {
        let head = PoolState::empty(&rules);
        let mut run = Run {
            name: name.into(),
            kind,
            source: String::new(),
            device: None,
            settings: String::new(),
            rules,
            trace: Vec::new(),
            contexts: ContextTable::default(),
            marks: Vec::new(),
            allocated: Series::default(),
            active: Series::default(),
            reserved: Series::default(),
            markers: Markers::default(),
            anomalies: Vec::new(),
            anomaly_count: 0,
            initial_inferred: false,
            recorded_end: None,
            recorded_stats: None,
            verification: Verification::Unavailable,
            live: false,
            memory_fraction: None,
            checkpoints: Vec::new(),
            extras: Vec::new(),
            head,
            processed: 0,
        };
        run.reset_to(run.head.clone());
        run
    }

    /// Starts over from `initial` (keeping the trace).
    fn reset_to(&mut self, initial: PoolState) {
        self.allocated = Series::default();
        self.active = Series::default();
        self.reserved = Series::default();
        self.markers = Markers::default();
        self.anomalies.clear();
        self.anomaly_count = 0;
        self.extras.clear();
        self.processed = 0;
        self.push_series(&initial);
        self.checkpoints = vec![Checkpoint { index: 0, state: initial.clone() }];
        self.head = initial;
    }

    fn push_series(&mut self, state: &PoolState) {
        Self::push_values(&mut self.allocated, &mut self.active, &mut self.reserved, state);
    }

    fn push_values(allocated: &mut Series, active: &mut Series, reserved: &mut Series, state: &PoolState) {
        let s = &state.stats;
        allocated.push(s.allocated_bytes.all().current.max(0) as u64);
        active.push(s.active_bytes.all().current.max(0) as u64);
        reserved.push(s.reserved_bytes.all().current.max(0) as u64);
    }

    /// The bytes the allocator may hold: the device's memory times the memory fraction.
    pub fn allowed_bytes(&self) -> u64 {
        let total = self.device.as_ref().map_or(cachalot_trace::replay::DEFAULT_DEVICE_TOTAL, |d| d.total_memory);
        (total as f64 * self.memory_fraction.unwrap_or(1.0)) as u64
    }

    /// Number of entries whose effect is known (cursor positions are `0..=processed()`).
    pub fn processed(&self) -> usize {
        self.processed
    }

    /// The last cursor position.
    pub fn end(&self) -> usize {
        self.processed
    }

    /// The state after every processed entry.
    pub fn head(&self) -> &PoolState {
        &self.head
    }

    /// Number of checkpoints kept.
    pub fn checkpoint_count(&self) -> usize {
        self.checkpoints.len()
    }

    /// Adds entries (a live run); they are processed as far as their effect is known.
    pub fn extend(&mut self, entries: impl IntoIterator<Item = TraceEntry>) {
        self.trace.extend(entries);
        self.process(false, None);
    }

    /// Processes every remaining entry (the run is complete) and verifies the end state.
    pub fn finish(&mut self) {
        self.live = false;
        self.process(true, None);
        self.verify();
    }

    /// Processes entries, calling `progress(done, total)` now and then. Unless `last`, a
    /// trailing run of segment events waits for the entry after it (it decides their pool).
    fn process(&mut self, last: bool, mut progress: Option<&mut dyn FnMut(usize, usize)>) {
        let mut limit = self.trace.len();
        if !last {
            while limit > self.processed && self.trace[limit - 1].action.is_segment_event() {
                limit -= 1;
            }
        }
        let mut since = self.processed - self.checkpoints.last().map_or(0, |c| c.index);
        let mut pending_retry = None;
        for i in self.processed..limit {
            if i % 65_536 == 0
                && let Some(p) = progress.as_mut()
            {
                p(i, limit);
            }
            let e = self.trace[i];
            let index = i as u32;
            let mut extra = Extra { index, sync: false, retry: false };
            match e.action {
                TraceAction::SegmentFree | TraceAction::SegmentUnmap
                    if i == 0
                        || !matches!(
                            self.trace[i - 1].action,
                            TraceAction::SegmentFree | TraceAction::SegmentUnmap
                        ) =>
                {
                    // The first release of a run. A run that a new segment follows is the work
                    // of that allocation when memory was short (the retry chain's release) or
                    // when the garbage collector may run; otherwise it is an `empty_cache`
                    // call (the next allocation merely missed the emptied cache).
                    let run_end = self.trace[i..]
                        .iter()
                        .position(|n| !matches!(n.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap))
                        .map(|n| i + n);
                    let next = run_end.and_then(|j| self.trace.get(j).map(|n| (j, *n)));
                    match next {
                        Some((_, n)) if n.action == TraceAction::Oom => {}
                        Some((j, n)) if matches!(n.action, TraceAction::SegmentAlloc | TraceAction::SegmentMap) => {
                            let reserved = self.head.stats.reserved_bytes.all().current.max(0) as u64;
                            if reserved.saturating_add(n.size) > self.allowed_bytes() {
                                pending_retry = Some(j);
                            } else if self.rules.gc_possible {
                                self.markers.collections.push(index);
                            } else {
                                self.markers.empty_cache.push(index);
                                extra.sync = true;
                            }
                        }
                        _ => {
                            self.markers.empty_cache.push(index);
                            extra.sync = true;
                        }
                    }
                }
                TraceAction::SegmentAlloc | TraceAction::SegmentMap if pending_retry == Some(i) => {
                    // The retry chain frees everything; the oversize release (with a
                    // max_split_size) frees only some, leaving whole free segments behind.
                    pending_retry = None;
                    let selective = self.rules.max_split != u64::MAX;
                    if !selective || !self.head.has_whole_free_segment() {
                        self.markers.retries.push(index);
                        extra.sync = true;
                        extra.retry = true;
                    }
                }
                TraceAction::Oom => {
                    self.markers.ooms.push(index);
                    extra.sync = true;
                    extra.retry = true;
                }
                _ => {}
            }
            if let Err(anomaly) = self.head.apply_entry(&self.trace, i, &self.rules) {
                self.anomaly_count += 1;
                if self.anomalies.len() < ANOMALIES_KEPT {
                    self.anomalies.push(anomaly);
                }
            }
            if extra.sync || extra.retry {
                apply_extra(&mut self.head.stats, extra);
                self.extras.push(extra);
            }
            Self::push_values(&mut self.allocated, &mut self.active, &mut self.reserved, &self.head);
            since += 1;
            if since >= CHECKPOINT_MIN.max(self.head.block_count / 2) {
                self.checkpoints.push(Checkpoint { index: i + 1, state: self.head.clone() });
                since = 0;
            }
        }
        self.processed = limit;
    }

    /// Replays entry `i` onto `state` (for [`Run::seek`]).
    fn replay_one(&self, state: &mut PoolState, i: usize) {
        // Anomalies were collected when the entry was first processed.
        let _ = state.apply_entry(&self.trace, i, &self.rules);
        if let Ok(k) = self.extras.binary_search_by_key(&(i as u32), |x| x.index) {
            apply_extra(&mut state.stats, self.extras[k]);
        }
    }

    /// Puts the state after `target` entries (clamped to [`Run::end`]) into `cache`.
    pub fn seek<'c>(&self, cache: &'c mut StateCache, target: usize) -> &'c PoolState {
        let target = target.min(self.processed);
        let k = self.checkpoints.partition_point(|c| c.index <= target).saturating_sub(1);
        let checkpoint = &self.checkpoints[k];
        let reuse = match &cache.state {
            Some(_) => cache.index <= target && cache.index >= checkpoint.index,
            None => false,
        };
        let behind = if reuse { target - cache.index } else { target - checkpoint.index };
        if target == self.processed && behind > HEAD_COPY_ENTRIES {
            // The newest moment, where a live run's views are: the head is that state already,
            // and copying it is cheaper than replaying every entry that arrived since the last
            // frame a second time.
            cache.state = Some(self.head.clone());
            cache.index = target;
        } else if !reuse {
            cache.state = Some(checkpoint.state.clone());
            cache.index = checkpoint.index;
        }
        let from = cache.index;
        let state = cache.state.get_or_insert_with(PoolState::default);
        for i in from..target {
            self.replay_one(state, i);
        }
        cache.index = target;
        state
    }

    /// The state after `target` entries, computed from scratch (for one-off use).
    pub fn state_at(&self, target: usize) -> PoolState {
        let mut cache = StateCache::default();
        self.seek(&mut cache, target);
        cache.state.unwrap_or_default()
    }

    /// Compares the rebuilt end state with the recorded one.
    pub fn verify(&mut self) {
        self.verification = match &self.recorded_end {
            None => Verification::Unavailable,
            Some(recorded) => compare_end_state(&self.head, recorded),
        };
    }

    /// The frames of an entry's stack, innermost first.
    pub fn frames(&self, context: Option<cachalot_core::ContextId>) -> &[cachalot_core::Frame] {
        context.map(|c| self.contexts.frames(c)).unwrap_or(&[])
    }

    /// Builds a complete run from a full trace: replays it from an empty allocator, or, when
    /// the trace does not describe everything from the start, from the state inferred by
    /// walking it backwards from the recorded end state.
    pub fn build(&mut self, trace_complete: bool, mut progress: impl FnMut(usize, usize)) {
        let inferable = self.recorded_end.is_some();
        if !trace_complete && inferable {
            self.start_from_inferred_state();
        }
        self.process(true, Some(&mut progress));
        if trace_complete && self.anomaly_count > 0 && inferable && !self.initial_inferred {
            // The file said complete but the trace refers to memory it never allocated.
            self.start_from_inferred_state();
            self.process(true, Some(&mut progress));
        }
        progress(self.trace.len(), self.trace.len());
        self.verify();
    }

    fn start_from_inferred_state(&mut self) {
        let Some(recorded) = &self.recorded_end else { return };
        let state = PoolState::before(&self.trace, recorded, &self.rules);
        // With no entries there is nothing before or after: the end state is all there is.
        self.initial_inferred = !self.trace.is_empty();
        self.reset_to(state);
    }
}

fn apply_extra(stats: &mut MemoryStats, extra: Extra) {
    if extra.sync {
        stats.num_sync_all_streams += 1;
    }
    if extra.retry {
        stats.num_alloc_retries += 1;
    }
}

/// The first difference between a rebuilt state and a recorded list of segments.
fn compare_end_state(state: &PoolState, recorded: &[SegmentSnapshot]) -> Verification {
    let mut blocks = 0;
    if state.segments.len() != recorded.len() {
        return Verification::Differs(format!(
            "{} segments rebuilt, {} recorded",
            state.segments.len(),
            recorded.len()
        ));
    }
    for (ours, theirs) in state.segments.values().zip(recorded) {
        let same_segment = ours.address == theirs.address
            && ours.size == theirs.total_size
            && ours.stream == theirs.stream
            && ours.pool == theirs.pool
            && ours.expandable == theirs.is_expandable;
        if !same_segment {
            return Verification::Differs(format!(
                "segment at {:#x} ({} B, {} pool) rebuilt where {:#x} ({} B, {} pool) was recorded",
                ours.address,
                ours.size,
                ours.pool.name(),
                theirs.address,
                theirs.total_size,
                theirs.pool.name()
            ));
        }
        if ours.blocks.len() != theirs.blocks.len() {
            return Verification::Differs(format!(
                "segment at {:#x}: {} blocks rebuilt, {} recorded",
                ours.address,
                ours.blocks.len(),
                theirs.blocks.len()
            ));
        }
        for (a, b) in ours.blocks.iter().zip(&theirs.blocks) {
            let requested_matters = b.state != BlockState::Inactive;
            if a.address != b.address
                || a.size != b.size
                || a.state != b.state
                || (requested_matters && a.requested != b.requested_size)
            {
                return Verification::Differs(format!(
                    "block at {:#x}: rebuilt {} B {} (requested {}), recorded {} B at {:#x} {} (requested {})",
                    a.address,
                    a.size,
                    a.state.name(),
                    a.requested,
                    b.size,
                    b.address,
                    b.state.name(),
                    b.requested_size
                ));
            }
            blocks += 1;
        }
    }
    Verification::Matches { segments: recorded.len(), blocks }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachalot_core::size::PoolKind;
    use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
    use cachalot_trace::Snapshot;

    fn recorded_run(ops: impl FnOnce(&mut CachingAllocator<SimBackend>)) -> (Run, Snapshot) {
        let mut a = CachingAllocator::new(SimBackend::new(1 << 34), AllocatorConfig::default()).unwrap();
        a.record_history(true, usize::MAX, &[], false);
        ops(&mut a);
        let snapshot = Snapshot::capture(&a, "test");
        let mut run = Run::new("test", RunKind::Cachalot, Rules::default());
        run.trace = snapshot.trace.clone();
        run.recorded_end = Some(snapshot.segments.clone());
        run.build(true, |_, _| {});
        (run, snapshot)
    }

    #[test]
    fn rebuilds_the_allocators_state_and_stats() {
        let (run, snapshot) = recorded_run(|a| {
            let mut live = Vec::new();
            for i in 0..3000u64 {
                let size = 1 + (i * 7919) % (3 << 20);
                live.push(a.malloc(size, StreamId(i % 2)).unwrap());
                if i % 3 == 0 {
                    let victim = live.swap_remove((i as usize * 31) % live.len());
                    a.free(victim).unwrap();
                }
                if i == 1500 {
                    for x in live.drain(..) {
                        a.free(x).unwrap();
                    }
                    a.empty_cache().unwrap();
                }
            }
        });
        assert!(matches!(run.verification, Verification::Matches { .. }), "{:?}", run.verification);
        assert_eq!(run.anomaly_count, 0);
        let mut ours = run.head().stats.to_flat();
        let mut theirs = snapshot.stats.to_flat();
        for key in ["num_alloc_retries", "num_sync_all_streams"] {
            ours.remove(key);
            theirs.remove(key);
        }
        assert_eq!(ours, theirs);
        // The start, and one at least every CHECKPOINT_MIN entries (blocks / 2 is smaller here).
        assert!(run.trace.len() > CHECKPOINT_MIN, "the test should take a checkpoint");
        assert_eq!(run.checkpoint_count(), 1 + run.trace.len() / CHECKPOINT_MIN);
        assert_eq!(run.markers.empty_cache.len(), 1);
    }

    #[test]
    fn seeking_anywhere_equals_replaying_from_the_start() {
        let (run, _) = recorded_run(|a| {
            let mut live = Vec::new();
            for i in 0..5000u64 {
                live.push(a.malloc(512 * (1 + i % 4000), StreamId::DEFAULT).unwrap());
                if i % 2 == 1 {
                    a.free(live.swap_remove(0)).unwrap();
                }
            }
        });
        let mut cache = StateCache::default();
        for target in [4000, 4100, 17, 9999, 2048, 2049, run.end(), 0] {
            let fast = run.seek(&mut cache, target).clone();
            let mut slow = PoolState::empty(&run.rules);
            for i in 0..target {
                run.replay_one(&mut slow, i);
            }
            assert_eq!(fast, slow, "at {target}");
            assert_eq!(run.allocated.at(target), fast.stats.allocated_bytes.all().current as u64);
        }
    }

    #[test]
    fn a_trace_missing_its_start_is_rebuilt_from_the_end_state() {
        let (full, snapshot) = recorded_run(|a| {
            let keep = a.malloc(5 << 20, StreamId::DEFAULT).unwrap();
            let mut live = Vec::new();
            for i in 0..200u64 {
                live.push(a.malloc(4096 * (1 + i % 7), StreamId::DEFAULT).unwrap());
            }
            for x in live.drain(..100) {
                a.free(x).unwrap();
            }
            a.free(keep).unwrap();
        });
        let mut run = Run::new("tail", RunKind::Cachalot, Rules::default());
        run.trace = snapshot.trace[150..].to_vec();
        run.recorded_end = Some(snapshot.segments.clone());
        run.build(false, |_, _| {});
        assert!(run.initial_inferred);
        assert_eq!(run.anomaly_count, 0, "{:?}", run.anomalies);
        assert!(matches!(run.verification, Verification::Matches { .. }), "{:?}", run.verification);
        assert_eq!(run.head().stats.allocated_bytes.all().current, full.head().stats.allocated_bytes.all().current);
    }

    #[test]
    fn live_entries_wait_for_the_allocation_that_decides_their_pool() {
        let (_, snapshot) = recorded_run(|a| {
            a.malloc(100, StreamId::DEFAULT).unwrap();
        });
        let mut run = Run::new("live", RunKind::Live, Rules::default());
        run.live = true;
        run.extend(snapshot.trace[..1].iter().copied());
        assert_eq!(run.processed(), 0, "segment_alloc waits");
        run.extend(snapshot.trace[1..].iter().copied());
        assert_eq!(run.processed(), 2);
        assert_eq!(run.head().segments.values().next().map(|s| s.pool), Some(PoolKind::Small));
    }
}
