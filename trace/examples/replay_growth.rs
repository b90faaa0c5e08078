//! How replay time grows with the number of trace entries, for the trace shapes whose release
//! runs the replay cannot explain from the trace's order alone. The first four churn segments
//! across `STREAMS` streams (a 24 MiB tensor allocated on the next stream, freed, and its memory
//! released by `empty_cache`, or by the next malloc in the tight shape) under a memory fraction,
//! the garbage collector, expandable segments, and a fraction so tight that each malloc releases
//! the cache itself. The last ten also keep as many small blocks live as they have cycles, so
//! that a replay that copied the live state at every release it had to explain would pay for
//! them each time (quadratic time): the garbage collector releasing a segment at every malloc; a full device whose retry
//! chain releases a cached segment at every malloc (the oversize release, then the full one);
//! an out-of-memory error at every cycle with expandable segments; and `policy:cachalot` with
//! pages, whose misses return the cache before each new peak; and an out-of-memory error right
//! after a deferred free's completion, which the failure's synchronization made (the replay
//! completes that free before asking what the failure reserves); the OOM of shape 7 beside a
//! private pool; a malloc whose pages would be mapped in two pieces, the first refused, so that
//! its full release runs (with an `empty_cache` per cycle); and one refused the second piece
//! after mapping the first, which its full release then unmaps; and a `policy:cachalot` miss
//! that gives cached memory back and is still refused; and one under `max_split_size_mb` that
//! gives back pages of a free block of its own stream and grows into what is left of it. Each
//! shape runs for `CYCLES`,
//! 2 × `CYCLES` and 4 × `CYCLES` cycles; each trace is replayed and checked against its
//! recording, and the table gives the median replay time of `RUNS` runs and its ratio to the
//! first size's, with the replay's trial copies of the live state (`ReplayOutcome::trial_copies`).
//! Linear growth is 1, 2, 4; quadratic 1, 4, 16. `SHAPES` (e.g. `5,6,7,8`) picks
//! shapes by number.
//!
//! ```sh
//! cargo run --release -p cachalot-trace --example replay_growth -- 1000 25000 3
//! ```

use std::time::Instant;

use cachalot_core::{AllocatorConfig, AllocatorError, CachingAllocator, PoolFilter, PoolId, SimBackend, StreamId};
use cachalot_trace::pool_calls::PoolCall;
use cachalot_trace::replay::{ReplayOptions, replay, verify_against_recording};
use cachalot_trace::snapshot::torch;

const USAGE: &str = "usage: replay_growth STREAMS CYCLES [RUNS] [SHAPES]";
const DEVICE: u64 = 80 << 30;
const MIB: u64 = 1 << 20;
const TENSOR: u64 = 24 * MIB;

