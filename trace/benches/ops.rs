//! `cargo bench -p cachalot-trace`: replays the standard op files of `shared/bench` on the
//! simulator and prints nanoseconds per op (one allocate or one free).
//!
//! The method is the one of PyTorch's reference harness (`shared/bench/torch_alloc_bench.py`):
//! the allocator lives across replays, one warm-up replay, then the median of five timed ones,
//! every op on the default stream, file parsing not timed. That keeps the figures side by side
//! with PyTorch's (measured on a GPU host, so compare ratios, not absolute times across
//! machines). As a reference in the same run, the same ops are replayed against the system
//! heap allocator (`std::alloc`, 512-byte aligned): the ratio says what the cache costs relative
//! to a general-purpose CPU allocator on this machine.
//!
//! Op files come from `$CACHALOT_OPS_DIR`, else the standard workloads the repository ships
//! (`testdata/bench-ops`, as `shared/bench/workloads.sh` writes them). Arguments filter the files
//! by name; `CACHALOT_BENCH_NO_REFERENCE=1` skips the reference replays.
//!
//! `CACHALOT_BENCH_POLICY_ROUNDS=N` instead compares cachalot's own policy (`policy:cachalot`)
//! with PyTorch's on the same files: N rounds, each timing both policies back to back (a fresh
//! allocator each, the order alternating by round), and per file the median of the rounds'
//! ratios — paired so that a spell of a busy machine slows both sides of a ratio alike.

use std::alloc::{Layout, alloc, dealloc};
use std::path::{Path, PathBuf};
use std::time::Instant;

use cachalot_core::AllocatorConfig;
use cachalot_trace::ops::timing::{TIMED_REPLAYS, WARMUP_REPLAYS, median, time_on_sim};
use cachalot_trace::ops::{Op, OpFile};

/// An H200's memory, the largest GPU of the traces.
const SIM_CAPACITY: u64 = 150_109_880_320;

fn main() {
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let dir = ops_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "ops"))
        .filter(|p| filters.is_empty() || filters.iter().any(|f| p.to_string_lossy().contains(f.as_str())))
        .collect();
    files.sort();
    if let Some(rounds) = std::env::var("CACHALOT_BENCH_POLICY_ROUNDS").ok().and_then(|r| r.parse().ok()) {
        compare_policies(&files, rounds);
        return;
    }
    println!("{:<30} {:>10} {:>16} {:>8}", "ops file", "ns/op", "system malloc", "ratio");
    let mut results = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let ops = OpFile::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let ours = time_on_sim(&ops, SIM_CAPACITY, AllocatorConfig::default(), TIMED_REPLAYS)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .median;
        // CACHALOT_BENCH_NO_REFERENCE=1 skips the reference (e.g. to profile cachalot alone).
        let system = match std::env::var_os("CACHALOT_BENCH_NO_REFERENCE") {
            Some(_) => f64::NAN,
            None => median(&bench_system(&ops)),
        };
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        println!("{name:<30} {ours:>10.1} {system:>16.1} {:>8.2}", ours / system);
        results.push((name, ours));
    }
    let find = |name: &str| results.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    if let (Some(flat), Some(random)) = (find("random-20k-live"), find("random-512B-64MiB")) {
        println!("flatness: random-20k-live / random-512B-64MiB = {:.2}", flat / random);
    }
}

/// PyTorch's policy and `policy:cachalot` on each file, paired round by round.
fn compare_policies(files: &[PathBuf], rounds: usize) {
    let pytorch = AllocatorConfig::default();
    let ours = AllocatorConfig::parse("policy:cachalot").expect("the policy key parses");
    println!(
        "{:<30} {:>14} {:>16} {:>14} ({rounds} paired rounds, medians)",
        "ops file", "pytorch ns/op", "cachalot ns/op", "ratio"
    );
    for path in files {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let ops = OpFile::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let time = |config: &AllocatorConfig| {
            time_on_sim(&ops, SIM_CAPACITY, config.clone(), TIMED_REPLAYS)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .median
        };
        let (mut theirs, mut mine, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let (a, b) = if round % 2 == 0 {
                let a = time(&pytorch);
                (a, time(&ours))
            } else {
                let b = time(&ours);
                (time(&pytorch), b)
            };
            theirs.push(a);
            mine.push(b);
            ratios.push(b / a);
        }
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        println!("{name:<30} {:>14.1} {:>16.1} {:>14.3}", median(&theirs), median(&mine), median(&ratios));
    }
}

fn bench_system(ops: &OpFile) -> Vec<f64> {
    let mut handles: Vec<Option<(*mut u8, Layout)>> = vec![None; ops.handles];
    (0..WARMUP_REPLAYS + TIMED_REPLAYS)
        .map(|_| {
            let start = Instant::now();
            for op in &ops.ops {
                match *op {
                    Op::Alloc { id, size, .. } => {
                        let layout = Layout::from_size_align(size.max(1) as usize, 512).expect("layout");
                        // SAFETY: the layout has a non-zero size; the pointer is freed below with it.
                        let ptr = unsafe { alloc(layout) };
                        assert!(!ptr.is_null(), "system allocator out of memory");
                        handles[id as usize] = Some((ptr, layout));
                    }
                    Op::Free { id } => {
                        if let Some((ptr, layout)) = handles[id as usize].take() {
                            // SAFETY: allocated above with this layout and freed once.
                            unsafe { dealloc(ptr, layout) };
                        }
                    }
                }
            }
            start.elapsed().as_nanos() as f64 / ops.ops.len() as f64
        })
        .skip(WARMUP_REPLAYS)
        .collect()
}

fn ops_dir() -> PathBuf {
    match std::env::var_os("CACHALOT_OPS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/bench-ops"),
    }
}
