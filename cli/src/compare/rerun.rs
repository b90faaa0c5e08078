//! Which recorded experiments `compare` may rerun to verify its reasons. A snapshot's run record
//! says what to rerun, with its sizes, steps and paths, and a snapshot can come from anyone: a
//! record beyond the limits below (what a `cachalot run` of the README's sizes stays well
//! within) is not rerun unless the user passes `--rerun`, and an op-file record, which names a
//! file to read, is rerun only with `--rerun`, as the user did not pass that path.

use cachalot_runtime::experiments::{Experiment, MlpParams, SweepParams};

/// Most training steps a recorded `mlp-train` may ask for.
pub const MAX_STEPS: u64 = 10_000;
/// Most layers, batch sizes, matmul shapes or layouts a record may list.
pub const MAX_LIST: usize = 64;
/// Largest layer width or batch size.
pub const MAX_WIDTH: usize = 1 << 16;
/// Largest matrix side of a recorded `matmul-sweep`.
pub const MAX_SIDE: u32 = 1 << 14;

/// Why `experiment` may not be rerun without `--rerun`, or `None` when it is within limits.
pub fn beyond_limits(experiment: &Experiment) -> Option<String> {
    match experiment {
        Experiment::Seeds => None,
        Experiment::MlpTrain(params) => mlp(params),
        Experiment::MatmulSweep(params) => sweep(params),
        Experiment::Ops(params) => Some(format!("it would read the op file {:?}, which was not passed", params.path)),
    }
}

fn mlp(params: &MlpParams) -> Option<String> {
    if u64::from(params.steps) > MAX_STEPS {
        return Some(format!("{} training steps (at most {MAX_STEPS})", params.steps));
    }
    if params.widths.len() > MAX_LIST || params.batches.len() > MAX_LIST {
        return Some(format!(
            "{} layers and {} batch sizes (at most {MAX_LIST} each)",
            params.widths.len(),
            params.batches.len()
        ));
    }
    if let Some(w) = params.widths.iter().chain(&params.batches).find(|&&w| w > MAX_WIDTH) {
        return Some(format!("a layer width or batch size of {w} (at most {MAX_WIDTH})"));
    }
    None
}

fn sweep(params: &SweepParams) -> Option<String> {
    if params.shapes.len() > MAX_LIST || params.layouts.len() > MAX_LIST {
        return Some(format!(
            "{} shapes and {} layouts (at most {MAX_LIST} each)",
            params.shapes.len(),
            params.layouts.len()
        ));
    }
    let side = params.shapes.iter().flat_map(|&(m, n, k)| [m, n, k]).find(|&s| s > MAX_SIDE);
    side.map(|s| format!("a matrix side of {s} (at most {MAX_SIDE})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachalot_runtime::experiments::OpsParams;

    #[test]
    fn records_beyond_limits_are_named() {
        assert_eq!(beyond_limits(&Experiment::Seeds), None);
        assert_eq!(beyond_limits(&Experiment::MlpTrain(MlpParams::default())), None);
        assert_eq!(beyond_limits(&Experiment::MatmulSweep(SweepParams::default())), None);
        let steps = MlpParams { steps: 4_000_000_000, ..MlpParams::default() };
        assert!(beyond_limits(&Experiment::MlpTrain(steps)).unwrap().contains("4000000000 training steps"));
        let wide = MlpParams { widths: vec![1 << 40, 10], ..MlpParams::default() };
        assert!(beyond_limits(&Experiment::MlpTrain(wide)).is_some());
        let ops = OpsParams { path: "/dev/zero".into(), mark_every: 0, ops_per_second: 0 };
        assert!(beyond_limits(&Experiment::Ops(ops)).unwrap().contains("/dev/zero"));
    }
}
