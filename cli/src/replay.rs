//! `cachalot replay TRACE... [--check] [--backend sim|cuda|wgpu]`: replays recorded PyTorch
//! traces through the allocator on the simulator and, with `--check`, compares the result with
//! what PyTorch recorded; with `--backend cuda|wgpu`, makes the trace's allocator calls again on
//! a device's memory (`cachalot_runtime::trace_replay`).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use cachalot_core::{AllocatorConfig, CachingAllocator, DeviceAllocators, OomEvent, OomObserver, SimBackend};
use cachalot_trace::Snapshot;
use cachalot_trace::explain::At;
use cachalot_trace::oom_snapshots::OomSnapshots;
use cachalot_trace::replay::{ReplayOptions, ReplayOutcome, replay_observed, verify_against_recording};
use cachalot_trace::snapshot::torch::TorchSnapshot;
use cachalot_trace::snapshot::{FileFormat, pickle};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::failure::{Failure, Outcome};
use crate::input::{parse, trace_name};

mod devices;
use crate::report::expected_for_device;

/// Arguments of `cachalot replay`.
#[derive(Clone, Debug, clap::Args)]
pub struct ReplayArgs {
    /// PyTorch snapshot pickles with a recorded trace (`_dump_snapshot`).
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// Compare with what PyTorch recorded: segment events, final segments and blocks, and with
    /// NAME.expected.json beside the trace every memory_stats key, the summary and OOM messages.
    #[arg(long)]
    pub check: bool,
    /// Allocator configuration (default: the trace's own `allocator_settings`).
    #[arg(long)]
    pub config: Option<String>,
    /// Memory fraction (default: from NAME.expected.json).
    // A negative value reaches the range check (which names the flag) instead of being read as a flag.
    #[arg(long, allow_negative_numbers = true)]
    pub memory_fraction: Option<f64>,
    /// Total device memory in bytes (default: from NAME.expected.json, else an H200's).
    #[arg(long)]
    pub device_total: Option<u64>,
    /// Which device trace to replay (NAME.expected.json describes device 0 only).
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Replay every device trace of the snapshot at once, each on an allocator of its own, and
    /// report (or --check) each device.
    #[arg(long, conflicts_with = "device")]
    pub all_devices: bool,
    /// At every out-of-memory error of the replay, write the allocator's snapshot as that error
    /// left it to this directory (NAME.oom-N.json), through an OOM observer; then print the
    /// first error's main cause and the `cachalot explain` command that proves a fix.
    #[arg(long)]
    pub oom_snapshot: Option<PathBuf>,
    /// Write the replay's result: a cachalot snapshot (.json) or a PyTorch pickle (.pickle).
    /// With several traces, a directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Where the allocator's memory lives: `sim` (the simulator, exact against the recording),
    /// `cuda` (a CUDA device's memory, a CUDA stream per trace stream) or `wgpu` (a wgpu
    /// adapter's buffers: every trace stream keeps its own pools, all on the one queue). On a
    /// device, deferred frees complete where the recording's did, a device limit that refuses a
    /// request is named with the request and its trace entry, and `--check` compares the
    /// device's events with the recording's, addresses as segment + offset.
    #[arg(long, default_value = "sim", value_parser = ["sim", "cuda", "wgpu"])]
    pub backend: String,
    /// With `--backend wgpu`: the adapter's index in wgpu's enumeration (default: the best);
    /// with `--backend cuda`: the device's ordinal (default: 0).
    #[arg(long)]
    pub adapter: Option<usize>,
}

