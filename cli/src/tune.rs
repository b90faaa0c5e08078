//! `cachalot tune TRACE... [--device-total BYTES] [--objective O] [--json] [--top N]
//! [--no-own-policy]`: which `PYTORCH_CUDA_ALLOC_CONF` a recorded job needs, and what cachalot's
//! own policy would save on it. The search and its replays are `cachalot_trace::tune`; this
//! module reads the traces and prints a table per trace.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, anyhow};
use cachalot_core::error::{format_size, group_digits};
use cachalot_trace::replay::{ReplayOom, ReplayOptions};
use cachalot_trace::tune::{Candidate, OWN_POLICY_ALLOCATED, Objective, Tuning, tune, tune_pytorch_settings};

use crate::failure::{Failure, Outcome};
use crate::input::parse_bytes;
use crate::input::trace_name;
use crate::input::{Input, load};
use crate::report::expected_beside;

/// Arguments of `cachalot tune`.
#[derive(Clone, Debug, clap::Args)]
pub struct TuneArgs {
    /// PyTorch snapshot pickles with a recorded trace (`_dump_snapshot`); NAME.expected.json
    /// beside one gives its settings, memory fraction and device.
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// Replay on a device of this size (bytes or a KiB/MiB/GiB suffix) and say whether the job
    /// fits there (default: the trace's device, else an H200's).
    #[arg(long, value_parser = parse_bytes)]
    pub device_total: Option<u64>,
    /// What the ranking minimises first: peak-reserved (then OOMs), ooms (then peak reserved)
    /// or device-calls (cudaMalloc plus cudaFree, then peak reserved). A setting that runs out
    /// of memory where the recorded run did not always ranks below one that does not.
    #[arg(long, default_value = "peak-reserved", value_parser = parse_objective)]
    pub objective: Objective,
    /// As JSON: one object per trace (candidates, baseline, winner), an array for several.
    #[arg(long)]
    pub json: bool,
    /// Rows of the ranking shown.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub top: u64,
    /// Replay the trace's settings under cachalot's own policy too (`policy:cachalot`, not a
    /// PyTorch setting: it needs cachalot as the allocator) and say what it saves against the
    /// trace's settings and PyTorch's best. The default; the flag is still accepted.
    #[arg(long, overrides_with = "no_own_policy")]
    pub own_policy: bool,
    /// Rank PyTorch's settings only, without the replay under cachalot's own policy. A
    /// `policy` entry of the trace's settings is left out of the candidates either way.
    #[arg(long, overrides_with = "own_policy")]
    pub no_own_policy: bool,
}

fn parse_objective(text: &str) -> Result<Objective, String> {
    Objective::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = Objective::ALL.iter().map(|o| o.name()).collect();
        format!("'{}' is not an objective ({})", cachalot_core::error::shorten(text), names.join(", "))
    })
}

/// Runs the command: a table (or a JSON object) per trace; exit status 2 on bad input.
pub fn run(args: &TuneArgs) -> Outcome {
    if args.device_total == Some(0) {
        return Err(Failure::input(anyhow!("--device-total must be more than 0 bytes")));
    }
    let mut objects = Vec::new();
    for (n, path) in args.traces.iter().enumerate() {
        let started = Instant::now();
        let tuning = tune_file(args, path)?;
        let seconds = started.elapsed().as_secs_f64();
        if args.json {
            objects.push(json(args, path, &tuning));
        } else {
            if n > 0 {
                println!();
            }
            print_table(args, path, &tuning, seconds);
        }
    }
    if args.json {
        let value = if objects.len() == 1 { objects.remove(0) } else { serde_json::Value::Array(objects) };
        println!("{}", serde_json::to_string_pretty(&value).context("tune as JSON")?);
    }
    Ok(())
}

