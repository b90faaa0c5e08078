//! Whether repeated jobs settle: every op file of `testdata/bench-ops` replayed N times on one
//! allocator (live blocks freed between replays, as `cachalot bench` does), with the device
//! calls of each replay, the peak reserved after the first and after the last replay (and its
//! ratio to peak allocated), and whether the file settled (no device call from the fourth
//! replay) within the policy's goal (1.15× peak allocated) and at most at the lowest peak of a
//! PyTorch setting that settles on it (BENCHMARKS.md §3).
//!
//! `cargo run --release -p cachalot-trace --example settle -- [N [SETTINGS [FILTER]]]`
//!
//! N defaults to 8, SETTINGS to `policy:cachalot`; FILTER keeps the files whose name contains it.

use std::process::ExitCode;

use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend};
use cachalot_trace::ops::OpFile;
use cachalot_trace::replay::DEFAULT_DEVICE_TOTAL;

/// The lowest peak reserved of a PyTorch setting under which each op file, replayed 8 times,
/// settles (BENCHMARKS.md §3, "A job that repeats").
const PYTORCH_SETTLING_PEAK: [(&str, u64); 10] = [
    ("random-512B-64MiB", 2_472_542_208),
    ("trace-convnet_train", 218_103_808),
    ("trace-convnet_train_gc", 281_018_368),
    ("trace-gpt_train", 1_440_743_424),
    ("trace-gpt_train_expandable", 1_440_743_424),
    ("trace-kvcache_infer", 92_274_688),
    ("trace-multistream", 58_720_256),
    ("trace-oom_probe_fraction", 3_162_505_216),
    ("trace-random_stress_maxsplit", 3_909_091_328),
    ("trace-seeds", 1_153_433_600),
];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("settle: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let replays: usize = match args.first() {
        Some(count) => count.parse().map_err(|_| format!("N '{count}' is not a count"))?,
        None => 8,
    };
    let settings = args.get(1).map_or("policy:cachalot", String::as_str);
    let filter = args.get(2).map_or("", String::as_str);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/bench-ops");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files: Vec<_> = entries.filter_map(|entry| entry.ok().map(|entry| entry.path())).collect();
    files.sort();
    for path in files.iter().filter(|p| p.extension().is_some_and(|x| x == "ops")) {
        let name = path.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_default();
        if !name.contains(filter) {
            continue;
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let ops = OpFile::parse(&text).map_err(|e| format!("{name}: {e}"))?;
        let config = AllocatorConfig::parse(settings).map_err(|e| format!("settings '{settings}': {e}"))?;
        let mut allocator =
            CachingAllocator::new(SimBackend::new(DEFAULT_DEVICE_TOTAL), config).map_err(|e| e.to_string())?;
        let mut handles = vec![None; ops.handles];
        let (mut calls, mut first_peak) = (Vec::new(), 0);
        for _ in 0..replays {
            let before = allocator.stats().num_device_alloc + allocator.stats().num_device_free;
            ops.replay(&mut allocator, &mut handles, true).map_err(|e| format!("{name}: {e}"))?;
            OpFile::free_live(&mut allocator, &mut handles).map_err(|e| format!("{name}: {e}"))?;
            calls.push(allocator.stats().num_device_alloc + allocator.stats().num_device_free - before);
            if first_peak == 0 {
                first_peak = allocator.stats().max_memory_reserved();
            }
        }
        allocator.check_consistency().map_err(|e| format!("{name}: {e}"))?;
        let stats = allocator.stats();
        let (peak, allocated) = (stats.max_memory_reserved(), stats.max_memory_allocated());
        let ratio = peak as f64 / allocated as f64;
        let verdict = match PYTORCH_SETTLING_PEAK.iter().find(|(file, _)| *file == name) {
            Some(&(_, settling)) => format!(
                "{} {}",
                if ratio <= 1.15 { "within-1.15" } else { "ABOVE-1.15" },
                if peak <= settling { "within-pytorch" } else { "ABOVE-pytorch" }
            ),
            None => String::new(),
        };
        let settled = calls.iter().skip(3).all(|&c| c == 0);
        println!(
            "{name:30} {calls:?} peak {peak} ({ratio:.3}x of {allocated}) first replay's peak {first_peak} {} {verdict}",
            if settled { "SETTLED" } else { "moving" }
        );
    }
    Ok(())
}
