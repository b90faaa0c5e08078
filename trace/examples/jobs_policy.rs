//! Whether real jobs settle under `policy:cachalot`: every trace pickle of a folder (with the
//! `NAME.expected.json` PyTorch recorded beside it) replayed under the job's own settings plus
//! `policy:cachalot`, with the peak reserved relative to PyTorch's recorded peak, and the device
//! calls (`num_device_alloc` + `num_device_free`) and 2 MiB pages mapped and unmapped (what a
//! call costs on CUDA grows with its pages) in the steady half of the job's steps.
//!
//! `cargo run --release -p cachalot-trace --example jobs_policy -- DIR [EXTRA_SETTINGS]`
//!
//! EXTRA_SETTINGS are added to each job's own (e.g. to try another ceiling). The steady half
//! runs from the step boundary at or after the middle of the trace's entries to the last step
//! boundary: a step boundary is an entry after which live memory equals what the job's last
//! step mark recorded (`memory_allocated()`, within 0.2%: the trace's requests rounded as
//! PyTorch rounds them, boundaries within 1% of the trace merged) and the next entry is an allocation. The marks carry no entry index, so this is where
//! the steps' own memory says they end; `steps` is how many such boundaries the half crosses
//! (a ragged server's requests, where its marks are every few requests). The half is replayed
//! as the difference of two replays, the whole trace and the trace cut at the half's start.

use std::process::ExitCode;

use cachalot_core::config::AllocatorConfig;
use cachalot_core::size::round_size;
use cachalot_core::trace::{TraceAction, TraceEntry};
use cachalot_trace::replay::{ExpectedRun, ReplayOptions, replay};
use cachalot_trace::snapshot::pickle::read_snapshot;
use cachalot_trace::snapshot::torch::TorchSnapshot;
use cachalot_trace::tune::own_policy_settings;

/// The page a device call maps or unmaps at a time on CUDA (the driver's granularity).
const PAGE: u64 = 2 << 20;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("jobs_policy: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        return Err("usage: jobs_policy DIR [EXTRA_SETTINGS]".into());
    };
    let extra = args.get(1).map_or("", String::as_str);
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{dir}: {e}"))?;
    let mut pickles: Vec<_> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|x| x == "pickle"))
        .collect();
    pickles.sort();
    let mut log_ratios = Vec::new();
    println!(
        "job | peak reserved / PyTorch's | device calls, whole trace | steady half: calls, pages, steps | per step: calls, pages"
    );
    for path in &pickles {
        let name = path.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_default();
        let job = measure(path).map_err(|e| format!("{name}: {e}"))?;
        let Job { ratio, calls, half_calls, half_pages, steps } = job(extra)?;
        log_ratios.push(ratio.ln());
        let per_step = |n: u64| if steps > 0 { format!("{:.2}", n as f64 / steps as f64) } else { "-".into() };
        println!(
            "{name} | {ratio:.3} | {calls} | {half_calls}, {half_pages}, {steps} | {}, {}",
            per_step(half_calls),
            per_step(half_pages)
        );
    }
    let geomean = (log_ratios.iter().sum::<f64>() / log_ratios.len().max(1) as f64).exp();
    let highest = log_ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max).exp();
    println!("geometric mean {geomean:.3} over {} jobs, highest {highest:.3}", log_ratios.len());
    Ok(())
}

/// One job's figures under `policy:cachalot`.
struct Job {
    /// Peak reserved over PyTorch's recorded peak reserved.
    ratio: f64,
    /// Device calls of the whole replay.
    calls: u64,
    /// Device calls of the steady half.
    half_calls: u64,
    /// Pages (2 MiB) mapped and unmapped in the steady half.
    half_pages: u64,
    /// Step boundaries the steady half crosses.
    steps: usize,
}

/// Loads the job at `path` and returns what replays it with extra settings.
fn measure(path: &std::path::Path) -> Result<impl Fn(&str) -> Result<Job, String>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let snapshot = read_snapshot(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let expected = ExpectedRun::beside(path)?.ok_or_else(|| format!("no expected.json beside {}", path.display()))?;
    let pytorch_peak =
        *expected.memory_stats.get("reserved_bytes.all.peak").ok_or("expected.json has no reserved_bytes.all.peak")?
            as f64;
    let own = AllocatorConfig::parse(&expected.settings).map_err(|e| e.to_string())?;
    let trace = snapshot.device_traces.first().ok_or("no device trace")?;
    let (start, end, steps) = steady_half(trace, &own, &expected);
    let len = trace.len();
    Ok(move |extra: &str| {
        let mut settings = own_policy_settings(&expected.settings);
        if !extra.is_empty() {
            settings = format!("{settings},{extra}");
        }
        let mut options = ReplayOptions::for_snapshot(&snapshot, Some(&expected)).map_err(|e| e.to_string())?;
        options.config = AllocatorConfig::parse(&settings).map_err(|e| format!("'{settings}': {e}"))?;
        let (_, calls_to_end, pages_to_end) = replay_to(&snapshot, &options, end)?;
        let (_, calls_to_start, pages_to_start) = replay_to(&snapshot, &options, start)?;
        let (peak, calls, _) = replay_to(&snapshot, &options, len)?;
        Ok(Job {
            ratio: peak as f64 / pytorch_peak,
            calls,
            half_calls: calls_to_end - calls_to_start,
            half_pages: pages_to_end - pages_to_start,
            steps,
        })
    })
}