/// Reads a trace and runs the search on it.
fn tune_file(args: &TuneArgs, path: &Path) -> Result<Tuning, Failure> {
    if let Some(stem) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".expected.json")) {
        let pickle = path.with_file_name(format!("{stem}.pickle"));
        let advice = match pickle.exists() {
            true => format!("tune the trace beside it: cachalot tune {}", pickle.display()),
            false => format!("tune the trace it was recorded with ({stem}.pickle, which is not beside it)"),
        };
        return Err(Failure::input(anyhow!(
            "{}: PyTorch's record of a run's stats and settings, not its trace; {advice}",
            path.display()
        )));
    }
    let Input::Torch(snapshot) = load(path)? else {
        return Err(Failure::input(anyhow!("{}: not a PyTorch snapshot pickle", path.display())));
    };
    let expected = expected_beside(path)?;
    let mut options = ReplayOptions::for_snapshot(&snapshot, expected.as_ref())
        .with_context(|| crate::input::settings_place(path, expected.is_some()))?;
    if let Some(total) = args.device_total {
        options.device_total = total;
    }
    let failure = |e| Failure::input(anyhow!("{}: {e}", path.display()));
    let search = if args.no_own_policy { tune_pytorch_settings } else { tune };
    search(&snapshot, &options, args.objective).map_err(failure)
}

/// A setting as the table shows it: the empty one is PyTorch's defaults.
fn shown(settings: &str) -> &str {
    if settings.is_empty() { "(PyTorch's defaults)" } else { settings }
}

/// The line that sets `settings` in a shell.
fn paste_line(settings: &str) -> String {
    if settings.is_empty() {
        "unset PYTORCH_CUDA_ALLOC_CONF".to_owned()
    } else {
        format!("PYTORCH_CUDA_ALLOC_CONF={settings}")
    }
}

fn first_oom_entry(oom: Option<&ReplayOom>) -> String {
    oom.map_or("-".to_owned(), |o| o.index.to_string())
}

/// The ranking's top rows and, where it is below them, the trace's own settings, each with its
/// rank; then the winning line and, with `--device-total`, whether the job fits.
fn print_table(args: &TuneArgs, path: &Path, tuning: &Tuning, seconds: f64) {
    let baseline_rank = tuning.baseline_rank();
    let top = usize::try_from(args.top).unwrap_or(usize::MAX);
    let mut rows: Vec<(usize, &Candidate)> =
        tuning.ranked.iter().take(top).enumerate().map(|(i, c)| (i + 1, c)).collect();
    if baseline_rank > rows.len() {
        rows.push((baseline_rank, &tuning.baseline));
    }
    let label = |rank: usize, c: &Candidate| {
        let own = if rank == baseline_rank { "  <- the trace's own" } else { "" };
        format!("{}{own}", shown(&c.settings))
    };
    let width = rows.iter().map(|&(rank, c)| label(rank, c).len()).max().unwrap_or(0);
    println!(
        "{}: {} candidates replayed in {seconds:.2} s on a device of {} B ({}), ranked by {}",
        trace_name(path),
        tuning.ranked.len(),
        group_digits(tuning.device_total),
        format_size(tuning.device_total),
        tuning.objective.name()
    );
    if !tuning.dropped.is_empty() {
        println!(
            "note: {} left out of the trace's settings and every candidate: cachalot's own key, which PyTorch refuses",
            tuning.dropped.join(",")
        );
    }
    println!(
        "{:>5}  {:>15}  {:>9}  {:>5}  {:>9}  {:>13}  {:>12}  {:<width$}  allocator time",
        "rank", "peak reserved", "reserved/", "OOMs", "first OOM", "device allocs", "device frees", "setting"
    );
    println!("{:>5}  {:>15}  {:>9}  {:>5}  {:>9}", "", "(bytes)", "allocated", "", "(entry)");
    for (rank, c) in rows {
        println!(
            "{rank:>5}  {:>15}  {:>9.2}  {:>5}  {:>9}  {:>13}  {:>12}  {:<width$}  {:.4} s",
            group_digits(c.peak_reserved),
            c.reserved_per_allocated(),
            c.ooms,
            first_oom_entry(c.first_oom.as_ref()),
            c.device_allocs,
            c.device_frees,
            label(rank, c),
            c.allocator_seconds
        );
    }
    println!();
    print_winner(tuning);
    print_fraction(tuning, &tuning.winner().settings, args.device_total.is_some());
    if args.device_total.is_some() || !tuning.winner().fits() {
        print_fit(tuning);
        if let Some(best) = tuning.best_fitting().filter(|best| best.settings != tuning.winner().settings) {
            print_fraction(tuning, &best.settings, args.device_total.is_some());
        }
    }
    if let Some(own) = &tuning.own_policy {
        println!();
        print_own_policy(own, tuning);
    }
    if let Some(error) = &tuning.own_policy_error {
        println!();
        println!("cachalot's own policy (policy:cachalot) could not replay this trace: {error}");
    }
}

