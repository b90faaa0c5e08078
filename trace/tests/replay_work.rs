//! Replay in time that does not grow with the live blocks at each entry: the trace shapes whose
//! releases the replay must explain (the next malloc's, or an `empty_cache` call's?) while many
//! blocks stay live once made it copy the allocator's live state at every release run, and at
//! every out-of-memory entry with expandable segments: quadratic time (BENCHMARKS.md §6,
//! "Replay time against trace length"). These hold the number of such copies to zero, so a
//! change that brings one back fails here, with no timing involved; each replay must also match
//! its recording exactly.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use cachalot_core::{AllocatorConfig, AllocatorError, CachingAllocator, PoolFilter, PoolId, SimBackend, StreamId};
use cachalot_trace::pool_calls::PoolCall;
use cachalot_trace::replay::{CallKind, ProgramCall, ReplayOptions, replay, verify_against_recording};
use cachalot_trace::snapshot::torch;

mod common;

const MIB: u64 = 1 << 20;

/// What each cycle does (as in `examples/replay_growth.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cycle {
    /// 24 MiB on the next of two streams, freed: the next malloc must release it.
    Churn,
    /// On one stream 64 MiB then 24 MiB, each freed, on a device that holds only one of them.
    Oversize,
    /// On the next of two streams, a request for the whole device, which fails, then 24 MiB,
    /// freed.
    Oom,
    /// 512 bytes kept, then on a new stream a request for the whole device, which fails
    /// (reserving address space for the stream, where the cache holds nothing to release), then
    /// 24 MiB kept.
    OomNewStream,
    /// On a device with 10 MiB to spare, in pages of 20 MiB: one stream holds a free page
    /// between two unmapped ones, between live pages, and another stream a free 40 MiB block;
    /// 60 MiB on the first stream grows the free page over both holes (two pieces), which the
    /// device refuses at the first, so the full release runs (unmapping both free blocks) and
    /// the retry maps the three pages at once. Then the layout is made again (three 20 MiB
    /// blocks there, the outer two freed and unmapped by `empty_cache`, then the middle one
    /// freed) and the other stream's 40 MiB allocated and freed.
    Pieces,
    /// In 20 MiB pages, with 30 MiB to spare: one stream holds, after a live page, a free page,
    /// an unmapped one, a free one, then unmapped pages; another stream a free 40 MiB block.
    /// 100 MiB on the first stream maps the hole (the first piece), the device refuses the
    /// second, so the full release unmaps the free block the hole joined and the other
    /// stream's, and the retry maps the 100 MiB at once. Then the layout is made again (three
    /// 20 MiB blocks there, the middle one freed and unmapped by `empty_cache` with what is left
    /// of the 100, the outer two freed) and the other stream's 40 MiB allocated and freed.
    PartlyMapped,
    /// Under `policy:cachalot` with a fraction of 70 MiB: 40 MiB on stream 1 (rule 4 gives back
    /// the top of stream 0's cached 60 MiB), freed; then 60 MiB on stream 0, whose miss gives
    /// back stream 1's 40 MiB and is still refused by the fraction (which counts its whole
    /// request, not the pages it maps), so its full release unmaps stream 0's free block too,
    /// and the retry maps the 60 MiB; freed.
    GiveBackRefused,
    /// Under `policy:cachalot,max_split_size_mb:20`, on one stream between two live 4 MiB blocks,
    /// 30 MiB (oversize) made and freed before the cycles; each cycle, after
    /// `reset_peak_memory_stats` (rule 7 would keep the pages from the second cycle on), 16 MiB (below
    /// `max_split_size`): best fit passes over the free 30 MiB, and the miss, at the peak,
    /// gives back the block's top 16 MiB (rule 4; the plan was to map them above the live
    /// block), then grows into the 14 MiB kept, mapping one page of those given back; freed.
    /// Then 30 MiB, which grows the block back over the pages given back (at the peak again),
    /// freed.
    GiveBackOpensRoom,
    /// As [`Cycle::GiveBackOpensRoom`], but each cycle's first request is 10 MiB, which the
    /// 14 MiB kept below the pages given back hold: the miss releases and maps nothing, so the
    /// release run is followed by the allocation itself (PyTorch's policy releases only on its
    /// way to a device allocation).
    GiveBackServesInPlace,
}

/// Frees left outstanding on a side stream whose work never ends by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    /// None.
    No,
    /// One small block, freed before the cycles: its free stays outstanding until a release
    /// synchronizes.
    Once,
    /// One small block freed so at the start of every cycle: each cycle's release finds one.
    EveryCycle,
}

