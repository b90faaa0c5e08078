//! How long `explain` takes on a large trace: a job of `STEPS` training-like steps (a few
//! hundred allocations and frees of mixed sizes per step, on two streams, a little kept live
//! each step), recorded on a simulated device, that ends by fragmenting the large pool and
//! running out of memory. Prints the trace's length, the time of the answer (the replay stopped
//! at the error and the classes read there) and of the fix search (the whole trace replayed
//! under each candidate, in parallel on every core), and the answer's first lines.
//!
//! ```sh
//! cargo run --release -p cachalot-trace --example explain_large -- 3000
//! ```

use std::time::Instant;

use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
use cachalot_trace::explain::{ExplainOptions, explain};
use cachalot_trace::replay::ReplayOptions;
use cachalot_trace::snapshot::torch;

const USAGE: &str = "usage: explain_large STEPS";
const MIB: u64 = 1 << 20;
const DEVICE: u64 = 8 << 30;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: u64 = std::env::args().nth(1).ok_or(USAGE)?.parse()?;
    let started = Instant::now();
    let (snapshot, options) = record(steps)?;
    let entries = snapshot.device_traces[0].len();
    println!("{entries} entries recorded in {:.2} s", started.elapsed().as_secs_f64());

    let started = Instant::now();
    let answer = explain(&snapshot, &options, &ExplainOptions { search_fix: false, ..ExplainOptions::default() })?;
    let answer_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let with_fix = explain(&snapshot, &options, &ExplainOptions::default())?;
    let total_seconds = started.elapsed().as_secs_f64();
    let search = with_fix.fix.as_ref().ok_or("no fix search ran")?;
    println!(
        "entry {}: main cause {:?}; answer {answer_seconds:.2} s; with the fix search {total_seconds:.2} s \
         ({} replays, {:.2} s, {} threads)",
        answer.entry,
        answer.main_cause,
        search.replays,
        search.seconds,
        rayon::current_num_threads()
    );
    println!("fix: {:?}", search.fix.as_ref().map(|f| (&f.change, f.peak_reserved)));
    Ok(())
}

/// The job: each step allocates activations on stream A (sizes from 512 B to 24 MiB), a few
/// on stream B, frees them in reverse, and keeps a 512 KiB block live (and a 3 MiB one every 40th step); at the
/// end, 6 MiB blocks with a live 2 MiB one between each pair fill the device, and a 40 MiB
/// request fails.
fn record(steps: u64) -> Result<(torch::TorchSnapshot, ReplayOptions), Box<dyn std::error::Error>> {
    let mut allocator = CachingAllocator::new(SimBackend::new(DEVICE), AllocatorConfig::default())?;
    allocator.record_history(true, usize::MAX, &[], false);
    let (a, b) = (StreamId(0x10), StreamId(0x20));
    let mut kept = Vec::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..steps {
        let mut step = Vec::with_capacity(340);
        for n in 0..330 {
            let size = match next() % 10 {
                0..=5 => 512 + next() % (64 << 10),
                6..=8 => (1 + next() % 4) * MIB,
                _ => (4 + next() % 20) * MIB,
            };
            let stream = if n % 16 == 0 { b } else { a };
            step.push(allocator.malloc(size, stream)?);
        }
        kept.push(allocator.malloc(512 << 10, a)?);
        if kept.len() % 40 == 1 {
            kept.push(allocator.malloc(3 * MIB, a)?);
        }
        while let Some(block) = step.pop() {
            allocator.free(block)?;
        }
    }
    allocator.empty_cache()?;
    let mut freed = Vec::new();
    while let Ok(block) = allocator.malloc(6 * MIB, a) {
        freed.push(block);
        match allocator.malloc(2 * MIB, a) {
            Ok(block) => kept.push(block),
            Err(_) => break,
        }
    }
    for block in freed {
        allocator.free(block)?;
    }
    if allocator.malloc(40 * MIB, a).is_ok() {
        return Err("the last request was served: the job does not run out of memory".into());
    }
    let snapshot = torch::from_allocator(&allocator, None);
    let mut options = ReplayOptions::for_snapshot(&snapshot, None)?;
    options.device_total = DEVICE;
    Ok((snapshot, options))
}
