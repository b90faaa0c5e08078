//! cachalot's own policy (`policy:cachalot`, `docs/allocator-rules.md` §24) on every reference
//! trace: its peak reserved is never above PyTorch's own (the recorded run) and never above the
//! best setting PyTorch has (found by `tune`) but where the policy keeps memory for the job's
//! next steps (rule 7, up to 1.15× peak allocated), it raises no OOM the recorded run did not,
//! its end state is consistent and its stats add up. PyTorch's policy stays exact
//! (`pytorch_conformance.rs`).

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use cachalot_trace::ops::OpFile;
use cachalot_trace::replay::{ReplayOptions, replay};
use cachalot_trace::tune::{Candidate, OWN_POLICY, Objective, own_policy_settings, tune, tune_pytorch_settings};

mod common;
use common::{load, reference_traces as traces};

/// The most rule 7's ceiling rises to (1.15× peak allocated, the policy's goal, for a job
/// whose layout fits it) for a job whose layout does not fit the goal.
const CAP: f64 = 1.5;

/// The op files of `testdata/bench-ops` (the bench's workloads), by name without `.ops`, in
/// name order.
fn bench_op_files() -> Vec<(String, OpFile)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/bench-ops");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "ops"))
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            (name, OpFile::parse(&std::fs::read_to_string(path).unwrap()).unwrap())
        })
        .collect()
}

/// `tune` replays cachalot's own policy beside the search without changing the search;
/// `tune_pytorch_settings` is the search alone, and `with_own_policy` adds the same replay.
#[test]
fn tune_sets_the_own_policy_beside_the_search_of_pytorch_s_settings() {
    let path = traces().into_iter().find(|p| p.ends_with("multistream.pickle")).unwrap();
    let (snapshot, expected) = load(&path);
    let options = ReplayOptions::for_snapshot(&snapshot, Some(&expected)).unwrap();
    let both = tune(&snapshot, &options, Objective::PeakReserved).unwrap();
    let alone = tune_pytorch_settings(&snapshot, &options, Objective::PeakReserved).unwrap();
    assert!(alone.own_policy.is_none() && alone.own_policy_error.is_none());
    let outcome = |c: &Candidate| (c.settings.clone(), c.peak_reserved, c.peak_allocated, c.ooms, c.device_calls());
    assert_eq!(
        both.ranked.iter().map(outcome).collect::<Vec<_>>(),
        alone.ranked.iter().map(outcome).collect::<Vec<_>>()
    );
    let own = both.own_policy.as_ref().unwrap_or_else(|| panic!("{:?}", both.own_policy_error));
    assert_eq!(own.settings, OWN_POLICY);
    let added = alone.with_own_policy(&snapshot, &options).unwrap().own_policy.unwrap();
    assert_eq!(outcome(own), outcome(&added));
}

/// A single run keeps at most PyTorch's own peak (within 1%), and at most the best setting
/// PyTorch has unless it keeps memory for the next steps (rule 7), below its cap: gpt_train's steps settle
/// at 1.185× peak allocated and 62 device calls instead of 1.030× and 177 (before rule 7
/// applied within a run), 1.12× PyTorch's best setting and 0.95× its defaults.
#[test]
fn fragments_less_than_pytorch_s_defaults_on_every_reference_trace() {
    for path in traces() {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let (snapshot, expected) = load(&path);
        let options = ReplayOptions::for_snapshot(&snapshot, Some(&expected)).unwrap();

        let tuning = tune(&snapshot, &options, Objective::PeakReserved).unwrap();
        let own = tuning.own_policy.clone().unwrap_or_else(|| panic!("{name}: {:?}", tuning.own_policy_error));
        let best = tuning.winner();
        // The figures behind BENCHMARKS.md §3, shown with `--nocapture`.
        println!(
            "{name}: policy:cachalot {} B ({:.3}x peak allocated, {} device calls, {} OOMs, {}); PyTorch's best {} B ({})",
            own.peak_reserved,
            own.reserved_per_allocated(),
            own.device_calls(),
            own.ooms,
            own.settings,
            best.peak_reserved,
            best.settings
        );
        assert_eq!(own.settings, own_policy_settings(options.config.settings()));
        assert!(own.fits(), "{name}: {:?}", own.first_new_oom);
        // gpt_train_expandable: 1.007x its run under expandable segments (1.177x peak allocated,
        // where PyTorch's defaults take 1.245x), the price of settling at 1.185x.
        let recorded = expected.memory_stats["reserved_bytes.all.peak"] as f64;
        assert!(
            own.peak_reserved as f64 <= 1.01 * recorded,
            "{name}: {} B, PyTorch's own run {recorded} B",
            own.peak_reserved
        );
        // Above PyTorch's best setting only by what rule 7 keeps for the next steps.
        assert!(
            own.peak_reserved <= best.peak_reserved || own.peak_reserved as f64 <= CAP * own.peak_allocated as f64,
            "{name}: {} B under policy:cachalot, {} B with PyTorch's best ({})",
            own.peak_reserved,
            best.peak_reserved,
            best.settings
        );
        if own.peak_reserved > best.peak_reserved {
            println!("{name}: {:.3}x PyTorch's best", own.peak_reserved as f64 / best.peak_reserved as f64);
        }
        // Never below what the live blocks need at their peak.
        assert!(own.peak_reserved >= own.peak_allocated, "{name}");

        // The replay behind the figures: consistent, and its stats describe its own state.
        let config = cachalot_core::AllocatorConfig::parse(&own.settings).unwrap();
        let outcome = replay(&snapshot, &ReplayOptions { config, ..options.clone() }, |_, _| {}).unwrap();
        outcome.allocator.check_consistency().unwrap();
        let stats = outcome.allocator.stats();
        let segments = outcome.allocator.snapshot();
        let reserved: u64 = segments.iter().map(|s| s.total_size).sum();
        assert_eq!(outcome.allocator.memory_reserved(), reserved, "{name}: reserved is what the segments hold");
        assert_eq!(stats.max_memory_reserved(), own.peak_reserved, "{name}");
        let summary = outcome.allocator.memory_summary(false);
        assert!(summary.contains("PyTorch CUDA memory summary"), "{name}: {summary}");
    }
}