/// Records `cycles` cycles after making `live` small blocks that stay, and replays the trace.
fn replay_shape(settings: &str, fraction: Option<f64>, device: u64, live: u64, cycle: Cycle, cycles: u64) -> usize {
    replay_shape_pending(settings, fraction, device, live, cycle, cycles, Pending::No)
}

/// [`replay_shape`], with frees left outstanding as `pending` says.
fn replay_shape_pending(
    settings: &str,
    fraction: Option<f64>,
    device: u64,
    live: u64,
    cycle: Cycle,
    cycles: u64,
    pending: Pending,
) -> usize {
    replay_shape_with(settings, fraction, device, live, cycle, cycles, pending, false)
}

/// [`replay_shape_pending`], with a private pool first, if `private_pool`: a `MemPool` that
/// serves one 2 MiB block (kept) inside `use_mem_pool`, then stays, unused, for the whole trace.
/// Its calls are replayed where the recording made them (which also tells the replay that the
/// program's calls are known).
#[allow(clippy::too_many_arguments, reason = "one flag per variation of the shapes")]
fn replay_shape_with(
    settings: &str,
    fraction: Option<f64>,
    device: u64,
    live: u64,
    cycle: Cycle,
    cycles: u64,
    pending: Pending,
    private_pool: bool,
) -> usize {
    let config = AllocatorConfig::parse(settings).unwrap();
    let mut allocator = CachingAllocator::new(SimBackend::new(device), config.clone()).unwrap();
    if let Some(fraction) = fraction {
        allocator.set_memory_fraction(fraction).unwrap();
    }
    allocator.record_history(true, usize::MAX, &[], false);
    let stream = |n: u64| StreamId(0x1000 + n * 0x10);
    let kept: Vec<_> = (0..live).map(|_| allocator.malloc(512, stream(0)).unwrap()).collect();
    // The pool calls, each with the number of entries recorded before it.
    let mut calls = Vec::new();
    let mut pooled = None;
    if private_pool {
        let pool = PoolId(0, 1);
        let at = |allocator: &CachingAllocator<SimBackend>| allocator.trace_len_total() as usize;
        calls.push((at(&allocator), PoolCall::Create(pool)));
        allocator.create_pool(pool).unwrap();
        calls.push((at(&allocator), PoolCall::Begin(pool, None)));
        allocator.begin_allocate_to_pool(pool, PoolFilter::AllStreams).unwrap();
        pooled = Some(allocator.malloc(2 * MIB, stream(0)).unwrap());
        calls.push((at(&allocator), PoolCall::End(pool)));
        allocator.end_allocate_to_pool(pool).unwrap();
    }
    let free_pending = |allocator: &mut CachingAllocator<SimBackend>| {
        let side = StreamId(0x900);
        let used = allocator.malloc(512, stream(0)).unwrap();
        allocator.backend_mut().hold_stream(side);
        allocator.record_stream(&used, side).unwrap();
        allocator.free(used).unwrap();
    };
    if pending == Pending::Once {
        free_pending(&mut allocator);
    }
    let mut kept_too = Vec::new();
    // Where `reset_peak_memory_stats` was called (the trace's length then).
    let mut resets = Vec::new();
    // The layout of [`Cycle::Pieces`]: on stream 0, live pages around a free one between two
    // unmapped holes; on stream 1, a free 40 MiB block.
    let pieces_layout = |allocator: &mut CachingAllocator<SimBackend>| {
        let [first, middle, last] = [0; 3].map(|_| allocator.malloc(20 * MIB, stream(0)).unwrap());
        allocator.free(first).unwrap();
        allocator.free(last).unwrap();
        allocator.empty_cache().unwrap();
        allocator.free(middle).unwrap();
        let other = allocator.malloc(40 * MIB, stream(1)).unwrap();
        allocator.free(other).unwrap();
    };
    // The layout of [`Cycle::PartlyMapped`], after a live page of stream 0.
    let partly_layout = |allocator: &mut CachingAllocator<SimBackend>| {
        let [below, hole, above] = [0; 3].map(|_| allocator.malloc(20 * MIB, stream(0)).unwrap());
        allocator.free(hole).unwrap();
        allocator.empty_cache().unwrap();
        allocator.free(below).unwrap();
        allocator.free(above).unwrap();
        let other = allocator.malloc(40 * MIB, stream(1)).unwrap();
        allocator.free(other).unwrap();
    };
    if matches!(cycle, Cycle::GiveBackOpensRoom | Cycle::GiveBackServesInPlace) {
        kept_too.push(allocator.malloc(4 * MIB, stream(0)).unwrap());
        let oversize = allocator.malloc(30 * MIB, stream(0)).unwrap();
        kept_too.push(allocator.malloc(4 * MIB, stream(0)).unwrap());
        allocator.free(oversize).unwrap();
    }
    if matches!(cycle, Cycle::PartlyMapped) {
        kept_too.push(allocator.malloc(20 * MIB, stream(0)).unwrap());
        partly_layout(&mut allocator);
    }
    if matches!(cycle, Cycle::Pieces) {
        // Live pages on both sides of the three.
        kept_too.push(allocator.malloc(20 * MIB, stream(0)).unwrap());
        let [first, middle, last] = [0; 3].map(|_| allocator.malloc(20 * MIB, stream(0)).unwrap());
        kept_too.push(allocator.malloc(20 * MIB, stream(0)).unwrap());
        for allocation in [first, middle, last] {
            allocator.free(allocation).unwrap();
        }
        // The three pages merged into one free block: cut it in three again.
        pieces_layout(&mut allocator);
    }
    for n in 0..cycles {
        if pending == Pending::EveryCycle {
            free_pending(&mut allocator);
        }
        match cycle {
            Cycle::Churn => {
                let tensor = allocator.malloc(24 * MIB, stream(n % 2)).unwrap();
                allocator.free(tensor).unwrap();
            }
            Cycle::Oversize => {
                for size in [64 * MIB, 24 * MIB] {
                    let tensor = allocator.malloc(size, stream(0)).unwrap();
                    allocator.free(tensor).unwrap();
                }
            }
            Cycle::Oom => {
                let failed = allocator.malloc(device, stream(n % 2));
                assert!(matches!(failed, Err(AllocatorError::OutOfMemory(_))));
                let tensor = allocator.malloc(24 * MIB, stream(n % 2)).unwrap();
                allocator.free(tensor).unwrap();
            }
            Cycle::GiveBackRefused => {
                for (size, on) in [(40 * MIB, 1), (60 * MIB, 0)] {
                    let tensor = allocator.malloc(size, stream(on)).unwrap();
                    allocator.free(tensor).unwrap();
                }
            }
            Cycle::GiveBackOpensRoom | Cycle::GiveBackServesInPlace => {
                // Without it, rule 7 would keep the pages from the second cycle on (peak
                // allocated is the cycle's own live memory after the reset, and its ceiling
                // below the peak), so that every cycle gives back as the first.
                resets.push(allocator.trace_len_total() as usize);
                allocator.reset_peak_stats();
                let first = if cycle == Cycle::GiveBackOpensRoom { 16 * MIB } else { 10 * MIB };
                for size in [first, 30 * MIB] {
                    let tensor = allocator.malloc(size, stream(0)).unwrap();
                    allocator.free(tensor).unwrap();
                }
            }
            Cycle::PartlyMapped => {
                let grown = allocator.malloc(100 * MIB, stream(0)).unwrap();
                allocator.free(grown).unwrap();
                partly_layout(&mut allocator);
            }
            Cycle::Pieces => {
                let grown = allocator.malloc(60 * MIB, stream(0)).unwrap();
                allocator.free(grown).unwrap();
                pieces_layout(&mut allocator);
            }
            Cycle::OomNewStream => {
                // An allocation between the free and the failure shows the free deferred.
                kept_too.push(allocator.malloc(512, stream(0)).unwrap());
                let failed = allocator.malloc(device, stream(n + 1));
                assert!(matches!(failed, Err(AllocatorError::OutOfMemory(_))));
                kept_too.push(allocator.malloc(24 * MIB, stream(n + 1)).unwrap());
            }
        }
    }
    assert_eq!(kept.len() as u64, live);
    let released = allocator.stats().num_device_free;
    if matches!(cycle, Cycle::OomNewStream) {
        assert_eq!(allocator.stats().num_ooms, cycles, "{settings}: the shape fails at every cycle");
    } else {
        assert!(
            released >= cycles / 2,
            "{settings}: the shape must release at (nearly) every cycle, released {released}"
        );
    }
    assert_eq!(pooled.is_some(), private_pool);
    let mut snapshot = torch::from_allocator(&allocator, None);
    // Each call follows a `snapshot` entry, as `capture_pools.py` records them.
    let mut program_calls = cachalot_trace::replay::record_pool_calls(&mut snapshot.device_traces[0], &calls);
    assert!(resets.is_empty() || calls.is_empty(), "one kind of program call per shape");
    for (n, before) in resets.iter().enumerate() {
        // As `record_pool_calls` records them: after a `snapshot` entry inserted there.
        let trace = &mut snapshot.device_traces[0];
        let at = before + n;
        let marker = cachalot_core::trace::TraceEntry {
            action: cachalot_core::trace::TraceAction::Snapshot,
            addr: 0,
            size: 0,
            stream: StreamId(0),
            time_us: trace.get(at.min(trace.len().saturating_sub(1))).map_or(0, |entry| entry.time_us),
            context: None,
            annotation: None,
        };
        trace.insert(at.min(trace.len()), marker);
        program_calls.push(ProgramCall { call: CallKind::ResetPeakMemoryStats, at });
    }
    let options = ReplayOptions {
        config,
        memory_fraction: fraction,
        device_total: device,
        device: 0,
        calls: (private_pool || !resets.is_empty()).then_some(program_calls),
        record_calls: false,
    };
    let outcome = replay(&snapshot, &options, |_, _| {}).unwrap();
    verify_against_recording(&snapshot, &outcome, None).unwrap_or_else(|e| panic!("{settings}, {cycle:?}: {e}"));
    // Every release is a malloc's, but for the `empty_cache` calls of each layout of pieces.
    let empty_caches = if matches!(cycle, Cycle::Pieces | Cycle::PartlyMapped) { cycles as usize + 1 } else { 0 };
    assert_eq!(outcome.empty_cache_points.len(), empty_caches, "{settings}: the releases of empty_cache");
    assert_eq!(outcome.allocator.private_pools().len(), usize::from(private_pool));
    outcome.trial_copies
}

