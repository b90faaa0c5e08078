//! `cachalot explain TRACE|SNAPSHOT [--at oom|peak|ENTRY] [--json]`: why a request of a
//! recorded job ran out of memory and the smallest change that lets the job through, proven by
//! replay. The analysis is `cachalot_trace::explain`; this module reads the file and writes
//! the answer: the cause and the fix first, then the detail.

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use cachalot_core::AllocatorConfig;
use cachalot_core::error::format_size;
use cachalot_trace::explain::{At, Cause, ClassBytes, ExplainOptions, Explanation, explain};
use cachalot_trace::replay::ReplayOptions;
use cachalot_trace::snapshot::Snapshot;
use cachalot_trace::snapshot::torch::{self, TorchSnapshot};

use crate::failure::{Failure, Outcome};
use crate::input::parse_bytes;
use crate::input::trace_name;
use crate::input::{Input, load};
use crate::report::expected_for_device;

/// Arguments of `cachalot explain`.
#[derive(Clone, Debug, clap::Args)]
pub struct ExplainArgs {
    /// A PyTorch snapshot pickle with a recorded trace, or a cachalot snapshot (JSON);
    /// NAME.expected.json beside a pickle gives its settings, memory fraction and device.
    pub trace: PathBuf,
    /// Which request: `oom` (the first out-of-memory error), `peak` (the allocation at the
    /// peak of live memory) or a trace entry's index.
    #[arg(long, default_value = "oom", value_parser = parse_at)]
    pub at: At,
    /// As JSON, for tools.
    #[arg(long)]
    pub json: bool,
    /// Leave out the fix search (it replays the whole trace under candidate changes).
    #[arg(long)]
    pub no_fix: bool,
    /// How many of the stacks holding the most live memory to name.
    #[arg(long, default_value_t = 5)]
    pub stacks: usize,
    /// Allocator configuration (default: the trace's own).
    #[arg(long)]
    pub config: Option<String>,
    /// Total device memory (bytes or a KiB/MiB/GiB suffix; default: from NAME.expected.json,
    /// else an H200's).
    #[arg(long, value_parser = parse_bytes)]
    pub device_total: Option<u64>,
    /// Which device trace.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

fn parse_at(text: &str) -> Result<At, String> {
    match text {
        "oom" => Ok(At::FirstOom),
        "peak" => Ok(At::Peak),
        _ => text.parse().map(At::Entry).map_err(|_| format!("'{text}' is not oom, peak or an entry index")),
    }
}

/// Runs the command; exit status 2 on bad input.
pub fn run(args: &ExplainArgs) -> Outcome {
    let (snapshot, options) = read(args)?;
    let how = ExplainOptions { at: args.at, search_fix: !args.no_fix, stacks: args.stacks };
    let explanation =
        explain(&snapshot, &options, &how).map_err(|e| Failure::input(anyhow!("{}: {e}", args.trace.display())))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&explanation).context("explain as JSON")?);
    } else {
        print!("{}", text(&trace_name(&args.trace), &explanation));
    }
    Ok(())
}

fn read(args: &ExplainArgs) -> Result<(TorchSnapshot, ReplayOptions), Failure> {
    let path = &args.trace;
    let (snapshot, expected) = match load(path)? {
        Input::Torch(snapshot) => (*snapshot, expected_for_device(path, args.device)?),
        Input::Cachalot(snapshot) => {
            let (torch, mut options) =
                of_cachalot(&snapshot).with_context(|| format!("{}: allocator settings", path.display()))?;
            override_options(args, &mut options)?;
            return Ok((torch, options));
        }
        Input::Ops(_) => {
            return Err(Failure::input(anyhow!("{}: an op file has no recorded trace to explain", path.display())));
        }
    };
    let mut options = ReplayOptions::for_snapshot(&snapshot, expected.as_ref())
        .with_context(|| crate::input::settings_place(path, expected.is_some()))?;
    override_options(args, &mut options)?;
    Ok((snapshot, options))
}