/// The lowest peak reserved of a PyTorch setting under which each op file, replayed 8 times,
/// settles (no device call from its second replay; BENCHMARKS.md §3, "A job that repeats"):
/// what a job that repeats gets from PyTorch's policy without moving memory on every repeat.
const PYTORCH_SETTLING_PEAK: [(&str, u64); 9] = [
    ("trace-gpt_train", 1_440_743_424),
    ("trace-gpt_train_expandable", 1_440_743_424),
    ("trace-convnet_train", 218_103_808),
    ("trace-convnet_train_gc", 281_018_368),
    ("trace-random_stress_maxsplit", 3_909_091_328),
    ("trace-kvcache_infer", 92_274_688),
    ("trace-multistream", 58_720_256),
    ("trace-oom_probe_fraction", 3_162_505_216),
    ("trace-seeds", 1_153_433_600),
];

/// A job replayed again (the bench's method: every op file of `testdata/bench-ops` eight times
/// on one allocator, live blocks freed between replays) keeps its peak within rule 7's cap and
/// near the lowest peak of a PyTorch setting that settles on it (on the op files of reference
/// traces: a synthetic file of one 1 MiB block holds a whole 2 MiB page), and stops moving
/// pages: at the peak a miss gives back only what it needs (rule 4), a large request takes the
/// small pool's free pages (rule 5) and a small one grows the small pool (rule 6), and once a
/// miss gave back at the peak, later misses keep the cache up to 1.15× peak allocated plus
/// what they still had to give back (rule 7). Every reference trace's op file makes no device
/// call from its fourth replay (random_stress_maxsplit moved 4–10 calls' worth a repeat when
/// rule 7 applied only across repeats at a fixed 1.15×). The price: gpt_train settles at
/// 1.286× peak allocated, 1.093× PyTorch's settling peak, convnet_train_gc at 1.194×, 1.022×;
/// the others stay within both. The calls per replay are printed with `--nocapture`
/// (BENCHMARKS.md §3).
#[test]
fn a_replayed_job_keeps_its_peak_and_settles() {
    use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend};
    use cachalot_trace::replay::DEFAULT_DEVICE_TOTAL;

    for (name, ops) in bench_op_files() {
        let config = AllocatorConfig::parse("policy:cachalot").unwrap();
        let mut allocator = CachingAllocator::new(SimBackend::new(DEFAULT_DEVICE_TOTAL), config).unwrap();
        let mut handles = vec![None; ops.handles];
        let mut calls = Vec::new();
        for _ in 0..8 {
            let before = allocator.stats().num_device_alloc + allocator.stats().num_device_free;
            ops.replay(&mut allocator, &mut handles, true).unwrap();
            OpFile::free_live(&mut allocator, &mut handles).unwrap();
            calls.push(allocator.stats().num_device_alloc + allocator.stats().num_device_free - before);
        }
        allocator.check_consistency().unwrap();
        let stats = allocator.stats();
        let peak = stats.max_memory_reserved();
        let ratio = peak as f64 / stats.max_memory_allocated() as f64;
        println!("{name}: device calls per replay {calls:?}, peak reserved {peak} B, {ratio:.3}x peak allocated");
        if name.starts_with("trace-") {
            assert!(ratio <= CAP, "{name}: {ratio:.3}x after eight replays");
            assert_eq!(calls[3..], [0; 5], "{name}: {calls:?}");
        }
        if let Some(&(_, settling)) = PYTORCH_SETTLING_PEAK.iter().find(|(file, _)| *file == name) {
            let over = match name.as_str() {
                "trace-gpt_train" | "trace-gpt_train_expandable" => 1.10,
                "trace-convnet_train_gc" => 1.03,
                _ => 1.0,
            };
            assert!(
                peak as f64 <= over * settling as f64,
                "{name}: {peak} B after eight replays, PyTorch settles at {settling} B"
            );
        }
        // Their two pools peak at different times: at the peak a large request takes the small
        // pool's free pages (rule 5) and a small one grows the small pool (rule 6), instead of
        // moving a page between the pools on every repeat.
        if name == "trace-kvcache_infer" || name == "trace-multistream" {
            assert_eq!(calls[1..], [0; 7], "{name}: {calls:?}");
        }
    }
}

