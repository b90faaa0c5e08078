//! The rebuild (`cachalot_trace::rebuild`) against the allocator, on every reference trace of
//! `testdata/traces/pytorch-2.11-h200`: the trace is replayed through `CachingAllocator` on the
//! simulator and rebuilt from the recording, and the two must agree on every segment, block and
//! `memory_stats()` value — at the end and at many points in between — and a trace whose start
//! was dropped must be rebuilt backwards to the allocator's state where it was cut.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use cachalot_core::size::{PoolKind, SMALL_SIZE};
use cachalot_core::{
    BlockSnapshot, BlockState, CachingAllocator, MemoryStats, SegmentSnapshot, SimBackend, TraceAction, TraceEntry,
};
use cachalot_trace::rebuild::{Block, PoolState, Rules};
use cachalot_trace::replay::{ExpectedRun, ReplayOptions, replay};
use cachalot_trace::snapshot::pickle::read_snapshot;
use cachalot_trace::snapshot::torch::TorchSnapshot;

/// Intermediate points compared per trace (the end is compared besides).
const CUTS: usize = 24;

/// Counters no trace entry records: the allocator counts its retries and its waits for every
/// stream, the trace shows only their consequences (the viewer's `Run` estimates them from the
/// shape of the trace, not the rebuild), so they are left out of the comparison by design.
const UNRECORDED_COUNTERS: [&str; 2] = ["num_alloc_retries", "num_sync_all_streams"];

struct Reference {
    name: String,
    snapshot: TorchSnapshot,
    options: ReplayOptions,
}

impl Reference {
    fn trace(&self) -> &[TraceEntry] {
        &self.snapshot.device_traces[0]
    }

    fn rules(&self) -> Rules {
        Rules::from_config(&self.options.config)
    }

    /// The allocator after replaying the first `cut` entries: the replay of a snapshot whose
    /// trace was cut there. Cuts are chosen where the calls before them are complete and what
    /// follows cannot change how they are replayed (see [`cut_points`]).
    fn core_after(&self, cut: usize) -> CachingAllocator<SimBackend> {
        let mut prefix = self.snapshot.clone();
        prefix.device_traces[0].truncate(cut);
        let outcome = replay(&prefix, &self.options, |_, _| {}).unwrap();
        assert!(outcome.divergences.is_empty(), "{}: the replay diverged: {:?}", self.name, outcome.divergences);
        outcome.allocator
    }
}

fn references() -> Vec<Reference> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/traces/pytorch-2.11-h200");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_suffix(".pickle").map(str::to_owned))
        .collect();
    names.sort();
    let references: Vec<Reference> = names
        .into_iter()
        .map(|name| {
            let snapshot = read_snapshot(&std::fs::read(dir.join(format!("{name}.pickle"))).unwrap()).unwrap();
            let expected =
                ExpectedRun::from_json(&std::fs::read(dir.join(format!("{name}.expected.json"))).unwrap()).unwrap();
            let options = ReplayOptions::for_snapshot(&snapshot, Some(&expected)).unwrap();
            Reference { name, snapshot, options }
        })
        .collect();
    assert_eq!(references.len(), 9, "the nine reference traces");
    references
}

/// Whether the trace may be cut before entry `c`: the allocator call that wrote `trace[c - 1]`
/// is complete (an `alloc`, a free that completed at once, an out-of-memory error, or a
/// release that no later allocation asked for), so a replay of `trace[..c]` performs the same
/// calls as the replay of the whole trace up to there.
fn is_cut_point(trace: &[TraceEntry], c: usize) -> bool {
    let last = &trace[c - 1];
    let next = trace.get(c).map(|e| e.action);
    match last.action {
        TraceAction::Alloc | TraceAction::Oom => true,
        // A free whose completion waited for another stream ends in a synchronisation the
        // replay infers from what follows; a free that completed at once does not.
        TraceAction::FreeCompleted => {
            c >= 2 && trace[c - 2].action == TraceAction::FreeRequested && trace[c - 2].addr == last.addr
        }
        // The replay decides from the entry after a run of releases whether an allocation or
        // an `empty_cache` call released them.
        TraceAction::SegmentFree | TraceAction::SegmentUnmap => !matches!(
            next,
            Some(
                TraceAction::SegmentFree
                    | TraceAction::SegmentUnmap
                    | TraceAction::SegmentAlloc
                    | TraceAction::SegmentMap
                    | TraceAction::Oom
            )
        ),
        _ => false,
    }
}

