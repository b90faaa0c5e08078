//! `explain` on traces made for each cause (recorded by the allocator on the simulator, as a
//! PyTorch job's would be) and on the reference traces that run out of memory: the main cause
//! it names, the numbers against what the replay shows, and the fix it proposes replayed again
//! here to see the job through.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::path::PathBuf;

use cachalot_core::{AllocatorConfig, CachingAllocator, PoolFilter, PoolId, SimBackend, StreamId};
use cachalot_trace::explain::fix::{lets_job_through, rehearse};
use cachalot_trace::explain::{At, Cause, Change, ClassBytes, ExplainOptions, Explanation, explain};
use cachalot_trace::pool_calls::PoolCall;
use cachalot_trace::replay::{ReplayOptions, record_pool_calls, replay};
use cachalot_trace::snapshot::torch::{self, TorchSnapshot};

mod common;

const MIB: u64 = 1 << 20;
const DEVICE: u64 = 100 * MIB;

/// A job recorded on a simulated device of `device` bytes under `settings` (and a memory
/// fraction): `job` makes its calls, and lists the pool calls it made with the trace's length
/// then.
fn recorded(
    device: u64,
    settings: &str,
    fraction: Option<f64>,
    job: impl FnOnce(&mut CachingAllocator<SimBackend>, &mut Vec<(usize, PoolCall)>),
) -> (TorchSnapshot, ReplayOptions) {
    let mut allocator =
        CachingAllocator::new(SimBackend::new(device), AllocatorConfig::parse(settings).unwrap()).unwrap();
    if let Some(fraction) = fraction {
        allocator.set_memory_fraction(fraction).unwrap();
    }
    allocator.record_history(true, usize::MAX, &[], false);
    let mut pool_calls = Vec::new();
    job(&mut allocator, &mut pool_calls);
    let mut snapshot = torch::from_allocator(&allocator, None);
    let calls = record_pool_calls(&mut snapshot.device_traces[0], &pool_calls);
    let mut options = ReplayOptions::for_snapshot(&snapshot, None).unwrap();
    options.device_total = device;
    options.memory_fraction = fraction;
    if !calls.is_empty() {
        options.calls = Some(calls);
    }
    (snapshot, options)
}

const S1: StreamId = StreamId(0x100);
const S2: StreamId = StreamId(0x200);

/// Five 20 MiB segments on `S1`, each with an 8 MiB block live and 12 MiB free after it.
fn fragmented(allocator: &mut CachingAllocator<SimBackend>) {
    let mut freed = Vec::new();
    for _ in 0..5 {
        let _live = allocator.malloc(8 * MIB, S1).unwrap();
        freed.push(allocator.malloc(8 * MIB, S1).unwrap());
    }
    for block in freed {
        allocator.free(block).unwrap();
    }
}

/// Explains the first OOM, checks the numbers against the replay, and replays the job again
/// under the proposed fix to see it through.
fn explained(snapshot: &TorchSnapshot, options: &ReplayOptions) -> Explanation {
    let x = explain(snapshot, options, &ExplainOptions::default()).unwrap();
    let outcome = replay(snapshot, options, |_, _| {}).unwrap();
    assert!(x.failed && x.matches_recording, "{x:#?}");
    let oom = outcome.ooms.first().unwrap();
    assert_eq!(oom.index, x.entry, "the replay's first error is the one explained");
    assert_eq!(x.message.as_deref(), Some(oom.message.as_str()), "PyTorch's message, as the replay words it");
    proven(snapshot, options, &x);
    x
}

/// Replays the job again under the fix `x` proposes, to see it through, and under its own
/// settings, to see it fail.
fn proven(snapshot: &TorchSnapshot, options: &ReplayOptions, x: &Explanation) {
    if let Some(fix) = x.fix.as_ref().and_then(|s| s.fix.as_ref()) {
        let outcome = rehearse(snapshot, options, x, &fix.change).unwrap();
        assert!(lets_job_through(&outcome, x.entry), "{:?}: {:?}", fix.change, outcome.ooms);
        assert_eq!(outcome.allocator.stats().max_memory_reserved(), fix.peak_reserved);
        // The job's own settings, replayed the same way, fail there.
        let own = Change::Settings { settings: options.config.settings().to_owned() };
        let outcome = rehearse(snapshot, options, x, &own).unwrap();
        assert!(!lets_job_through(&outcome, x.entry), "{:?}", outcome.ooms);
    }
}

