//! `cachalot compare A B...`: runs side by side — snapshots written by `cachalot run` and
//! PyTorch's `expected.json` — with every difference and, where it is known, its reason. The
//! analysis is `cachalot_runtime::comparison`; this command renders it as text ([`text`]).

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
}

/// `--loss-tolerance`: NaN would accept every loss (each comparison with it is false), and a
/// negative or infinite one means nothing.
fn parse_tolerance(text: &str) -> Result<f64, String> {
    let tolerance: f64 = text.trim().parse().map_err(|_| format!("'{text}' is not a number"))?;
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
        columns.push(load(path).map_err(|e| Failure::input(anyhow!(e)))?);
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
