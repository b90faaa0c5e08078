//! Writes a PyTorch snapshot pickle whose trace churns segments across many streams: `CYCLES`
//! times a large tensor is allocated on the next of `STREAMS` streams, freed, and its segment
//! released by `empty_cache`. With `--keep`, every stream also keeps a small tensor alive, so
//! each holds a segment with cached free space that every `empty_cache` walks past (as
//! PyTorch's `release_cached_blocks` walks every free block). Each cycle is a segment allocation and a segment free, so the
//! replay meets a release run before every new segment: the shape that once made replay copy
//! the whole allocator per run (BENCHMARKS.md §6).
//!
//! ```sh
//! cargo run --release -p cachalot-trace --example churn_trace -- 1000 100000 churn.pickle [--keep]
//! cachalot replay --check churn.pickle
//! ```
//!
//! It then reads the file back and replays it as `cachalot replay --check` does, printing the
//! seconds each step took.

use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
use cachalot_trace::replay::{ReplayOptions, replay, verify_against_recording};
use cachalot_trace::snapshot::{pickle, torch};

const USAGE: &str = "usage: churn_trace STREAMS CYCLES OUT.pickle [--keep]";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let streams: u64 = args.next().ok_or(USAGE)?.parse()?;
    let cycles: u64 = args.next().ok_or(USAGE)?.parse()?;
    let out = args.next().ok_or(USAGE)?;
    let keep = match args.next().as_deref() {
        None => false,
        Some("--keep") => true,
        Some(_) => return Err(USAGE.into()),
    };

    let mut allocator = CachingAllocator::new(SimBackend::new(80 << 30), AllocatorConfig::default())?;
    allocator.record_history(true, usize::MAX, &[], false);
    // PyTorch's streams are pointers; any distinct non-zero numbers do.
    let stream = |n: u64| StreamId(0x1000 + n * 0x10);
    let mut kept = Vec::new();
    for n in (0..streams).filter(|_| keep) {
        kept.push(allocator.malloc(4096, stream(n))?);
    }
    for cycle in 0..cycles {
        let big = allocator.malloc(24 << 20, stream(cycle % streams.max(1)))?;
        allocator.free(big)?;
        allocator.empty_cache()?;
    }
    for tensor in kept {
        allocator.free(tensor)?;
    }
    let bytes = pickle::write_snapshot(&torch::from_allocator(&allocator, None))?;
    std::fs::write(&out, &bytes)?;
    println!("wrote {out}: {} trace entries, {} bytes", allocator.trace().len(), bytes.len());

    let started = std::time::Instant::now();
    let snapshot = pickle::read_snapshot(&std::fs::read(&out)?)?;
    let read = started.elapsed().as_secs_f64();
    let started = std::time::Instant::now();
    let options = ReplayOptions::for_snapshot(&snapshot, None)?;
    let outcome = replay(&snapshot, &options, |_, _| {})?;
    let replayed = started.elapsed().as_secs_f64();
    verify_against_recording(&snapshot, &outcome, None)?;
    println!("read {read:.3} s, replay {replayed:.3} s, matches the recording");
    Ok(())
}
