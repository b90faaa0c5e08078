//! The experiments: programs written once against [`Runtime`] that run unchanged on every
//! device. Each records labelled marks, and reports losses and checks of its results.
//!
//! | experiment | what it shows |
//! | --- | --- |
//! | [`Experiment::Seeds`] | the classic demonstrations PyTorch users learn memory from, with the sizes of `seeds.expected.json` |
//! | [`Experiment::MlpTrain`] | training a stack of linear layers for N steps over changing batch sizes |
//! | [`Experiment::MatmulSweep`] | matrix products over a range of shapes, each checked against the CPU |
//! | [`Experiment::Ops`] | an op file of `shared/bench/` as allocations, no kernels |
//!
//! Experiments only allocate through the runtime and never decide anything from computed
//! values, so their allocator sequence is the same whether kernels compute or not; the
//! simulator can therefore rerun them without computing, which `compare` does to test why two
//! runs differ.

pub mod matmul_sweep;
pub mod mlp;
pub mod ops;
pub mod seeds;

use crate::error::RuntimeError;
use crate::runtime::Runtime;

pub use matmul_sweep::SweepParams;
pub use mlp::{Loss, MlpParams, Optimizer};
pub use ops::OpsParams;

/// An experiment and its parameters.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Experiment {
    /// The seeds demonstrations (`capture.py`'s `seeds`).
    Seeds,
    /// Training a multi-layer perceptron.
    MlpTrain(MlpParams),
    /// Matrix products over shapes, checked.
    MatmulSweep(SweepParams),
    /// An op file as allocations.
    Ops(OpsParams),
}

impl Experiment {
    /// The experiment's command-line name.
    pub fn name(&self) -> &'static str {
        match self {
            Experiment::Seeds => "seeds",
            Experiment::MlpTrain(_) => "mlp-train",
            Experiment::MatmulSweep(_) => "matmul-sweep",
            Experiment::Ops(_) => "ops",
        }
    }

    /// Runs the experiment on `rt`.
    pub fn run(&self, rt: &Runtime) -> Result<Outcome, RuntimeError> {
        rt.set_experiment(self.name());
        let outcome = match self {
            Experiment::Seeds => seeds::run(rt)?,
            Experiment::MlpTrain(params) => mlp::run(rt, params)?,
            Experiment::MatmulSweep(params) => matmul_sweep::run(rt, params)?,
            Experiment::Ops(params) => ops::run(rt, params)?,
        };
        rt.finish()?;
        Ok(outcome)
    }
}

/// A result an experiment checked.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// The numbers.
    pub detail: String,
}

/// What an experiment reports besides its marks.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    /// Loss per step (training experiments).
    pub losses: Vec<f32>,
    /// Results checked against the CPU.
    pub checks: Vec<Check>,
    /// Lines for the report.
    pub lines: Vec<String>,
}

impl Outcome {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
}
