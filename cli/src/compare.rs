//! `cachalot compare A B...`: runs side by side — snapshots written by `cachalot run` and
//! PyTorch's `expected.json` — with every difference and, where it is known, its reason. The
//! analysis is `cachalot_runtime::comparison`; this command renders it as text ([`text`]).

mod rerun;
mod text;

use std::path::PathBuf;

use anyhow::anyhow;
use cachalot_runtime::comparison::{CompareOptions, compare_runs, load};

use crate::failure::{Failure, Outcome};

/// Arguments of `cachalot compare`.
#[derive(Clone, Debug, clap::Args)]
pub struct CompareArgs {
    /// Snapshots of `cachalot run` (.json) and PyTorch expected.json files; the first is the
    /// baseline.
    #[arg(required = true, num_args = 2..)]
    pub runs: Vec<PathBuf>,
    /// Largest relative difference of losses per step accepted: a finite number, 0 or more.
    #[arg(long, default_value_t = 1e-3, value_parser = parse_tolerance)]
    pub loss_tolerance: f64,
    /// Do not rerun experiments on the simulator to verify reasons.
    #[arg(long)]
    pub no_verify: bool,
    /// Rerun recorded experiments even beyond the limits a snapshot's record is trusted with
    /// (steps, sizes), and op-file records, which read the file the record names.
    #[arg(long, conflicts_with = "no_verify")]
    pub rerun: bool,
}

/// `--loss-tolerance`: NaN would accept every loss (each comparison with it is false), and a
/// negative or infinite one means nothing.
fn parse_tolerance(text: &str) -> Result<f64, String> {
    let tolerance: f64 =
        text.trim().parse().map_err(|_| format!("'{}' is not a number", cachalot_core::error::shorten(text)))?;
    if !(tolerance.is_finite() && tolerance >= 0.0) {
        return Err(format!("{tolerance} is not a finite number of 0 or more"));
    }
    Ok(tolerance)
}

/// Runs the command. Exit status 0 when every difference has a known reason, losses agree and
/// every run finished; 1 otherwise; 2 on unreadable input.
pub fn run(args: &CompareArgs) -> Outcome {
    let mut columns = Vec::with_capacity(args.runs.len());
    for path in &args.runs {
        let mut column = load(path).map_err(|e| match path.exists() {
            true => Failure::input(anyhow!(e)),
            false => Failure::input(anyhow!("{e}; {}", crate::input::REFERENCE_TRACES)),
        })?;
        // The record comes from the file, not from the user: its experiment is rerun only
        // within visible limits, or when the user asks with --rerun.
        if !args.no_verify
            && !args.rerun
            && let Some(why) = column.experiment.as_ref().and_then(rerun::beyond_limits)
        {
            eprintln!("cachalot compare: {}: not rerun to verify reasons: {why} (--rerun allows it)", path.display());
            column.experiment = None;
        }
        columns.push(column);
    }
    let options = CompareOptions { loss_tolerance: args.loss_tolerance, verify: !args.no_verify };
    let comparison = compare_runs(columns, options);
    print!("{}", text::render(&comparison));
    if comparison.verdict.ok() {
        Ok(())
    } else {
        Err(Failure { status: 1, error: anyhow!("the runs differ in ways without a known reason") })
    }
}