/// A cachalot snapshot's trace, and the options it was recorded under: its settings, its
/// device's memory and its memory fraction are in the file.
pub fn of_cachalot(snapshot: &Snapshot) -> anyhow::Result<(TorchSnapshot, ReplayOptions)> {
    let torch = torch::from_snapshot(snapshot)?;
    let mut options = ReplayOptions::for_snapshot(&torch, None)?;
    options.device_total = snapshot.device.total_memory;
    options.memory_fraction = snapshot.memory_fraction;
    Ok((torch, options))
}

fn override_options(args: &ExplainArgs, options: &mut ReplayOptions) -> Result<(), Failure> {
    if let Some(settings) = &args.config {
        options.config = AllocatorConfig::parse(settings).context("--config")?;
    }
    if let Some(total) = args.device_total {
        if total == 0 {
            return Err(Failure::input(anyhow!("--device-total must be more than 0 bytes")));
        }
        options.device_total = total;
    }
    options.device = args.device;
    Ok(())
}

fn size(bytes: u64) -> String {
    format_size(bytes)
}

fn class_line(c: &ClassBytes, pool: &str) -> String {
    let pool =
        if pool == "small" { cachalot_core::size::PoolKind::Small } else { cachalot_core::size::PoolKind::Large };
    let blocks = if c.blocks == 1 { "block".to_owned() } else { "blocks".to_owned() };
    format!(
        "{:>12} in {:>5} {blocks:<6} (largest {:>10})  {}",
        size(c.bytes),
        c.blocks,
        size(c.largest_block),
        c.cause.describe(pool)
    )
}

/// The short answer where an out-of-memory error happens (`cachalot run`, `cachalot replay
/// --oom-snapshot`): what failed and its main cause, from `explain` stopped at the request
/// `at`, and `command`, the `cachalot explain` that searches for the fix and proves it by
/// replay (a search of many replays, left to the user to start).
pub fn at_error(snapshot: &TorchSnapshot, options: &ReplayOptions, at: At, command: &str) -> String {
    let how = ExplainOptions { at, search_fix: false, stacks: 0 };
    match explain(snapshot, options, &how) {
        Ok(x) => {
            let r = &x.request;
            let what = format!("entry {}: {} asked ({} pool)", x.entry, size(r.size), r.pool);
            let next = match x.main_cause {
                Some(Cause::LiveExceedsDevice) => "no allocator setting helps; the stacks holding the live memory",
                _ => "the fix, proven by replay",
            };
            match x.main_cause_line(size) {
                Some(line) => format!("out of memory at {what}\n  {line}\n  {next}: {command}\n"),
                None => format!("out of memory at {what}: the replay serves it\n  more: {command}\n"),
            }
        }
        Err(error) => format!("out of memory, not explained: {error}\n"),
    }
}