/// About [`CUTS`] cut points spread evenly over the trace.
fn cut_points(trace: &[TraceEntry]) -> Vec<usize> {
    let candidates: Vec<usize> = (1..trace.len()).filter(|&c| is_cut_point(trace, c)).collect();
    let mut cuts: Vec<usize> =
        (1..=CUTS).filter_map(|k| candidates.get(k * candidates.len() / (CUTS + 1)).copied()).collect();
    cuts.dedup();
    cuts
}

/// A block of the allocator that the rebuild has shorter: its allocation predates the trace,
/// its size was estimated from its request, and the `excess` bytes of its end that the
/// allocation did not split off are free in the rebuild, merged with the free block after it
/// (which the allocator's state has too, so the trace cannot tell the two apart).
struct UnsplitEnd {
    pool: PoolKind,
    state: BlockState,
    excess: u64,
}

/// Compares the allocator's segments with the rebuilt ones; the first difference, or the
/// unsplit ends it tolerated. The requested sizes of free blocks (stale: those of their last
/// allocation) are compared only where `stale_known`; blocks are allowed an unsplit end (of at
/// most [`SMALL_SIZE`], the most a split leaves) only at the addresses of `estimated`.
fn compare_segments(
    core: &[SegmentSnapshot],
    rebuilt: &PoolState,
    stale_known: bool,
    estimated: &HashSet<u64>,
) -> Result<Vec<UnsplitEnd>, String> {
    if core.len() != rebuilt.segments.len() {
        return Err(format!("segment count: core {}, rebuild {}", core.len(), rebuilt.segments.len()));
    }
    let mut unsplit_ends = Vec::new();
    for (c, r) in core.iter().zip(rebuilt.segments.values()) {
        let at = c.address;
        let fields = [
            ("address", c.address, r.address),
            ("size", c.total_size, r.size),
            ("stream", c.stream.0, r.stream.0),
            ("pool", c.pool as u64, r.pool as u64),
            ("expandable", u64::from(c.is_expandable), u64::from(r.expandable)),
        ];
        if let Some((field, a, b)) = fields.into_iter().find(|(_, a, b)| a != b) {
            return Err(format!("segment at {at:#x}: {field}: core {a:#x}, rebuild {b:#x}"));
        }
        let (mut ci, mut ri) = (0, 0);
        while let (Some(cb), Some(rb)) = (c.blocks.get(ci), r.blocks.get(ri)) {
            let requested_known = stale_known || cb.state != BlockState::Inactive;
            let unsplit_end = |(cf, rf): (&BlockSnapshot, &Block)| {
                let excess = cb.size.saturating_sub(rb.size);
                let plausible = estimated.contains(&cb.address) && (1..=SMALL_SIZE).contains(&excess);
                let free_after = cf.state == BlockState::Inactive && rf.is_free() && cf.address + cf.size == rf.end();
                (plausible && free_after).then_some(excess)
            };
            let fields = [
                ("address", cb.address, rb.address),
                ("state", cb.state as u64, rb.state as u64),
                ("requested size", cb.requested_size, if requested_known { rb.requested } else { cb.requested_size }),
            ];
            if let Some((field, a, b)) = fields.into_iter().find(|(_, a, b)| a != b) {
                return Err(format!(
                    "segment at {at:#x}, block at {:#x}: {field}: core {a:#x}, rebuild {b:#x}",
                    cb.address
                ));
            }
            if cb.size == rb.size {
                (ci, ri) = (ci + 1, ri + 1);
            } else if let Some(excess) = c.blocks.get(ci + 1).zip(r.blocks.get(ri + 1)).and_then(unsplit_end) {
                unsplit_ends.push(UnsplitEnd { pool: c.pool, state: cb.state, excess });
                (ci, ri) = (ci + 2, ri + 2);
            } else {
                return Err(format!(
                    "segment at {at:#x}, block at {:#x}: size: core {:#x}, rebuild {:#x}",
                    cb.address, cb.size, rb.size
                ));
            }
        }
        if (ci, ri) != (c.blocks.len(), r.blocks.len()) {
            return Err(format!(
                "segment at {at:#x}: block count: core {}, rebuild {}",
                c.blocks.len(),
                r.blocks.len()
            ));
        }
    }
    Ok(unsplit_ends)
}