#[test]
fn garbage_collection_at_every_malloc_copies_nothing() {
    // 64 MiB allowed, collected above 19.2 MiB: each malloc's collector releases the other
    // stream's cached segment.
    let fraction = Some((64 * MIB) as f64 / (80u64 << 30) as f64);
    assert_eq!(replay_shape("garbage_collection_threshold:0.3", fraction, 80 << 30, 300, Cycle::Churn, 60), 0);
}

#[test]
fn a_free_left_pending_on_another_stream_copies_nothing() {
    let fraction = Some((64 * MIB) as f64 / (80u64 << 30) as f64);
    let copies = replay_shape_pending(
        "garbage_collection_threshold:0.3",
        fraction,
        80 << 30,
        300,
        Cycle::Churn,
        60,
        Pending::Once,
    );
    assert_eq!(copies, 0);
}

/// The failure's synchronization completes a free whose completion the trace shows right before
/// the `oom` entry (the cache holds nothing to release, so no release run comes between): the
/// replay completes it, as the malloc's first step would, before asking what the failure
/// reserves.
#[test]
fn out_of_memory_errors_right_after_a_completed_free_copy_nothing() {
    let copies = replay_shape_pending(
        "expandable_segments:True",
        None,
        4 << 30,
        300,
        Cycle::OomNewStream,
        40,
        Pending::EveryCycle,
    );
    assert_eq!(copies, 0);
}

