//! `cachalot bench [OPS...] [--backend auto|cuda|wgpu|sim] [--device N] [--reps N] [--config STR]
//! [--each-replay]`:
//! times op files (`a ID SIZE [STREAM]`, `f ID`; `testdata/bench-ops` holds the standard ones) on
//! cachalot's allocator and prints the median ns per op in the shape of PyTorch's reference
//! harness, `torch_alloc_bench.py` (`file allocator median ns/op`),
//! so the two outputs of one run on one machine compare line by line. Without files it times the
//! standard workloads, which the repository ships (`testdata/bench-ops`).
//!
//! Exit status 2 for a bad file or option or a backend that cannot be used; 1 when a replay
//! fails on the device (out of memory, a driver error).

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use cachalot_core::AllocatorConfig;
use cachalot_runtime::bench::BenchTarget;
use cachalot_runtime::{BackendRequest, DeviceOptions};
use cachalot_trace::ops::OpFile;
use cachalot_trace::ops::timing::{TIMED_REPLAYS, WARMUP_REPLAYS, format_line};

use crate::failure::{Failure, Outcome};
use crate::input::parse_bytes;
use crate::run::AllocConf;

/// Arguments of `cachalot bench`.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// Op files (`a ID SIZE [STREAM]`, `f ID`); default: the standard workloads of PyTorch's
    /// allocator benchmark, as the repository ships them in testdata/bench-ops.
    pub files: Vec<PathBuf>,
    /// auto: CUDA, then wgpu's best adapter, then the simulator (the policy's cost alone).
    #[arg(long, default_value = "auto", value_parser = ["auto", "cuda", "wgpu", "sim"])]
    pub backend: String,
    /// CUDA device ordinal, or the index of the adapter in wgpu's enumeration.
    #[arg(long)]
    pub device: Option<usize>,
    /// Timed replays per file, after one warm-up (the median is printed).
    #[arg(long, default_value_t = TIMED_REPLAYS as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub reps: u32,
    /// After each file's line, a comment line per timed replay: its time per op and device calls
    /// (a replay with none ran on the cache alone).
    // The median can fall on a replay that paid for driver calls, as a policy that gives memory
    // back settles in; these lines tell the hot path from those.
    #[arg(long)]
    pub each_replay: bool,
    /// Allocator configuration, PYTORCH_CUDA_ALLOC_CONF syntax (default: the PYTORCH_CUDA_ALLOC_CONF
    /// variable, as the reference harness under PyTorch reads it; unset, PyTorch's defaults).
    #[arg(long)]
    pub config: Option<String>,
    /// Device memory for wgpu (default 4 GiB) and the simulator (default an H200's), in bytes
    /// or with a KiB/MiB/GiB suffix.
    #[arg(long, value_parser = parse_bytes)]
    pub capacity: Option<u64>,
}

/// The standard workloads of the checkout this binary was built from (`testdata/bench-ops`),
/// in name order.
fn standard_workloads() -> anyhow::Result<Vec<PathBuf>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/bench-ops");
    let entries = std::fs::read_dir(&dir).with_context(|| {
        format!("no op files given, and the standard workloads are not at {}: name op files", dir.display())
    })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "ops"))
        .collect();
    paths.sort();
    Ok(paths)
}

/// Runs `cachalot bench`: the backend chosen (on stderr, with why), then one line per file.
pub fn run(args: &BenchArgs) -> Outcome {
    let conf = AllocConf::choose(args.config.as_deref())?;
    let config = AllocatorConfig::parse(&conf.settings)
        .map_err(|e| anyhow!("--config '{}': {e}", cachalot_core::error::shorten(&conf.settings)))?;
    // Every file is read and parsed before anything is timed, so a bad file fails at once.
    let paths = if args.files.is_empty() { standard_workloads()? } else { args.files.clone() };
    let mut files = Vec::with_capacity(paths.len());
    for path in &paths {
        let bytes = crate::input::read(path)?;
        let text =
            std::str::from_utf8(&bytes).map_err(|_| anyhow!("{}: not an op file (not UTF-8 text)", path.display()))?;
        let ops = OpFile::parse(text).with_context(|| format!("{}", path.display()))?;
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        files.push((name, ops));
    }
    let backend = BackendRequest::parse(&args.backend).ok_or_else(|| anyhow!("unknown backend {}", args.backend))?;
    let options = DeviceOptions { backend, device: args.device, capacity: args.capacity, ..DeviceOptions::default() };
    let (target, selection) = BenchTarget::open(&options).map_err(|e| Failure::input(e.into()))?;
    for line in &selection.lines {
        eprintln!("# {line}");
    }
    eprintln!("# {}", conf.describe());
    if cfg!(debug_assertions) {
        eprintln!(
            "# warning: an unoptimised (debug) build: its ns/op are many times a release build's and compare with \
             nothing; build with `cargo build --release -p cachalot-cli`"
        );
    }
    let allocator = target.allocator_name();
    for (name, ops) in &files {
        let timing = target
            .time(ops, &config, args.reps as usize)
            .with_context(|| format!("{name} on {allocator}"))
            .map_err(|error| Failure { status: 1, error })?;
        println!("{}", format_line(name, &allocator, timing.median));
        if args.each_replay {
            // Replays are numbered from 1, warm-ups included.
            for (i, (ns, calls)) in timing.ns_per_op.iter().zip(&timing.device_calls).enumerate() {
                let noun = if *calls == 1 { "call" } else { "calls" };
                println!("# {name} replay {}: {ns:.1} ns/op, {calls} device {noun}", WARMUP_REPLAYS + i + 1);
            }
        }
    }
    Ok(())
}
