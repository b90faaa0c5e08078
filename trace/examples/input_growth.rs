//! How the readers and replays of this crate grow with each dimension of a hostile input, at
//! n, 2n, 4n and 8n: linear growth reads 1, 2, 4, 8 in the ratio column, quadratic 1, 4, 16, 64.
//! The sibling of `replay_growth.rs` (which grows a trace's entries under release-heavy
//! settings). Each row is the median of `RUNS` runs of:
//!
//! - **streams**: a trace whose every allocation is on a stream of its own (a small segment
//!   each): replayed (`cachalot replay`, `summary`, `stats` of a pickle), rebuilt entry by entry
//!   as the viewer's model does ([`PoolState::apply_entry`]), normalised (`first_difference`,
//!   `replay --check` on a device); and the same as an op file, parsed and replayed with its
//!   streams kept (`summary` and `stats` of an op file);
//! - **repeated entries**: a JSON snapshot whose trace repeats one `alloc` entry (at the same
//!   address, never freed), read and rebuilt as `cachalot view` opens it, each repeat an anomaly;
//! - **marks**: a snapshot with that many marks, read and written as JSON (what `compare` and
//!   `view` read before building their tables);
//! - **devices**: a pickle with that many device traces (one allocation and its free each), read, and each
//!   device replayed on an allocator of its own (`replay --all-devices`, one after the other).
//!
//! ```sh
//! cargo run --release -p cachalot-trace --example input_growth -- 50000 3
//! ```

use std::time::Instant;

use cachalot_core::{AllocatorConfig, CachingAllocator, Mark, SimBackend, StreamId, TraceAction};
use cachalot_trace::Snapshot;
use cachalot_trace::normalized::normalize;
use cachalot_trace::ops::OpFile;
use cachalot_trace::rebuild::{PoolState, Rules};
use cachalot_trace::replay::{ReplayOptions, replay};
use cachalot_trace::snapshot::{pickle, torch};

const USAGE: &str = "usage: input_growth N [RUNS]";
const DEVICE: u64 = 80 << 30;

type Error = Box<dyn std::error::Error>;
/// Builds an input of the given size and returns the seconds of each of its parts.
type Measure = fn(usize) -> Result<Vec<f64>, Error>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().ok_or(USAGE)?.parse().map_err(|_| USAGE)?;
    let runs: usize = args.get(1).map_or(Ok(3), |r| r.parse()).map_err(|_| USAGE)?;
    println!("median of {runs} runs; ratio to the n row (linear: 1, 2, 4, 8)");
    println!("| dimension | what | size | seconds | ratio |");
    println!("| --- | --- | ---: | ---: | ---: |");
    let dimensions: [(&str, &[&str], Measure); 4] = [
        ("streams", &["replay", "rebuild", "normalize", "op file"], streams),
        ("repeated entries", &["read + rebuild"], repeated_entries),
        ("marks", &["JSON read + write"], marks),
        ("devices", &["read + replay each"], devices),
    ];
    for (dimension, parts, measure) in dimensions {
        let mut rows: Vec<(usize, Vec<f64>)> = Vec::new();
        for factor in [1, 2, 4, 8] {
            let size = n * factor;
            let mut samples: Vec<Vec<f64>> = (0..runs.max(1)).map(|_| measure(size)).collect::<Result<_, _>>()?;
            let medians = (0..parts.len())
                .map(|p| {
                    samples.sort_by(|a, b| a[p].total_cmp(&b[p]));
                    samples[samples.len() / 2][p]
                })
                .collect();
            rows.push((size, medians));
        }
        for (p, part) in parts.iter().enumerate() {
            let base = rows[0].1[p].max(1e-9);
            for (size, medians) in &rows {
                println!("| {dimension} | {part} | {size} | {:.4} | {:.2} |", medians[p], medians[p] / base);
            }
        }
    }
    Ok(())
}

/// Seconds `f` takes, and its result.
fn timed<T>(f: impl FnOnce() -> T) -> (f64, T) {
    let started = Instant::now();
    let result = f();
    (started.elapsed().as_secs_f64(), result)
}

/// A recording allocator on the simulator.
fn recorder() -> Result<CachingAllocator<SimBackend>, Error> {
    let mut allocator = CachingAllocator::new(SimBackend::new(DEVICE), AllocatorConfig::default())?;
    allocator.record_history(true, usize::MAX, &[], false);
    Ok(allocator)
}

/// PyTorch's defaults on the device.
fn options() -> ReplayOptions {
    ReplayOptions {
        config: AllocatorConfig::default(),
        memory_fraction: None,
        device_total: DEVICE,
        device: 0,
        calls: None,
        record_calls: false,
    }
}