/// Peak reserved, device calls and pages moved (2 MiB each) of the replay of the first `len` entries of device 0.
fn replay_to(snapshot: &TorchSnapshot, options: &ReplayOptions, len: usize) -> Result<(u64, u64, u64), String> {
    let mut cut = TorchSnapshot { device_traces: snapshot.device_traces.clone(), ..snapshot.clone() };
    cut.device_traces[0].truncate(len);
    let mut options = options.clone();
    if let Some(calls) = options.calls.as_mut() {
        calls.retain(|call| call.at < len);
    }
    let outcome = replay(&cut, &options, |_, _| {}).map_err(|e| e.to_string())?;
    let ooms = outcome.ooms.iter().filter(|oom| !oom.recorded).count();
    if ooms > 0 {
        return Err(format!("{ooms} OOMs the recording did not have"));
    }
    let stats = outcome.allocator.stats();
    // Bytes mapped and unmapped (or allocated and freed) in 2 MiB pages: what a device call
    // costs on CUDA grows with its pages (each is a physical allocation of its own).
    let moved: u64 = outcome
        .allocator
        .trace()
        .iter()
        .filter(|e| {
            matches!(
                e.action,
                TraceAction::SegmentAlloc
                    | TraceAction::SegmentFree
                    | TraceAction::SegmentMap
                    | TraceAction::SegmentUnmap
            )
        })
        .map(|e| e.size.div_ceil(PAGE))
        .sum();
    Ok((stats.max_memory_reserved(), stats.num_device_alloc + stats.num_device_free, moved))
}

/// The steady half's first and end entry, and the step boundaries it crosses (module doc).
fn steady_half(trace: &[TraceEntry], config: &AllocatorConfig, expected: &ExpectedRun) -> (usize, usize, usize) {
    let Some(last) =
        expected.marks.iter().rev().find_map(|mark| mark.allocated.filter(|_| is_step(&mark.label, expected)))
    else {
        return (trace.len() / 2, trace.len(), 0);
    };
    // PyTorch hands a block whole where its remainder is too small to split, so live memory
    // counted from the requests falls short of the mark by a little.
    let near = |live: u64| live.abs_diff(last) <= last / 500;
    let mut live = 0u64;
    let mut boundaries: Vec<usize> = Vec::new();
    for (at, entry) in trace.iter().enumerate() {
        let rounded = round_size(entry.size, config.roundup_power2_divisions());
        match entry.action {
            TraceAction::Alloc => live += rounded,
            TraceAction::FreeRequested => live = live.saturating_sub(rounded),
            _ => continue,
        }
        let next_allocates = trace[at + 1..]
            .iter()
            .find(|e| !matches!(e.action, TraceAction::FreeCompleted | TraceAction::Snapshot))
            .is_none_or(|e| e.action == TraceAction::Alloc);
        if near(live) && next_allocates {
            // Boundaries a few entries apart are one (the last small frees of a step).
            match boundaries.last_mut() {
                Some(previous) if at + 1 - *previous <= trace.len() / 100 => *previous = at + 1,
                _ => boundaries.push(at + 1),
            }
        }
    }
    let middle = trace.len() / 2;
    let half: Vec<usize> = boundaries.into_iter().filter(|&at| at >= middle).collect();
    match (half.first(), half.last()) {
        (Some(&start), Some(&end)) if end > start => (start, end, half.len() - 1),
        _ => (middle, trace.len(), 0),
    }
}

/// Whether a mark ends a step: a label with a number in it, and where some label names a
/// step, only those (a batch-size search's trials before its steps are not steps).
fn is_step(label: &str, expected: &ExpectedRun) -> bool {
    let steps_named = expected.marks.iter().any(|mark| mark.label.contains("step"));
    label.chars().any(|c| c.is_ascii_digit()) && (!steps_named || label.contains("step"))
}
