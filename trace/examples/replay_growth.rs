//! How replay time grows with the number of trace entries, for the trace shapes whose release
//! runs the replay cannot explain from the trace's order alone: a memory fraction, the garbage
//! collector, expandable segments, and a fraction so tight that each malloc releases the cache
//! itself. Each shape churns segments across `STREAMS` streams (a 24 MiB tensor allocated on
//! the next stream, freed, and its memory released by `empty_cache`, or by the next malloc in
//! the tight shape) for `CYCLES`, 2 × `CYCLES` and 4 × `CYCLES` cycles; each trace is replayed
//! and checked against its recording, and the table gives the median replay time of `RUNS`
//! runs and its ratio to the first size's. Linear growth is 1, 2, 4; the replay once copied
//! the whole allocator, history included, at every release run of these shapes (4, 16).
//!
//! ```sh
//! cargo run --release -p cachalot-trace --example replay_growth -- 1000 25000 3
//! ```

use std::time::Instant;

use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
use cachalot_trace::replay::{ReplayOptions, replay, verify_against_recording};
use cachalot_trace::snapshot::torch;

const USAGE: &str = "usage: replay_growth STREAMS CYCLES [RUNS]";
const DEVICE: u64 = 80 << 30;
const TENSOR: u64 = 24 << 20;

/// One trace shape: its settings, its memory fraction, and whether the program calls
/// `empty_cache` after each free (otherwise the next malloc has to release the cache).
struct Shape {
    name: &'static str,
    settings: &'static str,
    fraction: Option<f64>,
    empty_cache: bool,
}

const SHAPES: [Shape; 4] = [
    Shape { name: "memory fraction 0.5", settings: "", fraction: Some(0.5), empty_cache: true },
    Shape {
        name: "fraction 0.5, garbage collection 0.6",
        settings: "garbage_collection_threshold:0.6",
        fraction: Some(0.5),
        empty_cache: true,
    },
    Shape { name: "expandable segments", settings: "expandable_segments:True", fraction: None, empty_cache: true },
    Shape {
        name: "fraction of 40 MiB: each malloc releases the cache",
        settings: "",
        // Room for one 24 MiB segment, not two: the next stream's malloc must release.
        fraction: Some((40u64 << 20) as f64 / DEVICE as f64),
        empty_cache: false,
    },
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let streams: u64 = args.next().ok_or(USAGE)?.parse()?;
    let cycles: u64 = args.next().ok_or(USAGE)?.parse()?;
    let runs: usize = args.next().map_or(Ok(3), |r| r.parse())?;
    println!("{streams} streams; median of {runs} replays; ratio to the first row of each shape");
    println!("| shape | cycles | entries | replay (s) | ratio |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for shape in &SHAPES {
        let mut first = None;
        for factor in [1, 2, 4] {
            let (snapshot, options) = record(shape, streams.max(1), cycles * factor)?;
            let mut times = Vec::with_capacity(runs);
            for _ in 0..runs.max(1) {
                let started = Instant::now();
                let outcome = replay(&snapshot, &options, |_, _| {})?;
                times.push(started.elapsed().as_secs_f64());
                verify_against_recording(&snapshot, &outcome, None)?;
            }
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            let base = *first.get_or_insert(median);
            let entries = snapshot.device_traces.first().map_or(0, Vec::len);
            println!("| {} | {} | {entries} | {median:.3} | {:.2} |", shape.name, cycles * factor, median / base);
        }
    }
    Ok(())
}

/// Records the shape's trace on the simulator, and the options that replay it.
fn record(
    shape: &Shape,
    streams: u64,
    cycles: u64,
) -> Result<(torch::TorchSnapshot, ReplayOptions), Box<dyn std::error::Error>> {
    let config = AllocatorConfig::parse(shape.settings)?;
    let mut allocator = CachingAllocator::new(SimBackend::new(DEVICE), config.clone())?;
    if let Some(fraction) = shape.fraction {
        allocator.set_memory_fraction(fraction)?;
    }
    allocator.record_history(true, usize::MAX, &[], false);
    // PyTorch's streams are pointers; any distinct non-zero numbers do.
    let stream = |n: u64| StreamId(0x1000 + n * 0x10);
    for cycle in 0..cycles {
        let tensor = allocator.malloc(TENSOR, stream(cycle % streams))?;
        allocator.free(tensor)?;
        if shape.empty_cache {
            allocator.empty_cache()?;
        }
    }
    let snapshot = torch::from_allocator(&allocator, None);
    let options = ReplayOptions {
        config,
        memory_fraction: shape.fraction,
        device_total: DEVICE,
        device: 0,
        calls: None,
        record_calls: false,
    };
    Ok((snapshot, options))
}