fn main_cause(x: &Explanation) -> Cause {
    x.main_cause.unwrap()
}

#[test]
fn free_blocks_smaller_than_the_request() {
    let (snapshot, options) = recorded(DEVICE, "", None, |a, _| {
        fragmented(a);
        assert!(a.malloc(16 * MIB, S1).is_err());
    });
    let x = explained(&snapshot, &options);
    assert_eq!(main_cause(&x), Cause::TooSmall, "{x:#?}");
    let too_small = &x.after_retry[0];
    assert_eq!((too_small.bytes, too_small.blocks, too_small.largest_block), (60 * MIB, 5, 12 * MIB));
    assert_eq!((x.memory.allocated, x.memory.reserved_after, x.request.segment_size), (40 * MIB, DEVICE, 16 * MIB));
    let fix = x.fix.unwrap().fix.unwrap();
    assert_eq!(fix.keys_changed, 1, "{fix:?}");
}

#[test]
fn free_blocks_on_another_stream() {
    let (snapshot, options) = recorded(DEVICE, "", None, |a, _| {
        fragmented(a);
        assert!(a.malloc(10 * MIB, S2).is_err());
    });
    let x = explained(&snapshot, &options);
    assert_eq!(main_cause(&x), Cause::OtherStream, "{x:#?}");
    assert_eq!(x.after_retry[0].bytes, 60 * MIB);
    // Pages let the full release unmap the other stream's free bytes.
    let fix = x.fix.unwrap().fix.unwrap();
    assert_eq!(fix.change, Change::Settings { settings: "expandable_segments:True".into() });
}

#[test]
fn small_pool_blocks_for_a_large_request() {
    let (snapshot, options) = recorded(DEVICE, "", None, |a, _| {
        // 50 small segments of 2 MiB, each with one 512 KiB block live.
        let mut freed = Vec::new();
        for n in 0..200 {
            let block = a.malloc(512 << 10, S1).unwrap();
            if n % 4 != 0 {
                freed.push(block);
            }
        }
        for block in freed {
            a.free(block).unwrap();
        }
        assert!(a.malloc(30 * MIB, S1).is_err());
    });
    let x = explained(&snapshot, &options);
    assert_eq!(main_cause(&x), Cause::OtherPool, "{x:#?}");
    assert_eq!((x.after_retry[0].bytes, x.after_retry[0].blocks), (75 * MIB, 50));
    // Every 2 MiB page holds a live block: no setting gives them back, and the search says so.
    let search = x.fix.unwrap();
    assert!(search.fix.is_none() && search.own_settings_fail && search.replays > 10, "{search:?}");
}

#[test]
fn blocks_in_a_private_pool() {
    let pool = PoolId(0, 1);
    let (snapshot, options) = recorded(DEVICE, "", None, |a, calls| {
        let at = |a: &CachingAllocator<SimBackend>| a.trace_len_total() as usize;
        calls.push((at(a), PoolCall::Create(pool)));
        a.create_pool(pool).unwrap();
        calls.push((at(a), PoolCall::Begin(pool, None)));
        a.begin_allocate_to_pool(pool, PoolFilter::AllStreams).unwrap();
        let blocks: Vec<_> = (0..4).map(|_| a.malloc(20 * MIB, S1).unwrap()).collect();
        calls.push((at(a), PoolCall::End(pool)));
        a.end_allocate_to_pool(pool).unwrap();
        for block in blocks {
            a.free(block).unwrap();
        }
        assert!(a.malloc(30 * MIB, S1).is_err());
    });
    let x = explained(&snapshot, &options);
    assert_eq!(main_cause(&x), Cause::PrivatePool, "{x:#?}");
    assert_eq!(x.after_retry[0].bytes, 80 * MIB);
    // A pool still in use keeps its segments whatever the settings: releasing it is the program's.
    let search = x.fix.unwrap();
    assert!(search.fix.is_none() && search.own_settings_fail, "{search:?}");
}