/// cachalot's own policy beside the trace's own settings and PyTorch's best setting.
fn print_own_policy(own: &Candidate, tuning: &Tuning) {
    let (baseline, best) = (&tuning.baseline, tuning.winner());
    println!(
        "cachalot's own policy, {} (not a PyTorch setting: it needs cachalot as the allocator, \
         cachalot_torch.enable(config=\"{}\"))",
        own.settings, own.settings
    );
    let against_best = if best.settings == baseline.settings {
        String::new()
    } else {
        format!(", {} against PyTorch's best", change(best.peak_reserved, own.peak_reserved))
    };
    println!(
        "  peak reserved {} B ({:.2}x peak allocated): {} against the trace's own settings{against_best}",
        group_digits(own.peak_reserved),
        own.reserved_per_allocated(),
        change(baseline.peak_reserved, own.peak_reserved),
    );
    println!(
        "  OOMs: {} ({} where the recorded run had none); device allocations and frees: {}, against {} with the \
         trace's own settings and {} with PyTorch's best",
        own.ooms,
        own.new_ooms,
        own.device_calls(),
        baseline.device_calls(),
        best.device_calls()
    );
    let peaks = if own.peak_allocated == baseline.peak_allocated {
        format!("the peaks allocated agree on this trace, {} B", group_digits(own.peak_allocated))
    } else {
        format!(
            "peak allocated {} B, against {} B under PyTorch's policy with the trace's own settings",
            group_digits(own.peak_allocated),
            group_digits(baseline.peak_allocated)
        )
    };
    println!("  {OWN_POLICY_ALLOCATED} ({peaks})");
    if own.device_calls() > best.device_calls().min(baseline.device_calls()) {
        // What the extra calls mean on a GPU, where each is driver work per page moved.
        println!(
            "  on a GPU each map or unmap costs driver calls per 2 MiB page (about 57 us a page on an H100): \
             weigh them if the job repeats its steps (docs/allocator-rules.md §24)"
        );
    }
}

/// The line to paste and what it saves against the trace's own settings.
fn print_winner(tuning: &Tuning) {
    let (winner, baseline) = (tuning.winner(), &tuning.baseline);
    if tuning.baseline_rank() == 1 {
        println!(
            "the trace's own settings are already the best of {} candidates: {}",
            tuning.ranked.len(),
            paste_line(&baseline.settings)
        );
        return;
    }
    println!("{}", paste_line(&winner.settings));
    let (saving, percent) = saving(baseline.peak_reserved, winner.peak_reserved);
    println!(
        "  peak reserved {} B instead of {} B: {} {} B ({percent:.1}%) against the trace's own settings",
        group_digits(winner.peak_reserved),
        group_digits(baseline.peak_reserved),
        if saving >= 0 { "saves" } else { "costs" },
        group_digits(saving.unsigned_abs()),
    );
    if winner.ooms != baseline.ooms {
        println!("  OOMs: {} instead of {}", winner.ooms, baseline.ooms);
    }
    if winner.device_calls() != baseline.device_calls() {
        println!("  device allocations and frees: {} instead of {}", winner.device_calls(), baseline.device_calls());
    }
}

/// A `per_process_memory_fraction` of `settings` in bytes: a fraction means something only on
/// a device of the size it was found for, the trace's unless `--device-total` (`given`) names
/// the user's.
fn print_fraction(tuning: &Tuning, settings: &str, given: bool) {
    let Some((text, fraction)) = fraction_of(settings) else { return };
    let total = tuning.device_total;
    // PyTorch's allowance: the fraction of the device's total, truncated to bytes.
    let allowed = (fraction * total as f64) as u64;
    let device = format!("{} B ({})", group_digits(total), format_size(total));
    let cap = format!(
        "per_process_memory_fraction:{text} caps reserved memory at {} B ({})",
        group_digits(allowed),
        format_size(allowed)
    );
    match given {
        true => println!("  {cap}: that fraction of the device of --device-total, {device}"),
        false => println!(
            "  {cap} of the trace's device, {device}; on a device of another size the same cap is another \
             fraction: give that device's size with --device-total"
        ),
    }
}

