//! Writes a synthetic PyTorch snapshot pickle with a trace of about N events, recorded by
//! running a random workload through the allocator on the simulator — the shape of a real
//! `torch.cuda.memory._dump_snapshot()` file, for measuring tools on large traces.
//!
//! ```sh
//! cargo run --release -p cachalot-trace --example synthetic_trace -- 3000000 big.pickle
//! ```

use cachalot_core::{AllocatorConfig, AllocatorError, CachingAllocator, Frame, SimBackend, StreamId};
use cachalot_trace::snapshot::{pickle, torch};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let events: u64 = args.next().ok_or("usage: synthetic_trace EVENTS OUT.pickle")?.parse()?;
    let out = args.next().ok_or("usage: synthetic_trace EVENTS OUT.pickle")?;

    let mut allocator = CachingAllocator::new(SimBackend::new(80 << 30), AllocatorConfig::default())?;
    allocator.record_history(true, usize::MAX, &[], false);
    // A handful of stacks, shared by many entries, as in a real training loop.
    let stacks: Vec<_> = (0..16)
        .map(|i| {
            let frame = |name: &str, line| Frame { filename: "train.py".into(), line, name: name.into() };
            allocator.intern_context(&[frame(&format!("layer{i}"), 10 + i), frame("step", 100), frame("<module>", 200)])
        })
        .collect();

    let mut live = Vec::new();
    let mut x: u64 = 0x9e3779b97f4a7c15;
    while allocator.trace_len_total() < events {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        allocator.set_context(Some(stacks[(x % 16) as usize]));
        if live.len() < 2000 && (live.is_empty() || x % 100 < 52) {
            // Log-uniform sizes from 512 B to 64 MiB.
            let size = 512u64 << ((x >> 8) % 17);
            let size = size + (x >> 32) % size;
            match allocator.malloc(size, StreamId::DEFAULT) {
                Ok(a) => live.push(a),
                Err(AllocatorError::OutOfMemory(_)) => {}
                Err(e) => return Err(e.into()),
            }
        } else {
            let victim = live.swap_remove((x >> 16) as usize % live.len());
            allocator.free(victim)?;
        }
        if x.is_multiple_of(50_000) {
            allocator.empty_cache()?;
        }
    }
    let snapshot = torch::from_allocator(&allocator, None);
    std::fs::write(&out, pickle::write_snapshot(&snapshot)?)?;
    eprintln!("{out}: {} trace entries", snapshot.device_traces[0].len());
    Ok(())
}