/// Runs the command: one line per trace; exit status 1 if any trace mismatches, 2 on bad input.
pub fn run(args: &ReplayArgs) -> Outcome {
    if args.oom_snapshot.as_ref().is_some_and(|d| !d.is_dir()) {
        return Err(Failure::input(anyhow!("--oom-snapshot must be an existing directory")));
    }
    if args.backend != "sim" && (args.out.is_some() || args.oom_snapshot.is_some()) {
        return Err(Failure::input(anyhow!(
            "--out and --oom-snapshot need --backend sim: they write the simulator's allocator, which places \
             segments where PyTorch's did"
        )));
    }
    if args.adapter.is_some() && args.backend == "sim" {
        return Err(Failure::input(anyhow!("--adapter applies to --backend cuda or wgpu only")));
    }
    if args.all_devices && (args.backend != "sim" || args.out.is_some() || args.oom_snapshot.is_some()) {
        return Err(Failure::input(anyhow!(
            "--all-devices replays on the simulator and writes nothing: no --backend, --out or --oom-snapshot"
        )));
    }
    if args.out.as_ref().is_some_and(|o| args.traces.len() > 1 && !o.is_dir()) {
        return Err(Failure::input(anyhow!("--out must be an existing directory when replaying several traces")));
    }
    if let [path] = &args.traces[..] {
        return match replay_file(args, path)? {
            true => Ok(()),
            false => Err(Failure { status: 1, error: anyhow!("1 of 1 traces did not match") }),
        };
    }
    // Several traces are a batch, as a test runner's: each gets its line (a file that cannot be
    // read or replayed an ERROR line), and the exit status is the worst of them.
    let (mut mismatches, mut errors) = (0, 0);
    for path in &args.traces {
        match replay_file(args, path) {
            Ok(true) => {}
            Ok(false) => mismatches += 1,
            Err(failure) => {
                errors += 1;
                let message = format!("{:#}", failure.error);
                match message.starts_with(&path.display().to_string()) {
                    true => println!("ERROR {message}"),
                    false => println!("ERROR {}: {message}", path.display()),
                }
            }
        }
    }
    let total = args.traces.len();
    match (errors, mismatches) {
        (0, 0) => Ok(()),
        (0, _) => Err(Failure { status: 1, error: anyhow!("{mismatches} of {total} traces did not match") }),
        _ => Err(Failure::input(anyhow!(
            "{errors} of {total} traces could not be replayed (ERROR above), {mismatches} did not match"
        ))),
    }
}