/// The answer for people: what failed, the main cause and the fix in the first lines; then
/// where the memory was, why the cached bytes could not serve it, the retry chain and the stacks.
fn text(name: &str, x: &Explanation) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let r = &x.request;
    let m = &x.memory;
    let what = if x.failed { "ran out of memory" } else { "was served" };
    let _ = writeln!(
        out,
        "{name}: entry {} {what}: {} asked (rounded to {}, {} pool, stream {:#x})",
        x.entry,
        size(r.size),
        size(r.rounded),
        r.pool,
        r.stream
    );
    match x.main_cause_line(size) {
        Some(line) => {
            let _ = writeln!(out, "{line}");
        }
        None => {
            let from = if r.segment_size == 0 {
                "from the cache".to_owned()
            } else {
                format!("with {} of new memory", size(r.segment_size))
            };
            let _ = writeln!(out, "served {from}");
        }
    }
    match (&x.fix, x.main_cause) {
        (_, Some(Cause::LiveExceedsDevice)) => {
            let _ = writeln!(
                out,
                "fix: no allocator setting helps: live memory alone exceeds the device; free or shrink what the stacks below hold"
            );
        }
        (Some(search), _) => match &search.fix {
            Some(fix) => {
                let _ = writeln!(
                    out,
                    "fix (proven by replaying the whole job, {} replays in {:.2} s): {}\n     the job then runs through, peak reserved {} (allocated {})",
                    search.replays,
                    search.seconds,
                    &fix.change.to_string(),
                    size(fix.peak_reserved),
                    size(fix.peak_allocated)
                );
            }
            None if !search.own_settings_fail => {
                let _ = writeln!(
                    out,
                    "fix: not proven: the replay of the whole job serves this request under its own settings, so no change can be shown to help"
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "fix: none of {} replayed changes lets the job through (settings, policy:cachalot, empty_cache before the request{})",
                    search.replays,
                    if m.allowed.is_some() { ", a larger fraction" } else { "" }
                );
            }
        },
        (None, Some(_)) => {
            let _ = writeln!(out, "fix: not searched (--no-fix)");
        }
        (None, None) => {}
    }

    let _ = writeln!(out, "\nmemory (device of {}):", size(m.device_total));
    if m.outside > 0 {
        let _ = writeln!(out, "  outside this allocator {:>12}  (context, NCCL, other processes)", size(m.outside));
    }
    if let Some(allowed) = m.allowed {
        let _ = writeln!(out, "  allowance (fraction)   {:>12}", size(allowed));
    }
    let _ = writeln!(
        out,
        "  reserved               {:>12}  ({} after the retry chain)",
        size(m.reserved),
        size(m.reserved_after)
    );
    let _ = writeln!(
        out,
        "    allocated (live)     {:>12}  (requested {}, rounding waste {})",
        size(m.allocated),
        size(m.requested),
        size(m.rounding_waste)
    );
    let _ = writeln!(out, "    cached, unallocated  {:>12}", size(m.reserved.saturating_sub(m.allocated)));
    let _ = writeln!(out, "  device free after      {:>12}", size(m.device_free_after));

    if x.failed {
        let retry = &x.retry;
        let gc = if retry.garbage_collection { "garbage collection, " } else { "" };
        let _ = writeln!(
            out,
            "\nretry chain ({gc}oversize and full release): released {} in {} segments, completed {} deferred frees; \
             room left {}, needed a segment of {}",
            size(retry.released_bytes),
            retry.released_segments,
            retry.completed_frees,
            size(retry.room_after),
            size(r.segment_size)
        );
        let _ = writeln!(out, "\nwhy the cached bytes could not serve it, after the retry chain:");
        if x.after_retry.is_empty() {
            let _ = writeln!(out, "  nothing is cached: the chain gave everything back");
        }
        for c in &x.after_retry {
            let _ = writeln!(out, "  {}", class_line(c, r.pool));
        }
    }
    let _ = writeln!(out, "\nwhen the request came, the cached bytes were:");
    if x.when_asked.is_empty() {
        let _ = writeln!(out, "  none that could not serve it");
    }
    for c in &x.when_asked {
        let _ = writeln!(out, "  {}", class_line(c, r.pool));
    }
    if !r.frames.is_empty() {
        let _ = writeln!(out, "\nthe stack that asked:");
        for frame in r.frames.iter().take(8) {
            let _ = writeln!(out, "  {frame}");
        }
    }
    if !x.live_stacks.is_empty() {
        let _ = writeln!(out, "\nstacks holding the most live memory:");
        for stack in &x.live_stacks {
            let top = stack.frames.first().map_or("(no stack recorded)", String::as_str);
            let _ = writeln!(out, "  {:>12} in {:>5} blocks  {top}", size(stack.bytes), stack.blocks);
        }
    }
    if let Some(search) = &x.fix
        && !search.alternatives.is_empty()
    {
        let _ = writeln!(out, "\nother changes that let the job through:");
        for fix in &search.alternatives {
            let _ = writeln!(out, "  {} (peak reserved {})", &fix.change.to_string(), size(fix.peak_reserved));
        }
    }
    if !x.matches_recording {
        let _ =
            writeln!(out, "\nnote: the replay differs from the recording at this entry; the answer is the replay's");
    }
    out
}
