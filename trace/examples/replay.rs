//! Replays an op file a given number of times on the simulator, in a plain process with nothing
//! else in it: for profilers that count a whole run, such as callgrind.
//!
//! `cargo run --release -p cachalot-trace --example replay -- FILE.ops N [SETTINGS]`
//!
//! SETTINGS is an allocator configuration string (e.g. `policy:cachalot`); PyTorch's defaults
//! without it. Each replay's device calls (segment allocations and page maps; frees and unmaps)
//! are printed, which shows whether a job replayed again reaches a steady state; with
//! `CACHALOT_REPLAY_QUIET` set they are not, and the run is the replays alone (`stats()`
//! computes all 122 keys, a few hundred instructions that a count per op should not include).
//!
//! The difference between the counts of N and M replays, divided by (N - M) times the file's ops,
//! is the cost of one op with the cache warm, free of parsing and start-up:
//! `scripts/dev/icount.sh` does that with callgrind's instruction counts, which unlike timings on a
//! shared machine repeat exactly.

use std::process::ExitCode;

use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend};
use cachalot_trace::ops::OpFile;
use cachalot_trace::replay::DEFAULT_DEVICE_TOTAL;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("replay: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, replays, settings) = match args.as_slice() {
        [path, replays] => (path, replays, ""),
        [path, replays, settings] => (path, replays, settings.as_str()),
        _ => return Err("usage: replay FILE.ops REPLAYS [SETTINGS]".into()),
    };
    let replays: usize = replays.parse().map_err(|_| format!("REPLAYS '{replays}' is not a count"))?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let ops = OpFile::parse(&text).map_err(|e| format!("{path}: {e}"))?;
    let config = AllocatorConfig::parse(settings).map_err(|e| format!("settings '{settings}': {e}"))?;
    let mut allocator =
        CachingAllocator::new(SimBackend::new(DEFAULT_DEVICE_TOTAL), config).map_err(|e| e.to_string())?;
    let mut handles = vec![None; ops.handles];
    let quiet = std::env::var_os("CACHALOT_REPLAY_QUIET").is_some();
    let mut before = (0, 0);
    for replay in 1..=replays {
        ops.replay(&mut allocator, &mut handles, true).map_err(|e| format!("{path}: {e}"))?;
        // As the timed harness does: what a replay leaves live is freed before the next.
        OpFile::free_live(&mut allocator, &mut handles).map_err(|e| format!("{path}: {e}"))?;
        if quiet {
            continue;
        }
        let stats = allocator.stats();
        println!(
            "replay {replay}: {} device allocs, {} device frees; peak reserved {} bytes",
            stats.num_device_alloc - before.0,
            stats.num_device_free - before.1,
            stats.max_memory_reserved()
        );
        before = (stats.num_device_alloc, stats.num_device_free);
    }
    println!("{} ops x {replays} replays; {} bytes reserved at the end", ops.ops.len(), allocator.memory_reserved());
    Ok(())
}