/// The replay's plan of a malloc (`releases_of_malloc`, `core/src/allocator/chain/plan.rs`)
/// predicts every malloc of a repeated job exactly: rule 7's state (live memory falling to 0,
/// the sizes that met the peak) decides both the give-backs and, for a recurring miss, the run
/// it maps (the one with the fewest pages to map), and the plan reads the same state. Every op file of a reference
/// trace, eight replays on one allocator as above, on a device with room to spare and on one
/// of 1.06x the job's peak allocated, where misses at rule 7's ceiling are refused and go
/// down the retry chain, so that the run a miss maps decides what it releases.
#[test]
fn the_plan_predicts_every_malloc_of_a_repeated_job() {
    use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
    use cachalot_trace::ops::Op;
    use cachalot_trace::replay::DEFAULT_DEVICE_TOTAL;

    for (name, ops) in bench_op_files().into_iter().filter(|(name, _)| name.starts_with("trace-")) {
        let config = AllocatorConfig::parse("policy:cachalot").unwrap();
        let mut roomy = CachingAllocator::new(SimBackend::new(DEFAULT_DEVICE_TOTAL), config.clone()).unwrap();
        let mut handles = vec![None; ops.handles];
        ops.replay(&mut roomy, &mut handles, true).unwrap();
        OpFile::free_live(&mut roomy, &mut handles).unwrap();
        let tight = roomy.stats().max_memory_allocated() / 100 * 106;
        for total in [DEFAULT_DEVICE_TOTAL, tight] {
            let mut allocator = CachingAllocator::new(SimBackend::new(total), config.clone()).unwrap();
            let mut handles = vec![None; ops.handles];
            let mut refused = 0;
            for replay in 0..8 {
                for (n, op) in ops.ops.iter().enumerate() {
                    match *op {
                        Op::Alloc { id, size, .. } => {
                            let device_free = total - allocator.backend().used();
                            let planned = allocator.releases_of_malloc(size, StreamId::DEFAULT, device_free);
                            let in_place =
                                allocator.releases_of_malloc_served_in_place(size, StreamId::DEFAULT, device_free);
                            let (frees, maps) = (allocator.stats().num_device_free, allocator.stats().num_device_alloc);
                            let retries = allocator.stats().num_alloc_retries;
                            let result = allocator.malloc(size, StreamId::DEFAULT);
                            let released = allocator.stats().num_device_free - frees;
                            let at = format!("{name} on {total} B: replay {replay}, op {n}");
                            if let Some(planned) = planned {
                                assert_eq!(planned, released, "{at} released");
                            }
                            if let Some(planned) = in_place {
                                assert!(result.is_ok() && allocator.stats().num_device_alloc == maps, "{at}");
                                assert_eq!(planned, released, "{at} released in place");
                            }
                            refused += usize::from(allocator.stats().num_alloc_retries > retries);
                            handles[id as usize] = result.ok();
                        }
                        Op::Free { id } => {
                            if let Some(allocation) = handles[id as usize].take() {
                                allocator.free(allocation).unwrap();
                            }
                        }
                    }
                }
                OpFile::free_live(&mut allocator, &mut handles).unwrap();
            }
            allocator.check_consistency().unwrap();
            println!("{name} on {total} B: {refused} mallocs went down the retry chain");
        }
    }
}