#[test]
fn the_memory_fractions_cap() {
    let device = 1 << 30;
    let (snapshot, options) = recorded(device, "", Some(0.1), |a, _| {
        let _live: Vec<_> = (0..9).map(|_| a.malloc(10 * MIB, S1).unwrap()).collect();
        assert!(a.malloc(20 * MIB, S1).is_err());
    });
    let x = explained(&snapshot, &options);
    assert_eq!(main_cause(&x), Cause::FractionCap, "{x:#?}");
    let fix = x.fix.unwrap().fix.unwrap();
    let Change::MemoryFraction { fraction } = fix.change else { panic!("{fix:?}") };
    assert!(fraction > 0.1 && fraction * device as f64 >= (110 * MIB) as f64, "{fraction}");
}

#[test]
fn live_memory_beyond_the_device_has_no_setting_to_fix_it() {
    let (snapshot, options) = recorded(DEVICE, "", None, |a, _| {
        let _live: Vec<_> = (0..9).map(|_| a.malloc(10 * MIB, S1).unwrap()).collect();
        assert!(a.malloc(20 * MIB, S1).is_err());
    });
    let x = explained(&snapshot, &options);
    assert_eq!(main_cause(&x), Cause::LiveExceedsDevice, "{x:#?}");
    assert!(x.fix.is_none(), "no search: live bytes alone are more than the device holds");
    assert_eq!(x.live_stacks.iter().map(|s| s.bytes).sum::<u64>(), 90 * MIB);
}

/// A free pending on another stream (`record_stream`) when the request came: the full release
/// completes it, but its retry asks the device for a new segment and never searches the free
/// blocks again, so the block that would have served the request stays unused. The fix search
/// leaves that free pending too (only the failing malloc's synchronization completed it), so
/// the job's own settings fail there, and a change that lets the job through is proven.
#[test]
fn a_free_pending_on_another_stream() {
    let (snapshot, options) = recorded(DEVICE, "", None, |a, _| {
        fragmented(a);
        let used_elsewhere = a.malloc(12 * MIB, S1).unwrap();
        a.backend_mut().hold_stream(S2);
        a.record_stream(&used_elsewhere, S2).unwrap();
        a.free(used_elsewhere).unwrap();
        let _rest: Vec<_> = (0..4).map(|_| a.malloc(12 * MIB, S1).unwrap()).collect();
        assert!(a.malloc(12 * MIB, S1).is_err());
    });
    // The whole replay reads the completion recorded before the error as done before the
    // malloc, and serves the request: the stopped replay shows the error.
    let x = explain(&snapshot, &options, &ExplainOptions::default()).unwrap();
    assert!(x.failed && x.matches_recording, "{x:#?}");
    proven(&snapshot, &options, &x);
    assert_eq!(main_cause(&x), Cause::PendingStreamFree, "{x:#?}");
    assert_eq!(x.retry.completed_frees, 1);
    assert!(x.when_asked.iter().any(|c| c.cause == Cause::PendingStreamFree && c.bytes == 12 * MIB), "{x:#?}");
    let search = x.fix.unwrap();
    assert!(search.own_settings_fail, "{search:?}");
    let fix = search.fix.as_ref().unwrap();
    assert_eq!(fix.keys_changed, 1, "{fix:?}");
    // empty_cache() before the request synchronizes first: the completed free's block serves it.
    let empty_cache = Change::EmptyCacheBefore { entry: x.entry };
    assert!(fix.change == empty_cache || search.alternatives.iter().any(|f| f.change == empty_cache), "{search:?}");
}

/// Oversize blocks never stand in the way at the end of PyTorch 2.11's retry chain: a request
/// the oversize rules keep from the cached 100 MiB blocks is served once the chain releases one
/// (`release_available_cached_blocks`), though the device had no room when it came. `explain`
/// at that request shows them among the classes when it came, and the release.
#[test]
fn oversize_blocks_are_released_before_they_could_cause_an_error() {
    let device = 512 * MIB;
    let (snapshot, options) = recorded(device, "max_split_size_mb:64", None, |a, _| {
        let freed: Vec<_> = (0..3).map(|_| a.malloc(100 * MIB, S1).unwrap()).collect();
        for block in freed {
            a.free(block).unwrap();
        }
        let _rest = a.malloc(200 * MIB, S2).unwrap();
        let _served = a.malloc(30 * MIB, S1).unwrap();
    });
    let last = snapshot.device_traces[0].len() - 1;
    let how = ExplainOptions { at: At::Entry(last), ..ExplainOptions::default() };
    let x = explain(&snapshot, &options, &how).unwrap();
    assert!(!x.failed && x.matches_recording && x.main_cause.is_none(), "{x:#?}");
    let oversize = x.when_asked.iter().find(|c| c.cause == Cause::Oversize).unwrap();
    assert_eq!((oversize.bytes, oversize.blocks), (300 * MIB, 3), "{x:#?}");
    assert_eq!((x.retry.released_segments, x.retry.released_bytes), (1, 100 * MIB), "{x:#?}");
    assert!(x.memory.reserved + 30 * MIB > device, "no room for the request's segment when it came");
}