/// Reads, replays and reports one trace; `Ok(false)` when `--check` found a difference.
fn replay_file(args: &ReplayArgs, path: &Path) -> Result<bool, Failure> {
    let bytes = crate::input::read(path)?;
    if FileFormat::detect(&bytes) != FileFormat::TorchPickle {
        parse(path, &bytes)?;
        return Err(Failure::input(anyhow!("{}: not a PyTorch snapshot pickle", path.display())));
    }
    // The replay runs on a second thread while this one frees what the pickle reader built
    // (a large trace's value graph takes as long to free as the replay takes to run).
    std::thread::scope(|scope| {
        let replaying = pickle::read_snapshot_then(&bytes, |read| {
            read.map(|snapshot| scope.spawn(move || replay_snapshot(args, path, &snapshot)))
        })
        .map_err(|e| Failure::input(anyhow!("{}: {e}", path.display())))?;
        replaying.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Replays `snapshot`, read from `path`, and prints its line.
fn replay_snapshot(args: &ReplayArgs, path: &Path, snapshot: &TorchSnapshot) -> Result<bool, Failure> {
    let name = trace_name(path);
    // Each device's recorded run (its stats, its calls) is a file of its own.
    let expected = expected_for_device(path, args.device)?;
    let options = options(args, path, snapshot, expected.as_ref())?;
    if args.all_devices {
        let recorded = (0..snapshot.device_traces.len())
            .map(|device| if device == 0 { Ok(expected.clone()) } else { expected_for_device(path, device) })
            .collect::<Result<Vec<_>>>()?;
        return replay_every_device(args, &name, snapshot, &options, &recorded);
    }
    if args.backend != "sim" {
        return Ok(replay_on_device(args, &name, snapshot, &options)?);
    }
    let started = Instant::now();
    let bar = progress_bar(&name);
    let dumps = match &args.oom_snapshot {
        Some(dir) => Some(
            OomSnapshots::new(dir, &name, &format!("replay of {}", path.display()))
                .map_err(|e| Failure::input(anyhow!(e)))?,
        ),
        None => None,
    };
    let observers: Vec<OomObserver<SimBackend>> = dumps
        .iter()
        .map(|dumps| {
            let observer = dumps.observer();
            Arc::new(move |event: &OomEvent, allocator: &CachingAllocator<SimBackend>| observer(event, allocator))
                as OomObserver<SimBackend>
        })
        .collect();
    let outcome = replay_observed(snapshot, &options, &observers, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .map_err(|e| Failure::input(anyhow!("{}: {e}", path.display())))?;
    if let Some(error) = dumps.as_ref().and_then(OomSnapshots::first_error) {
        return Err(Failure::input(anyhow!(error)));
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    if let Some(out) = &args.out {
        write_result(out, &name, &outcome.allocator, path, snapshot)?;
    }
    // Where the first error's snapshot was written, its short answer, and the command that
    // explains it in full (the snapshot carries the device, settings and fraction replayed).
    let explained = match (&dumps, &args.oom_snapshot, outcome.ooms.first()) {
        (Some(dumps), Some(dir), Some(first)) if dumps.written() > 0 => {
            let written = dir.join(format!("{name}.oom-1.json"));
            let command = format!("cachalot explain {}", written.display());
            Some(crate::explain::at_error(snapshot, &options, At::Entry(first.index), &command))
        }
        _ => None,
    };
    let explained = explained.as_deref().unwrap_or("");
    if !args.check {
        let a = &outcome.allocator;
        println!(
            "{name}: {} entries in {seconds:.2} s, {} segments, allocated {} B, reserved {} B, {} OOMs",
            outcome.entries,
            a.snapshot().len(),
            a.memory_allocated(),
            a.memory_reserved(),
            a.stats().num_ooms
        );
        print!("{explained}");
        warn_unchecked(&name, snapshot, &outcome, expected.as_ref());
        return Ok(true);
    }
    let matched = match verify_against_recording(snapshot, &outcome, expected.as_ref()) {
        Ok(()) => {
            println!("MATCH {name}");
            true
        }
        Err(difference) => {
            println!("MISMATCH {name}: {difference}");
            false
        }
    };
    print!("{explained}");
    Ok(matched)
}

/// `--all-devices`: replays every device trace at once and prints a line per device (with
/// `--check`, MATCH or MISMATCH against what PyTorch recorded for that device: its trace and
/// end state, and where `recorded` has one, its expected.json's stats, summary and marks).
/// `Ok(false)` when a device mismatched.
fn replay_every_device(
    args: &ReplayArgs,
    name: &str,
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    recorded: &[Option<cachalot_trace::replay::ExpectedRun>],
) -> Result<bool, Failure> {
    let started = Instant::now();
    let outcomes =
        devices::replay_devices(snapshot, options, recorded).map_err(|e| Failure::input(anyhow!("{name}: {e}")))?;
    let seconds = started.elapsed().as_secs_f64();
    let mut all_match = true;
    for outcome in &outcomes {
        let device = outcome.device;
        if args.check {
            match verify_against_recording(snapshot, outcome, recorded[device].as_ref()) {
                Ok(()) => println!("MATCH {name} device {device}"),
                Err(difference) => {
                    all_match = false;
                    println!("MISMATCH {name} device {device}: {difference}");
                }
            }
        }
    }
    if !args.check {
        for outcome in &outcomes {
            warn_unchecked(
                &format!("{name} device {}", outcome.device),
                snapshot,
                outcome,
                recorded[outcome.device].as_ref(),
            );
        }
        let entries: usize = outcomes.iter().map(|o| o.entries).sum();
        println!("{name}: {} devices, {entries} entries in {seconds:.2} s", outcomes.len());
        let devices = DeviceAllocators::from_allocators(outcomes.into_iter().map(|o| o.allocator).collect());
        for (device, a) in devices.iter().enumerate() {
            let stats = a.stats();
            println!(
                "{name} device {device}: {} segments, allocated {} B, reserved {} B, peak reserved {} B, {} OOMs",
                a.snapshot().len(),
                a.memory_allocated(),
                a.memory_reserved(),
                stats.max_memory_reserved(),
                stats.num_ooms
            );
        }
    }
    Ok(all_match)
}

/// Replays `snapshot` on a CUDA or wgpu device and prints the simulator's line for it, then the peaks
/// and device calls, and the first request a device limit refused (each such request is an OOM
/// of the result; the replay goes on without its block, and the block's free is skipped).
fn replay_on_device(args: &ReplayArgs, name: &str, snapshot: &TorchSnapshot, options: &ReplayOptions) -> Result<bool> {
    use cachalot_runtime::trace_replay::{check_events, replay_on_cuda, replay_on_wgpu, tie_broken_by_address};
    use cachalot_trace::normalized::EventDiff;
    let started = Instant::now();
    let device = if args.backend == "cuda" {
        replay_on_cuda(snapshot, options, args.adapter.unwrap_or(0))
    } else {
        replay_on_wgpu(snapshot, options, args.adapter)
    }
    .with_context(|| format!("{name}: replay on {}", args.backend))?;
    let seconds = started.elapsed().as_secs_f64();
    println!("{name}: on {}, {}", args.backend, device.device);
    println!(
        "{name}: {} entries in {seconds:.2} s, {} segments, allocated {} B, reserved {} B, {} OOMs",
        device.entries,
        device.segments,
        device.allocated,
        device.reserved,
        device.ooms.len()
    );
    println!(
        "{name}: peak allocated {} B, peak reserved {} B, device allocations {}, device frees {}",
        device.peak_allocated, device.peak_reserved, device.device_allocs, device.device_frees
    );
    if let Some(hit) = device.limits.first() {
        println!(
            "{name}: first request refused by a device limit: device_traces[{}][{}], {} B: {}",
            options.device, hit.index, hit.size, hit.limit
        );
        if device.limits.len() > 1 {
            let last = device.limits.last().map_or(0, |h| h.index);
            println!("{name}: {} more refused by device limits, the last at entry {last}", device.limits.len() - 1);
        }
    }
    if device.skipped_frees > 0 {
        println!("{name}: {} frees skipped: their allocations failed on this device", device.skipped_frees);
    }
    if !args.check {
        return Ok(true);
    }
    let trace = &snapshot.device_traces[options.device];
    let diff = check_events(trace, &device);
    if let EventDiff::Identical { entries } = diff {
        println!("MATCH {name}: the device's {entries} events are the recording's, addresses as segment + offset");
        return Ok(true);
    }
    println!("MISMATCH {name}: events as segment + offset {diff}");
    if tie_broken_by_address(&diff) {
        println!(
            "{name}: the same request took another block of the same fit: PyTorch breaks best-fit ties by address, \
             and this device laid its segments out in another order than the recording's"
        );
    }
    Ok(false)
}

/// A replay without `--check` still says on stderr where it departed from the recording
/// (a request it could not serve, an address or a segment other than PyTorch's): the exit
/// status stays 0, but the result is not silently taken for PyTorch's.
fn warn_unchecked(
    name: &str,
    snapshot: &TorchSnapshot,
    outcome: &ReplayOutcome,
    expected: Option<&cachalot_trace::replay::ExpectedRun>,
) {
    if let Err(difference) = verify_against_recording(snapshot, outcome, expected) {
        eprintln!("cachalot: {name}: the replay differs from the recording (--check reports it): {difference}");
    }
}

fn options(
    args: &ReplayArgs,
    path: &Path,
    snapshot: &TorchSnapshot,
    expected: Option<&cachalot_trace::replay::ExpectedRun>,
) -> Result<ReplayOptions> {
    let mut options = ReplayOptions::for_snapshot(snapshot, expected)
        .with_context(|| crate::input::settings_place(path, expected.is_some()))?;
    if let Some(settings) = &args.config {
        options.config = AllocatorConfig::parse(settings).context("--config")?;
    }
    if let Some(fraction) = args.memory_fraction {
        if !(0.0..=1.0).contains(&fraction) {
            bail!("--memory-fraction {fraction}: must be within [0, 1]");
        }
        options.memory_fraction = Some(fraction);
    }
    if let Some(total) = args.device_total {
        options.device_total = total;
    }
    options.device = args.device;
    Ok(options)
}

/// A bar on a terminal, nothing when stderr is redirected.
fn progress_bar(name: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} entries ({eta})") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(name.to_owned());
    bar
}

fn write_result(
    out: &Path,
    name: &str,
    allocator: &cachalot_core::CachingAllocator<cachalot_core::SimBackend>,
    trace: &Path,
    source: &TorchSnapshot,
) -> Result<()> {
    let target = if out.is_dir() { out.join(format!("{name}.replay.json")) } else { out.to_path_buf() };
    let bytes = if target.extension().is_some_and(|e| e == "pickle") {
        let torch = cachalot_trace::snapshot::torch::from_allocator(allocator, source.allocator_settings.clone());
        pickle::write_snapshot(&torch).map_err(|e| anyhow!("{}: {e}", target.display()))?
    } else {
        Snapshot::capture(allocator, format!("replay of {}", trace.display())).to_json()
    };
    Ok(cachalot_trace::output::write_atomic(&target, &bytes)?)
}