/// The first difference between two flattened `memory_stats()`, over the keys `compared` keeps.
fn first_stat_difference(core: &MemoryStats, rebuilt: &MemoryStats, compared: impl Fn(&str) -> bool) -> Option<String> {
    let (core, rebuilt): (BTreeMap<_, _>, BTreeMap<_, _>) = (core.to_flat(), rebuilt.to_flat());
    core.iter()
        .filter(|(key, _)| compared(key))
        .find(|(key, value)| rebuilt.get(*key) != Some(value))
        .map(|(key, value)| format!("memory_stats[{key}]: core {value}, rebuild {:?}", rebuilt.get(key)))
}

fn recorded_counter(key: &str) -> bool {
    !UNRECORDED_COUNTERS.contains(&key)
}

fn describe(reference: &Reference, cut: usize) -> String {
    let trace = reference.trace();
    let after = cut.checked_sub(1).map_or("nothing".to_owned(), |i| format!("entry {i} ({})", trace[i].action.name()));
    format!("{}: cut at {cut} of {} entries, after {after}", reference.name, trace.len())
}

/// The addresses of the blocks `trace` frees without having allocated them: blocks of the
/// state before it, whose sizes a backward rebuild can only estimate.
fn freed_before_allocated(trace: &[TraceEntry]) -> HashSet<u64> {
    let mut allocated = HashSet::new();
    let mut estimated = HashSet::new();
    for e in trace {
        match e.action {
            TraceAction::Alloc => {
                allocated.insert(e.addr);
            }
            TraceAction::FreeCompleted if !allocated.contains(&e.addr) => {
                estimated.insert(e.addr);
            }
            _ => {}
        }
    }
    estimated
}

#[test]
fn the_rebuild_matches_the_allocator_at_every_cut_of_every_reference_trace() {
    for reference in references() {
        let trace = reference.trace();
        let rules = reference.rules();
        let mut cuts = cut_points(trace);
        assert!(cuts.len() >= CUTS * 3 / 4, "{}: only {} cut points", reference.name, cuts.len());
        cuts.push(trace.len());
        let mut rebuilt = PoolState::empty(&rules);
        let mut done = 0;
        for cut in cuts {
            for i in done..cut {
                if let Err(anomaly) = rebuilt.apply_entry(trace, i, &rules) {
                    panic!("{}: {anomaly:?}", describe(&reference, cut));
                }
            }
            done = cut;
            let core = reference.core_after(cut);
            let difference = compare_segments(&core.snapshot(), &rebuilt, true, &HashSet::new())
                .err()
                .or_else(|| first_stat_difference(&core.stats(), &rebuilt.stats, recorded_counter));
            if let Some(difference) = difference {
                panic!("{}: {difference}", describe(&reference, cut));
            }
            let blocks: usize = core.snapshot().iter().map(|s| s.blocks.len()).sum();
            assert_eq!(rebuilt.block_count, blocks, "{}: block_count", describe(&reference, cut));
        }
    }
}

