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

    /// Checks the experiment's inputs against the device described by `facts` before it runs,
    /// so that a command can refuse them before it opens any output: an `ops` experiment's
    /// file is read (within the input limit) and parsed, a `matmul-sweep`'s operands must fit
    /// the device's memory. Running checks them again.
    pub fn check(&self, facts: &cachalot_core::DeviceFacts) -> Result<(), RuntimeError> {
        match self {
            Experiment::Seeds | Experiment::MlpTrain(_) => Ok(()),
            Experiment::MatmulSweep(params) => matmul_sweep::check(params, facts),
            Experiment::Ops(params) => {
                let text = ops::read(&params.path)?;
                cachalot_trace::ops::OpFile::parse(&text)
                    .map(drop)
                    .map_err(|e| RuntimeError::Input { path: params.path.clone(), message: e.to_string() })
            }
        }
    }

    /// Runs the experiment on `rt`, blocking where the device reads back (natively). In the
    /// browser, where nothing may block, it runs devices whose reads are ready at once (the
    /// simulator) and refuses the others: run those with [`Experiment::run_async`].
    pub fn run(&self, rt: &Runtime) -> Result<Outcome, RuntimeError> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            pollster::block_on(self.run_async(rt))
        }
        #[cfg(target_arch = "wasm32")]
        {
            let mut context = std::task::Context::from_waker(std::task::Waker::noop());
            match std::future::Future::poll(std::pin::pin!(self.run_async(rt)), &mut context) {
                std::task::Poll::Ready(outcome) => outcome,
                std::task::Poll::Pending => Err(RuntimeError::Parameters(
                    "this device reads back asynchronously (WebGPU): run the experiment with run_async".into(),
                )),
            }
        }
    }

    /// Runs the experiment on `rt`; the future waits for the device's readbacks instead of
    /// blocking, so the browser can run it on WebGPU from its event loop (the runtime's async
    /// path: see the crate README). An `ops` experiment reads its file from `path`.
    pub async fn run_async(&self, rt: &Runtime) -> Result<Outcome, RuntimeError> {
        self.run_with_ops_text(rt, None).await
    }

    /// [`Experiment::run_async`], with the text of an `ops` experiment's op file given (the
    /// browser has no file system: the page's uploaded file).
    pub async fn run_with_ops_text(&self, rt: &Runtime, ops_text: Option<&str>) -> Result<Outcome, RuntimeError> {
        rt.set_experiment(self.name());
        let outcome = match (self, ops_text) {
            (Experiment::Seeds, _) => seeds::run(rt).await?,
            (Experiment::MlpTrain(params), _) => mlp::run(rt, params).await?,
            (Experiment::MatmulSweep(params), _) => matmul_sweep::run(rt, params).await?,
            (Experiment::Ops(params), None) => ops::run(rt, params).await?,
            (Experiment::Ops(params), Some(text)) => ops::run_text(rt, params, text).await?,
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