#[test]
fn a_tight_fraction_copies_nothing() {
    let fraction = Some((40 * MIB) as f64 / (80u64 << 30) as f64);
    assert_eq!(replay_shape("", fraction, 80 << 30, 300, Cycle::Churn, 60), 0);
}

#[test]
fn the_oversize_and_full_release_of_a_full_device_copy_nothing() {
    assert_eq!(replay_shape("max_split_size_mb:20", None, 89 * MIB, 300, Cycle::Oversize, 40), 0);
}

#[test]
fn out_of_memory_errors_with_expandable_segments_copy_nothing() {
    // Each failure makes a reservation for its stream that the next 24 MiB maps (the stream's
    // one before was released by the previous failure's full release): the replay must place
    // it where the recording did.
    assert_eq!(replay_shape("expandable_segments:True", None, 1 << 30, 300, Cycle::Oom, 40), 0);
}

/// `policy:cachalot` gives back, before a new peak, only what the peak would exceed, chosen among
/// the largest free blocks of any stream (`core/src/allocator/policy/cachalot.rs`, rule 4): the plan
/// takes the malloc's own walk, so these releases need no copy either.
#[test]
fn policy_cachalot_with_pages_copies_nothing() {
    assert_eq!(replay_shape("policy:cachalot,expandable_segments:True", None, 80 << 30, 300, Cycle::Churn, 60), 0);
}

