//! Writes a PyTorch snapshot pickle whose trace churns segments across many streams: every
//! stream keeps a small tensor alive (so each has a segment and cached free space), and
//! `CYCLES` times a large tensor is allocated on the next stream, freed, and its segment
//! released by `empty_cache`. Each cycle is a segment allocation and a segment free, so the
//! replay meets a release run before every new segment: the shape that once made replay copy
//! the whole allocator per run (BENCHMARKS.md, "Replay of segment churn").
//!
//! ```sh
//! cargo run --release -p cachalot-trace --example churn_trace -- 1000 100000 churn.pickle
//! cachalot replay --check churn.pickle
//! ```

use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
use cachalot_trace::snapshot::{pickle, torch};

const USAGE: &str = "usage: churn_trace STREAMS CYCLES OUT.pickle";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let streams: u64 = args.next().ok_or(USAGE)?.parse()?;
    let cycles: u64 = args.next().ok_or(USAGE)?.parse()?;
    let out = args.next().ok_or(USAGE)?;

    let mut allocator = CachingAllocator::new(SimBackend::new(80 << 30), AllocatorConfig::default())?;
    allocator.record_history(true, usize::MAX, &[], false);
    // PyTorch's streams are pointers; any distinct non-zero numbers do.
    let stream = |n: u64| StreamId(0x1000 + n * 0x10);
    let mut kept = Vec::new();
    for n in 0..streams {
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
    Ok(())
}