/// The `per_process_memory_fraction` of a `PYTORCH_CUDA_ALLOC_CONF` string, if it sets one.
fn fraction_of(settings: &str) -> Option<(&str, f64)> {
    settings.split(',').find_map(|entry| {
        let text = entry.trim().strip_prefix("per_process_memory_fraction:")?.trim();
        Some((text, text.parse().ok()?))
    })
}

/// "saves N B (P%)" or "costs N B (P%)" going from `before` to `after` bytes.
fn change(before: u64, after: u64) -> String {
    let (saving, percent) = saving(before, after);
    let verb = if saving >= 0 { "saves" } else { "costs" };
    format!("{verb} {} B ({:.1}%)", group_digits(saving.unsigned_abs()), percent.abs())
}

/// Bytes saved (negative: added) going from `before` to `after`, and that in percent of `before`.
fn saving(before: u64, after: u64) -> (i64, f64) {
    let saved = i64::try_from(before).unwrap_or(i64::MAX) - i64::try_from(after).unwrap_or(i64::MAX);
    (saved, if before == 0 { 0.0 } else { saved as f64 * 100.0 / before as f64 })
}

/// Whether the job runs through on the device, and where it stops where it does not.
fn print_fit(tuning: &Tuning) {
    let device = format!("{} B ({})", group_digits(tuning.device_total), format_size(tuning.device_total));
    let stop = |who: &str, c: &Candidate| match &c.first_new_oom {
        Some(oom) => println!("  {who}: first OOM at entry {}: {}", oom.index, oom.message),
        None => println!("  {who}: no OOM"),
    };
    match tuning.best_fitting() {
        Some(best) => {
            println!(
                "fits on a device of {device}: with {} it replays without an OOM the recorded run did not have (peak reserved {} B)",
                paste_line(&best.settings),
                group_digits(best.peak_reserved)
            );
            if !tuning.baseline.fits() {
                stop("the trace's own settings do not", &tuning.baseline);
            }
        }
        None => {
            println!("does not fit on a device of {device}: every candidate runs out of memory");
            stop("the trace's own settings", &tuning.baseline);
            stop(&format!("the best candidate ({})", shown(&tuning.winner().settings)), tuning.winner());
        }
    }
}

/// What the table says, for scripts.
fn json(args: &TuneArgs, path: &Path, tuning: &Tuning) -> serde_json::Value {
    let top = usize::try_from(args.top).unwrap_or(usize::MAX);
    let candidate = |c: &Candidate, rank: usize| {
        let mut value = serde_json::to_value(c).unwrap_or_default();
        if let Some(object) = value.as_object_mut() {
            object.insert("rank".into(), rank.into());
            object.insert("reserved_per_allocated".into(), c.reserved_per_allocated().into());
            object.insert("fits".into(), c.fits().into());
        }
        value
    };
    let winner = tuning.winner();
    let (saved, percent) = saving(tuning.baseline.peak_reserved, winner.peak_reserved);
    serde_json::json!({
        "trace": path.display().to_string(),
        "objective": tuning.objective.name(),
        "device_total": tuning.device_total,
        "candidates": tuning.ranked.len(),
        "ranked": tuning.ranked.iter().take(top).enumerate().map(|(i, c)| candidate(c, i + 1)).collect::<Vec<_>>(),
        "baseline": candidate(&tuning.baseline, tuning.baseline_rank()),
        "winner": candidate(winner, 1),
        "winner_line": paste_line(&winner.settings),
        "peak_reserved_saving": { "bytes": saved, "percent": percent },
        "best_fitting": tuning.best_fitting().map(|c| c.settings.clone()),
        "dropped": tuning.dropped,
        "own_policy": tuning.own_policy.as_ref().map(|c| {
            let mut value = candidate(c, 0);
            if let Some(object) = value.as_object_mut() {
                let against = |before: &Candidate| {
                    let (bytes, percent) = saving(before.peak_reserved, c.peak_reserved);
                    serde_json::json!({ "bytes": bytes, "percent": percent })
                };
                object.remove("rank");
                object.insert("pytorch_setting".into(), false.into());
                object.insert("device_calls".into(), c.device_calls().into());
                object.insert("peak_reserved_saving".into(), against(&tuning.baseline));
                object.insert("peak_reserved_saving_against_winner".into(), against(winner));
                object.insert("memory_allocated".into(), OWN_POLICY_ALLOCATED.into());
            }
            value
        }),
        "own_policy_error": tuning.own_policy_error,
    })
}