#[test]
fn a_trace_missing_its_start_is_rebuilt_backwards_to_the_allocators_state_at_the_cut() {
    let mut unsplit_ends = 0;
    for reference in references() {
        let trace = reference.trace();
        let rules = reference.rules();
        let end = reference.core_after(trace.len());
        for cut in cut_points(trace) {
            let kept = &trace[cut..];
            let mut rebuilt = PoolState::before(kept, &end.snapshot(), &rules);
            let core = reference.core_after(cut);
            // The stale requested size a free block keeps is that of an allocation the trace
            // no longer holds (PyTorch's memory_viz and the viewer's verification ignore it).
            let ends = compare_segments(&core.snapshot(), &rebuilt, false, &freed_before_allocated(kept))
                .unwrap_or_else(|difference| panic!("{} (start dropped): {difference}", describe(&reference, cut)));
            // The history before the cut is gone: peaks and accumulated totals restart from
            // the current values, so only current values can agree, once the bytes of the
            // unsplit ends count as free.
            let mut expected = core.stats().clone();
            for end in &ends {
                if end.state == BlockState::ActiveAllocated {
                    expected.allocated_bytes.decrease(end.pool, end.excess);
                }
                expected.active_bytes.decrease(end.pool, end.excess);
                expected.inactive_split_bytes.increase(end.pool, end.excess);
            }
            unsplit_ends += ends.len();
            if let Some(difference) = first_stat_difference(&expected, &rebuilt.stats, |k| k.ends_with(".current")) {
                panic!("{} (start dropped): {difference}", describe(&reference, cut));
            }
            // Replayed forward from there, the rebuild reaches the end state it started from.
            for i in 0..kept.len() {
                if let Err(anomaly) = rebuilt.apply_entry(kept, i, &rules) {
                    panic!("{} (start dropped): entry {} of the kept trace: {anomaly:?}", describe(&reference, cut), i);
                }
            }
            if let Err(difference) = compare_segments(&end.snapshot(), &rebuilt, false, &HashSet::new()) {
                panic!("{} (start dropped), at the end: {difference}", describe(&reference, cut));
            }
        }
    }
    // The reference traces do hold blocks whose unsplit end the trace cannot show.
    assert!(unsplit_ends > 0);
}

/// A trace made under cachalot's own policy (`policy:cachalot`: 512-byte rounding, every
/// remainder split, pages in both pools) is rebuilt to the allocator's end state too: each
/// reference trace replayed under it, and the trace that replay recorded rebuilt with its rules.
#[test]
fn a_trace_made_under_cachalots_own_policy_is_rebuilt_to_the_allocators_end_state() {
    for reference in references() {
        let settings = cachalot_trace::tune::own_policy_settings(reference.options.config.settings());
        let config = cachalot_core::AllocatorConfig::parse(&settings).unwrap();
        let rules = Rules::from_config(&config);
        assert_eq!(rules.policy, cachalot_core::Policy::Cachalot);
        let options = ReplayOptions { config, ..reference.options.clone() };
        let core = replay(&reference.snapshot, &options, |_, _| {}).unwrap().allocator;
        let made = core.trace();
        let mut rebuilt = PoolState::empty(&rules);
        for i in 0..made.len() {
            if let Err(anomaly) = rebuilt.apply_entry(&made, i, &rules) {
                panic!("{} under {settings}: {anomaly:?}", reference.name);
            }
        }
        if let Err(difference) = compare_segments(&core.snapshot(), &rebuilt, true, &HashSet::new()) {
            panic!("{} under {settings}: {difference}", reference.name);
        }
        let current = |stats: &MemoryStats| {
            (stats.allocated_bytes.all().current, stats.reserved_bytes.all().current, stats.allocated_bytes.all().peak)
        };
        assert_eq!(current(&rebuilt.stats), current(&core.stats()), "{} under {settings}", reference.name);
    }
}