/// PyTorch's streams are pointers; any distinct non-zero numbers do.
fn stream(n: usize) -> StreamId {
    StreamId(0x1000 + n as u64 * 0x10)
}

fn streams(n: usize) -> Result<Vec<f64>, Error> {
    let mut allocator = recorder()?;
    for s in 0..n {
        let block = allocator.malloc(512, stream(s))?;
        allocator.free(block)?;
    }
    let snapshot = torch::from_allocator(&allocator, None);
    let options = options();
    let (replayed, outcome) = timed(|| replay(&snapshot, &options, |_, _| {}));
    outcome?;
    let trace = &snapshot.device_traces[0];
    let rules = Rules::default();
    let (rebuilt, state) = timed(|| {
        let mut state = PoolState::empty(&rules);
        for i in 0..trace.len() {
            state.apply_entry(trace, i, &rules)?;
        }
        Ok::<_, cachalot_trace::rebuild::Anomaly>(state)
    });
    state.map_err(|a| format!("entry {}: {}", a.index, a.message))?;
    let (normalized, _) = timed(|| normalize(trace));
    let text: String = (0..n).map(|s| format!("a {s} 512 {}\nf {s}\n", stream(s).0)).collect();
    let (ops, result) = timed(|| {
        let ops = OpFile::parse(&text)?;
        let mut allocator = CachingAllocator::new(SimBackend::new(DEVICE), AllocatorConfig::default())?;
        let mut handles = vec![None; ops.handles];
        ops.replay(&mut allocator, &mut handles, false)?;
        Ok::<_, Error>(allocator.stats())
    });
    result?;
    Ok(vec![replayed, rebuilt, normalized, ops])
}

fn repeated_entries(n: usize) -> Result<Vec<f64>, Error> {
    let mut allocator = recorder()?;
    let _kept = allocator.malloc(512, StreamId::DEFAULT)?;
    let mut snapshot = Snapshot::capture(&allocator, "repeated entries");
    let alloc = *snapshot.trace.iter().find(|e| e.action == TraceAction::Alloc).ok_or("no alloc entry")?;
    snapshot.trace.extend(std::iter::repeat_n(alloc, n));
    let json = snapshot.to_json();
    let rules = Rules::default();
    let (seconds, anomalies) = timed(|| {
        let snapshot = Snapshot::from_json(&json)?;
        let mut state = PoolState::empty(&rules);
        let anomalies = (0..snapshot.trace.len()).filter(|&i| state.apply_entry(&snapshot.trace, i, &rules).is_err());
        Ok::<_, Error>(anomalies.count())
    });
    if anomalies? < n {
        return Err("every repeated alloc should be an anomaly".into());
    }
    Ok(vec![seconds])
}

fn marks(n: usize) -> Result<Vec<f64>, Error> {
    let mut allocator = recorder()?;
    let mut snapshot = Snapshot::capture(&allocator, "marks");
    let block = allocator.malloc(512, StreamId::DEFAULT)?;
    for i in 0..n {
        snapshot.marks.push(Mark {
            label: format!("step {i}"),
            trace_index: 1,
            allocated: allocator.memory_allocated(),
            reserved: allocator.memory_reserved(),
            time_us: 0,
        });
    }
    allocator.free(block)?;
    let json = snapshot.to_json();
    let (seconds, read) = timed(|| Snapshot::from_json(&json).map(|s| s.to_json().len()));
    read?;
    Ok(vec![seconds])
}

fn devices(n: usize) -> Result<Vec<f64>, Error> {
    let mut allocator = recorder()?;
    let block = allocator.malloc(512, StreamId::DEFAULT)?;
    allocator.free(block)?;
    let mut snapshot = torch::from_allocator(&allocator, None);
    let trace = snapshot.device_traces[0].clone();
    let per_device = trace.len();
    snapshot.device_traces = vec![trace; n];
    snapshot.segments.clear();
    let bytes = pickle::write_snapshot(&snapshot)?;
    let (seconds, replayed) = timed(|| {
        let snapshot = pickle::read_snapshot(&bytes)?;
        let options = options();
        let mut entries = 0;
        for device in 0..snapshot.device_traces.len() {
            let options = options.for_device(device, None);
            entries += replay(&snapshot, &options, |_, _| {})?.entries;
        }
        Ok::<_, Error>(entries)
    });
    if replayed? != per_device * n {
        return Err("each device replays its entries".into());
    }
    Ok(vec![seconds])
}
