//! Replays op files (`shared/bench/README.md`) on cachalot's allocator and prints the median
//! ns per op in the shape of `shared/bench/torch_alloc_bench.py`, so the two outputs of one
//! device run compare line by line (until `cachalot bench` takes this over).
//!
//! ```text
//! replay_bench OPS_FILE... [--backend cuda|sim|both] [--device N] [--reps N]
//! ```
//!
//! `cuda`: PyTorch 2.11's policy over real device memory (`CachingAllocator<CudaBackend>`);
//! `sim`: the same policy over the simulator (the policy's own cost). Each file: one warm-up
//! replay, then `--reps` timed ones (default 5), all ops on the default stream.

use std::error::Error;
use std::path::Path;
use std::process::ExitCode;

use cachalot_core::ops::OpFile;
use cachalot_cuda::bench::{self, ReplayTiming};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("replay_bench: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let mut files = Vec::new();
    let (mut backend, mut device, mut reps) = ("cuda".to_string(), 0usize, bench::TIMED_REPLAYS);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--backend" => backend = args.next().ok_or("--backend needs cuda, sim or both")?,
            "--device" => device = args.next().ok_or("--device needs a number")?.parse()?,
            "--reps" => reps = args.next().ok_or("--reps needs a number")?.parse()?,
            "-h" | "--help" => {
                println!("replay_bench OPS_FILE... [--backend cuda|sim|both] [--device N] [--reps N]");
                return Ok(());
            }
            _ => files.push(arg),
        }
    }
    if files.is_empty() {
        return Err("no op files given (see --help)".into());
    }
    let backends: Vec<&str> = match backend.as_str() {
        "both" => vec!["cuda", "sim"],
        "cuda" => vec!["cuda"],
        "sim" => vec!["sim"],
        other => return Err(format!("unknown backend {other:?} (cuda, sim or both)").into()),
    };
    if backends.contains(&"cuda") {
        eprintln!("# {}", cachalot_cuda::probe(device)?);
    }
    for path in &files {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        let ops = OpFile::parse(&text).map_err(|e| format!("{path}: {e}"))?;
        let name = Path::new(path).file_name().map_or(path.clone(), |n| n.to_string_lossy().into_owned());
        for &which in &backends {
            let timing: ReplayTiming = match which {
                "cuda" => bench::replay_on_cuda(&ops, device, reps)?,
                _ => {
                    // The simulator needs a capacity: as much as the largest GPU of the traces.
                    bench::replay_on_sim(&ops, 150_109_880_320, reps)?
                }
            };
            println!("{}", bench::format_line(&name, &format!("cachalot-{which}"), timing.median));
        }
    }
    Ok(())
}