#[test]
fn the_peak_and_an_entry_are_explained_as_served() {
    let (snapshot, options) = recorded(DEVICE, "", None, |a, _| {
        fragmented(a);
        let _served = a.malloc(12 * MIB, S1).unwrap();
    });
    let how = |at| ExplainOptions { at, ..ExplainOptions::default() };
    // The tenth 8 MiB block makes the peak: 80 MiB live.
    let peak = explain(&snapshot, &options, &how(At::Peak)).unwrap();
    assert!(!peak.failed && peak.matches_recording && peak.main_cause.is_none() && peak.fix.is_none());
    assert_eq!((peak.request.size, peak.memory.allocated, peak.request.segment_size), (8 * MIB, 72 * MIB, 0));
    let entry = explain(&snapshot, &options, &how(At::Entry(peak.entry))).unwrap();
    assert_eq!(entry, Explanation { at: "entry", ..peak });
    // The last request is served from a free 12 MiB block, the others ruled out.
    let last = snapshot.device_traces[0].len() - 1;
    let served = explain(&snapshot, &options, &how(At::Entry(last))).unwrap();
    assert!(!served.failed && served.matches_recording && served.request.segment_size == 0, "{served:#?}");
    assert_eq!(served.when_asked, [ClassBytes { cause: Cause::TooSmall, bytes: 0, blocks: 0, largest_block: 0 }; 0]);
    assert!(explain(&snapshot, &options, &ExplainOptions::default()).is_err(), "no OOM to explain");
    assert!(explain(&snapshot, &options, &how(At::Entry(last + 1))).is_err());
}

fn reference(dir: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata").join(dir).join(format!("{name}.pickle"))
}

/// The reference traces that run out of memory, each explained at its first error, which the
/// replay raises at the same entry with the same message.
#[test]
fn the_reference_ooms_are_explained() {
    let cases = [
        (reference("traces/pytorch-2.11-h200", "oom_probe_fraction"), Cause::FractionCap),
        (reference("conformance", "c3_00123"), Cause::FractionCap),
        (reference("conformance", "c4_00319"), Cause::FractionCap),
        (reference("conformance", "c4_00054"), Cause::LiveExceedsDevice),
        (reference("conformance", "c2_00443"), Cause::LiveExceedsDevice),
        (reference("conformance", "c1_00012"), Cause::LiveExceedsDevice),
    ];
    for (path, cause) in cases {
        let (snapshot, expected) = common::load(&path);
        let options = ReplayOptions::for_snapshot(&snapshot, Some(&expected)).unwrap();
        let x = explained(&snapshot, &options);
        assert_eq!(main_cause(&x), cause, "{}: {x:#?}", path.display());
        if cause == Cause::FractionCap {
            assert!(x.fix.as_ref().unwrap().fix.is_some(), "{}: a larger fraction lets it through", path.display());
        }
    }
}

/// `convnet_train_gc` runs under a tight fraction and its collector without an error: its peak
/// is explained as served, with the collector's work shown.
#[test]
fn a_reference_peak_is_explained() {
    let (snapshot, expected) = common::load(&reference("traces/pytorch-2.11-h200", "convnet_train_gc"));
    let options = ReplayOptions::for_snapshot(&snapshot, Some(&expected)).unwrap();
    let x = explain(&snapshot, &options, &ExplainOptions { at: At::Peak, ..ExplainOptions::default() }).unwrap();
    assert!(!x.failed && x.matches_recording, "{x:#?}");
    assert!(x.memory.allowed.is_some() && x.retry.garbage_collection);
}