/// What each cycle of a shape does.
#[derive(Clone, Copy)]
enum Cycle {
    /// A 24 MiB tensor on the next stream, freed, then `empty_cache` if asked (otherwise the
    /// next malloc has to release the cache).
    Churn { empty_cache: bool },
    /// On one stream: 64 MiB, freed, then 24 MiB, freed. On a device too small for both, the
    /// 24 MiB malloc's oversize release frees the cached 64 MiB segment, and the 64 MiB
    /// malloc's oversize release frees the cached 24 MiB one, then its full release runs.
    Oversize,
    /// On the next stream: a request for the whole device, which fails (reserving VA for the
    /// stream), then 24 MiB, freed (mapped in that reservation). The next failure's full
    /// release unmaps those pages and releases the reservation.
    Oom,
    /// A small block freed after use on a side stream still busy, 512 bytes kept (so the
    /// trace shows the free deferred), then on a new stream a request for the whole device,
    /// which fails: its full release completes the free and finds nothing to release, so the
    /// completion comes right before the `oom` entry. Then 20 MiB on that stream, kept (a page
    /// mapped in the reservation the failure made).
    OomAfterDeferredFree,
    /// [`Cycle::Oom`] beside a private pool (a `MemPool` that served one block, then stays
    /// unused), its calls replayed where the recording made them.
    OomBesidePool,
    /// In 20 MiB pages, on a device with 10 MiB to spare: 60 MiB on one stream would grow a free
    /// page over the unmapped pages on both sides (two pieces); the device refuses the first,
    /// so the full release unmaps that page and another stream's free 40 MiB, and the retry
    /// maps the three pages. Then the layout is made again: three 20 MiB blocks there, the
    /// outer two freed and unmapped by `empty_cache`, the middle one freed, and the other
    /// stream's 40 MiB allocated and freed.
    Pieces,
    /// In 20 MiB pages, with 30 MiB to spare: after a live page, a free page, an unmapped one, a
    /// free one and unmapped pages on one stream, a free 40 MiB block on another. 100 MiB on
    /// the first maps the hole (the first piece) and is refused the second, so its full release
    /// unmaps the free block the hole joined and the other stream's, and the retry maps the
    /// 100 MiB. Then the layout is made again: three 20 MiB blocks there, the middle one freed
    /// and unmapped by `empty_cache` with what is left of the 100, the outer two freed, and
    /// the other stream's 40 MiB allocated and freed.
    PartlyMapped,
    /// Under `policy:cachalot` with a fraction of 70 MiB: 40 MiB on stream 1 (rule 4 gives back
    /// the top of stream 0's cached 60 MiB), freed; then 60 MiB on stream 0, whose miss gives
    /// back stream 1's 40 MiB and is still refused by the fraction (which counts the whole
    /// request, not the pages it maps), so its full release unmaps stream 0's free block too;
    /// freed.
    GiveBackRefused,
    /// Under `policy:cachalot,max_split_size_mb:20`, on one stream between two live 4 MiB blocks,
    /// 30 MiB (oversize) made and freed before the cycles; each cycle 16 MiB, whose miss, at the
    /// peak, gives back the top 16 MiB of the free 30 (best fit passed it over as oversize) and
    /// grows into the 14 kept, mapping one page; freed; then 30 MiB, which grows the block back;
    /// freed.
    GiveBackOpensRoom,
}

/// One trace shape: its settings, its memory fraction, its device, whether it keeps a small
/// block live per cycle (allocated before the first), and its cycle.
struct Shape {
    name: &'static str,
    settings: &'static str,
    fraction: Option<f64>,
    device: u64,
    keeps_live: bool,
    cycle: Cycle,
}