/// Out-of-memory errors with expandable segments while a private pool exists (not routed to):
/// the failure's full release also empties the pools every user released (none here), and the
/// reservations it makes are read off the state as for the default pools alone.
#[test]
fn out_of_memory_errors_beside_a_private_pool_copy_nothing() {
    let copies = replay_shape_with("expandable_segments:True", None, 1 << 30, 300, Cycle::Oom, 40, Pending::No, true);
    assert_eq!(copies, 0);
}

/// A malloc whose pages would be mapped in two pieces, which the device refuses at the first:
/// its full release is planned (it needs no copy to see that the first piece does not fit).
#[test]
fn pages_mapped_in_pieces_copy_nothing() {
    // 10 MiB to spare beside the five pages of stream 0, stream 1's two and the live blocks' one
    // 2 MiB page.
    let copies = replay_shape("expandable_segments:True", None, (2 + 5 * 20 + 10) * MIB, 300, Cycle::Pieces, 40);
    assert_eq!(copies, 0);
}

/// A malloc that maps the first piece of its pages, is refused the second, and then releases the
/// cache: the pages it mapped join a free block, which its full release unmaps (planned, with
/// no copy).
#[test]
fn pages_left_mapped_by_a_refused_allocation_copy_nothing() {
    // 30 MiB to spare beside the live blocks' 2 MiB page, stream 0's three pages and stream 1's
    // two.
    let device = (2 + 3 * 20 + 40 + 30) * MIB;
    assert_eq!(replay_shape("expandable_segments:True", None, device, 300, Cycle::PartlyMapped, 40), 0);
}

/// A `policy:cachalot` miss that gives cached memory back and is still refused (by the fraction),
/// then releases the cache: what the give-backs leave is read off the state, with no copy.
#[test]
fn a_give_back_then_a_refusal_copies_nothing() {
    let fraction = Some((70 * MIB) as f64 / (80u64 << 30) as f64);
    let settings = "policy:cachalot,expandable_segments:True";
    assert_eq!(replay_shape(settings, fraction, 80 << 30, 300, Cycle::GiveBackRefused, 40), 0);
}

/// A `policy:cachalot` miss under `max_split_size_mb` that gives back pages of a free block of its
/// own stream large enough for it (passed over by best fit, which keeps oversize blocks from
/// smaller requests), then grows into what is left of that block rather than where it planned
/// to: the plan searches the blocks its give-backs leave, with no copy.
#[test]
fn a_give_back_that_opens_room_copies_nothing() {
    let settings = "policy:cachalot,max_split_size_mb:20,expandable_segments:True";
    assert_eq!(replay_shape(settings, None, 80 << 30, 300, Cycle::GiveBackOpensRoom, 40), 0);
}

/// [`Cycle::GiveBackServesInPlace`]: the give-back's release run is followed by the allocation
/// it made room for, not by a map; the replay reads it as the malloc's (not as an
/// `empty_cache` call, which would unmap the whole free block) and matches the recording.
#[test]
fn a_give_back_followed_by_its_allocation_is_the_malloc_s() {
    let settings = "policy:cachalot,max_split_size_mb:20,expandable_segments:True";
    assert_eq!(replay_shape(settings, None, 80 << 30, 300, Cycle::GiveBackServesInPlace, 40), 0);
}

/// No trace recorded from PyTorch needs a trial copy: the nine reference traces, the conformance
/// traces and the pool traces, replayed with the program's calls where their `expected.json`
/// lists them and without (the mode that infers `empty_cache`, where the plan decides).
#[test]
fn no_recorded_trace_needs_a_copy() {
    let testdata = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/conformance");
    let mut traces = common::reference_traces();
    for dir in [testdata.clone(), testdata.join("pools")] {
        traces.extend(common::pickles_in(&dir));
    }
    assert!(traces.len() >= 9 + 7 + 8, "{} traces", traces.len());
    for path in traces {
        let (snapshot, expected) = common::load(&path);
        let with_calls = ReplayOptions::for_snapshot(&snapshot, Some(&expected)).unwrap();
        let without_calls = ReplayOptions { calls: None, ..with_calls.clone() };
        for options in [with_calls, without_calls] {
            let calls = options.calls.is_some();
            let outcome = replay(&snapshot, &options, |_, _| {}).unwrap();
            assert_eq!(outcome.trial_copies, 0, "{} (calls: {calls})", path.display());
        }
    }
}