const SHAPES: [Shape; 14] = [
    Shape {
        name: "memory fraction 0.5",
        settings: "",
        fraction: Some(0.5),
        device: DEVICE,
        keeps_live: false,
        cycle: Cycle::Churn { empty_cache: true },
    },
    Shape {
        name: "fraction 0.5, garbage collection 0.6",
        settings: "garbage_collection_threshold:0.6",
        fraction: Some(0.5),
        device: DEVICE,
        keeps_live: false,
        cycle: Cycle::Churn { empty_cache: true },
    },
    Shape {
        name: "expandable segments",
        settings: "expandable_segments:True",
        fraction: None,
        device: DEVICE,
        keeps_live: false,
        cycle: Cycle::Churn { empty_cache: true },
    },
    Shape {
        name: "fraction of 40 MiB: each malloc releases the cache",
        settings: "",
        // Room for one 24 MiB segment, not two: the next stream's malloc must release.
        fraction: Some((40 * MIB) as f64 / DEVICE as f64),
        device: DEVICE,
        keeps_live: false,
        cycle: Cycle::Churn { empty_cache: false },
    },
    Shape {
        name: "live blocks; garbage collection releases at every malloc",
        settings: "garbage_collection_threshold:0.3",
        // 64 MiB allowed beside the live blocks' segments (set below), collected above 30% of
        // it: the live blocks and a cached 24 MiB segment are above that, so each malloc's
        // collector releases the other stream's segment.
        fraction: None,
        device: DEVICE,
        keeps_live: true,
        cycle: Cycle::Churn { empty_cache: false },
    },
    Shape {
        name: "live blocks; a full device: oversize and full release",
        settings: "max_split_size_mb:20",
        fraction: None,
        // Beside the live blocks' segments: 64 MiB fits, and so does 24, but not both.
        device: 87 * MIB,
        keeps_live: true,
        cycle: Cycle::Oversize,
    },
    Shape {
        name: "live blocks; expandable segments, an OOM every cycle",
        settings: "expandable_segments:True",
        fraction: None,
        device: 1 << 30,
        keeps_live: true,
        cycle: Cycle::Oom,
    },
    Shape {
        name: "live blocks; policy:cachalot, expandable segments",
        settings: "policy:cachalot,expandable_segments:True",
        fraction: None,
        device: DEVICE,
        keeps_live: true,
        cycle: Cycle::Churn { empty_cache: false },
    },
    Shape {
        name: "live blocks; expandable segments, an OOM right after a deferred free",
        settings: "expandable_segments:True",
        fraction: None,
        // Grown by a 20 MiB page per cycle (below).
        device: 1 << 30,
        keeps_live: true,
        cycle: Cycle::OomAfterDeferredFree,
    },
    Shape {
        name: "live blocks; expandable segments, an OOM every cycle beside a private pool",
        settings: "expandable_segments:True",
        fraction: None,
        device: 1 << 30,
        keeps_live: true,
        cycle: Cycle::OomBesidePool,
    },
    Shape {
        name: "live blocks; expandable segments, pages that would be mapped in two pieces",
        settings: "expandable_segments:True",
        fraction: None,
        // The five pages of one stream (two of which, once unmapped, make room for the other
        // stream's two), 10 MiB to spare, and the live blocks' pages (added below).
        device: (5 * 20 + 10) * MIB,
        keeps_live: true,
        cycle: Cycle::Pieces,
    },
    Shape {
        name: "live blocks; expandable segments, pages left mapped by a refused allocation",
        settings: "expandable_segments:True",
        fraction: None,
        // Three pages of one stream, two of another, 30 MiB to spare (and the live blocks'
        // pages, added below).
        device: (3 * 20 + 40 + 30) * MIB,
        keeps_live: true,
        cycle: Cycle::PartlyMapped,
    },
    Shape {
        name: "live blocks; policy:cachalot, a give-back still refused by the fraction",
        settings: "policy:cachalot,expandable_segments:True",
        // 70 MiB beside the live blocks' pages (set below).
        fraction: None,
        device: DEVICE,
        keeps_live: true,
        cycle: Cycle::GiveBackRefused,
    },
    Shape {
        name: "live blocks; policy:cachalot, max_split_size_mb: a miss grows into the block it gave back from",
        settings: "policy:cachalot,max_split_size_mb:20,expandable_segments:True",
        fraction: None,
        device: DEVICE,
        keeps_live: true,
        cycle: Cycle::GiveBackOpensRoom,
    },
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let streams: u64 = args.next().ok_or(USAGE)?.parse()?;
    let cycles: u64 = args.next().ok_or(USAGE)?.parse()?;
    let runs: usize = args.next().map_or(Ok(3), |r| r.parse())?;
    let picked: Vec<usize> = match args.next() {
        Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => (1..=SHAPES.len()).collect(),
    };
    println!("{streams} streams; median of {runs} replays; ratio to the first row of each shape");
    println!("| shape | cycles | entries | replay (s) | ratio | trial copies |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (number, shape) in SHAPES.iter().enumerate().filter(|(n, _)| picked.contains(&(n + 1))) {
        let mut first = None;
        for factor in [1, 2, 4] {
            let (snapshot, options) = record(shape, streams.max(1), cycles * factor)?;
            let mut times = Vec::with_capacity(runs);
            let mut copies = 0;
            for _ in 0..runs.max(1) {
                let started = Instant::now();
                let outcome = replay(&snapshot, &options, |_, _| {})?;
                times.push(started.elapsed().as_secs_f64());
                verify_against_recording(&snapshot, &outcome, None)?;
                copies = outcome.trial_copies;
            }
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            let base = *first.get_or_insert(median);
            let entries = snapshot.device_traces.first().map_or(0, Vec::len);
            println!(
                "| {}. {} | {} | {entries} | {median:.3} | {:.2} | {copies} |",
                number + 1,
                shape.name,
                cycles * factor,
                median / base
            );
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
    let live = if shape.keeps_live { cycles } else { 0 };
    // The live blocks' 2 MiB segments.
    let live_segments = (live * 512).div_ceil(2 * MIB) * 2 * MIB;
    let device = match shape.cycle {
        // The device holds the live blocks' 2 MiB segments besides.
        Cycle::Oversize | Cycle::Pieces | Cycle::PartlyMapped => shape.device + live_segments,
        // Each cycle keeps a 20 MiB page mapped.
        Cycle::OomAfterDeferredFree => shape.device + cycles * 20 * MIB,
        _ => shape.device,
    };
    // The collector's shape allows 64 MiB beside the live blocks' segments, the give-back's 70.
    let fraction = match shape.cycle {
        _ if shape.settings.contains("garbage_collection") && shape.keeps_live => {
            Some((live_segments + 64 * MIB) as f64 / device as f64)
        }
        Cycle::GiveBackRefused => Some((live_segments + 70 * MIB) as f64 / device as f64),
        _ => shape.fraction,
    };
    let mut allocator = CachingAllocator::new(SimBackend::new(device), config.clone())?;
    if let Some(fraction) = fraction {
        allocator.set_memory_fraction(fraction)?;
    }
    allocator.record_history(true, usize::MAX, &[], false);
    // PyTorch's streams are pointers; any distinct non-zero numbers do.
    let stream = |n: u64| StreamId(0x1000 + n * 0x10);
    let mut kept = Vec::new();
    for _ in 0..live {
        kept.push(allocator.malloc(512, stream(0))?);
    }
    // The pool calls, each with the number of entries recorded before it.
    let mut calls = Vec::new();
    if matches!(shape.cycle, Cycle::OomBesidePool) {
        let pool = PoolId(0, 1);
        let at = |allocator: &CachingAllocator<SimBackend>| allocator.trace_len_total() as usize;
        calls.push((at(&allocator), PoolCall::Create(pool)));
        allocator.create_pool(pool)?;
        calls.push((at(&allocator), PoolCall::Begin(pool, None)));
        allocator.begin_allocate_to_pool(pool, PoolFilter::AllStreams)?;
        kept.push(allocator.malloc(2 * MIB, stream(0))?);
        calls.push((at(&allocator), PoolCall::End(pool)));
        allocator.end_allocate_to_pool(pool)?;
    }
    // The layout of `Cycle::Pieces`: on stream 0, a free page between two unmapped ones; on
    // stream 1, a free 40 MiB block.
    let pieces_layout = |allocator: &mut CachingAllocator<SimBackend>| -> Result<(), AllocatorError> {
        let first = allocator.malloc(20 * MIB, stream(0))?;
        let middle = allocator.malloc(20 * MIB, stream(0))?;
        let last = allocator.malloc(20 * MIB, stream(0))?;
        allocator.free(first)?;
        allocator.free(last)?;
        allocator.empty_cache()?;
        allocator.free(middle)?;
        let other = allocator.malloc(40 * MIB, stream(1))?;
        allocator.free(other)
    };
    // The layout of `Cycle::PartlyMapped`, after a live page of stream 0.
    let partly_layout = |allocator: &mut CachingAllocator<SimBackend>| -> Result<(), AllocatorError> {
        let below = allocator.malloc(20 * MIB, stream(0))?;
        let hole = allocator.malloc(20 * MIB, stream(0))?;
        let above = allocator.malloc(20 * MIB, stream(0))?;
        allocator.free(hole)?;
        allocator.empty_cache()?;
        allocator.free(below)?;
        allocator.free(above)?;
        let other = allocator.malloc(40 * MIB, stream(1))?;
        allocator.free(other)
    };
    if matches!(shape.cycle, Cycle::GiveBackOpensRoom) {
        kept.push(allocator.malloc(4 * MIB, stream(0))?);
        let oversize = allocator.malloc(30 * MIB, stream(0))?;
        kept.push(allocator.malloc(4 * MIB, stream(0))?);
        allocator.free(oversize)?;
    }
    if matches!(shape.cycle, Cycle::PartlyMapped) {
        kept.push(allocator.malloc(20 * MIB, stream(0))?);
        partly_layout(&mut allocator)?;
    }
    if matches!(shape.cycle, Cycle::Pieces) {
        // Live pages on both sides of the three, which are freed (merging) and cut again.
        kept.push(allocator.malloc(20 * MIB, stream(0))?);
        let three = allocator.malloc(60 * MIB, stream(0))?;
        kept.push(allocator.malloc(20 * MIB, stream(0))?);
        allocator.free(three)?;
        pieces_layout(&mut allocator)?;
    }
    for cycle in 0..cycles {
        match shape.cycle {
            Cycle::Churn { empty_cache } => {
                let tensor = allocator.malloc(TENSOR, stream(cycle % streams))?;
                allocator.free(tensor)?;
                if empty_cache {
                    allocator.empty_cache()?;
                }
            }
            Cycle::Oversize => {
                for size in [64 * MIB, TENSOR] {
                    let tensor = allocator.malloc(size, stream(0))?;
                    allocator.free(tensor)?;
                }
            }
            Cycle::Oom | Cycle::OomBesidePool => {
                match allocator.malloc(device, stream(cycle % streams)) {
                    Err(AllocatorError::OutOfMemory(_)) => {}
                    other => return Err(format!("expected an out-of-memory error, got {other:?}").into()),
                }
                let tensor = allocator.malloc(TENSOR, stream(cycle % streams))?;
                allocator.free(tensor)?;
            }
            Cycle::OomAfterDeferredFree => {
                let side = StreamId(0x900);
                let used = allocator.malloc(512, stream(0))?;
                allocator.backend_mut().hold_stream(side);
                allocator.record_stream(&used, side)?;
                allocator.free(used)?;
                kept.push(allocator.malloc(512, stream(0))?);
                let new_stream = stream(streams + 1 + cycle);
                match allocator.malloc(device, new_stream) {
                    Err(AllocatorError::OutOfMemory(_)) => {}
                    other => return Err(format!("expected an out-of-memory error, got {other:?}").into()),
                }
                // One whole page, so that no free block is left per cycle (each would add to
                // the walk of the failure's own full release).
                kept.push(allocator.malloc(20 * MIB, new_stream)?);
            }
            Cycle::GiveBackRefused => {
                for (size, on) in [(40 * MIB, 1), (60 * MIB, 0)] {
                    let tensor = allocator.malloc(size, stream(on))?;
                    allocator.free(tensor)?;
                }
            }
            Cycle::GiveBackOpensRoom => {
                for size in [16 * MIB, 30 * MIB] {
                    let tensor = allocator.malloc(size, stream(0))?;
                    allocator.free(tensor)?;
                }
            }
            Cycle::PartlyMapped => {
                let grown = allocator.malloc(100 * MIB, stream(0))?;
                allocator.free(grown)?;
                partly_layout(&mut allocator)?;
            }
            Cycle::Pieces => {
                let grown = allocator.malloc(60 * MIB, stream(0))?;
                allocator.free(grown)?;
                pieces_layout(&mut allocator)?;
            }
        }
    }
    let mut snapshot = torch::from_allocator(&allocator, None);
    // Each pool call follows a `snapshot` entry, as `capture_pools.py` records them.
    let program_calls = cachalot_trace::replay::record_pool_calls(&mut snapshot.device_traces[0], &calls);
    let options = ReplayOptions {
        config,
        memory_fraction: fraction,
        device_total: device,
        device: 0,
        calls: (!calls.is_empty()).then_some(program_calls),
        record_calls: false,
    };
    Ok((snapshot, options))
}
