//! `mlp-train`: a stack of linear layers with an activation between them, trained on
//! synthetic data for a number of steps over changing batch sizes, as `capture.py`'s
//! `mlp_train` does:
//!
//! ```python
//! loss = loss_fn(model(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); mark(f"step{s}")
//! ```
//!
//! Parameters are initialised like `nn.Linear` (uniform in ±1/sqrt(fan_in)) from a seeded
//! generator; inputs are uniform in [-1, 1) and the targets come from a fixed random "teacher"
//! (the arg-max class of a linear map of the input, or the map itself for MSE), so the loss
//! goes down. Gradients of a step live until the next step's `zero_grad`; optimiser state is
//! allocated at the first step and stays, as in PyTorch.

use web_time::Instant;

use cachalot_shaders::cpu::Rng;
use cachalot_shaders::{Adam, Sgd};

use super::Outcome;
use crate::device::Activation;
use crate::error::RuntimeError;
use crate::runtime::{Runtime, Tensor};

/// The optimiser of [`MlpParams`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// `torch.optim.SGD` (with momentum unless it is 0).
    Sgd,
    /// `torch.optim.Adam`.
    Adam,
}

/// The loss of [`MlpParams`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Loss {
    /// Softmax cross-entropy against class targets (the last width is the number of classes).
    CrossEntropy,
    /// Mean squared error against real targets.
    Mse,
}

/// Parameters of `mlp-train`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MlpParams {
    /// Layer widths: inputs, the hidden layers, outputs (at least two).
    pub widths: Vec<usize>,
    /// Training steps.
    pub steps: u32,
    /// Batch sizes, used in turn (step `s` uses `batches[s % len]`).
    pub batches: Vec<usize>,
    /// The optimiser.
    pub optimizer: Optimizer,
    /// Learning rate.
    pub lr: f32,
    /// SGD momentum (0: plain SGD, no buffer).
    pub momentum: f32,
    /// Activation between layers.
    pub activation: Activation,
    /// The loss.
    pub loss: Loss,
    /// Seed of parameters and data.
    pub seed: u64,
}

impl Default for MlpParams {
    fn default() -> Self {
        MlpParams {
            widths: vec![256, 512, 512, 10],
            steps: 12,
            batches: vec![64, 128, 32],
            optimizer: Optimizer::Adam,
            lr: 1e-3,
            momentum: 0.9,
            activation: Activation::Relu,
            loss: Loss::CrossEntropy,
            seed: 0,
        }
    }
}

impl MlpParams {
    /// `depth` hidden layers of the first hidden width (or of the input width, if there is
    /// none).
    pub fn with_depth(mut self, depth: usize) -> Self {
        let (first, last) = (self.widths.first().copied().unwrap_or(1), self.widths.last().copied().unwrap_or(1));
        let hidden = self.widths.get(1).filter(|_| self.widths.len() > 2).copied().unwrap_or(first);
        self.widths = std::iter::once(first).chain(std::iter::repeat_n(hidden, depth)).chain([last]).collect();
        self
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        let bad = |m: String| Err(RuntimeError::Parameters(m));
        if self.widths.len() < 2 || self.widths.contains(&0) {
            return bad(format!("widths {:?}: at least an input and an output width, none 0", self.widths));
        }
        if self.batches.is_empty() || self.batches.contains(&0) {
            return bad(format!("batches {:?}: at least one, none 0", self.batches));
        }
        if !(self.lr.is_finite() && self.lr > 0.0 && (0.0..1.0).contains(&self.momentum)) {
            return bad(format!("lr {} must be positive, momentum {} in [0, 1)", self.lr, self.momentum));
        }
        Ok(())
    }

    /// The batch of step `step`.
    pub fn batch(&self, step: u32) -> usize {
        self.batches[step as usize % self.batches.len()]
    }
}

/// One linear layer's parameters and their optimiser state.
struct Layer {
    w: Tensor,
    b: Tensor,
    /// Optimiser state per parameter: SGD's momentum buffer, or Adam's two moments.
    state_w: Vec<Tensor>,
    state_b: Vec<Tensor>,
}

/// Host data of one step: inputs and targets (class indices or real values).
struct Batch {
    x: Vec<f32>,
    classes: Vec<u32>,
    values: Vec<f32>,
}

/// The fixed teacher that labels the data.
struct Teacher {
    weights: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

impl Teacher {
    fn new(inputs: usize, outputs: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x07ea_c4e5);
        let bound = (3.0 / inputs as f32).sqrt();
        Teacher { weights: rng.vec(inputs * outputs, -bound, bound), inputs, outputs }
    }

    fn batch(&self, rows: usize, rng: &mut Rng) -> Batch {
        let x = rng.vec(rows * self.inputs, -1.0, 1.0);
        let mut classes = Vec::with_capacity(rows);
        let mut values = Vec::with_capacity(rows * self.outputs);
        for r in 0..rows {
            let row = &x[r * self.inputs..(r + 1) * self.inputs];
            let out: Vec<f32> = (0..self.outputs)
                .map(|j| {
                    let w = &self.weights[j * self.inputs..(j + 1) * self.inputs];
                    w.iter().zip(row).map(|(a, b)| a * b).sum()
                })
                .collect();
            let best = out.iter().enumerate().fold(0, |best, (j, &v)| if v > out[best] { j } else { best });
            classes.push(best as u32);
            values.extend(out);
        }
        Batch { x, classes, values }
    }
}

/// Runs `mlp-train` on `rt`.
pub async fn run(rt: &Runtime, params: &MlpParams) -> Result<Outcome, RuntimeError> {
    params.validate()?;
    let mut outcome = Outcome::default();
    let widths = &params.widths;
    let depth = widths.len() - 1;
    let (inputs, outputs) = (widths[0], widths[depth]);
    let act = params.activation;

    rt.set_phase("model");
    let mut rng = Rng::new(params.seed);
    let mut layers = Vec::with_capacity(depth);
    for i in 0..depth {
        let (fan_in, fan_out) = (widths[i], widths[i + 1]);
        let bound = 1.0 / (fan_in as f32).sqrt();
        let w = rt.from_f32(&[fan_out, fan_in], &rng.vec(fan_in * fan_out, -bound, bound))?;
        let b = rt.from_f32(&[fan_out], &rng.vec(fan_out, -bound, bound))?;
        layers.push(Layer { w, b, state_w: Vec::new(), state_b: Vec::new() });
    }
    rt.mark("model")?;

    let teacher = Teacher::new(inputs, outputs, params.seed);
    let mut data_rng = Rng::new(params.seed.wrapping_add(1));
    let mut grads: Vec<(Tensor, Tensor)> = Vec::new();
    for step in 0..params.steps {
        rt.set_phase(format!("step {step}"));
        let start = Instant::now();
        let rows = params.batch(step);
        let host = teacher.batch(rows, &mut data_rng);
        let x = rt.from_f32(&[rows, inputs], &host.x)?;
        let target = match params.loss {
            Loss::CrossEntropy => rt.from_u32(&[rows], &host.classes)?,
            Loss::Mse => rt.from_f32(&[rows, outputs], &host.values)?,
        };

        // Forward: every layer's output and activation are kept for the backward pass.
        let mut saved: Vec<(Tensor, Tensor)> = Vec::with_capacity(depth - 1);
        let mut logits = None;
        for (i, layer) in layers.iter().enumerate() {
            let input = if i == 0 { &x } else { &saved[i - 1].1 };
            let z = rt.linear(input, &layer.w, Some(&layer.b))?;
            if i + 1 < depth {
                let a = rt.activation(act, &z)?;
                saved.push((z, a));
            } else {
                logits = Some(z);
            }
        }
        let logits = logits.ok_or_else(|| RuntimeError::Parameters("no layers".into()))?;
        let (loss, dlogits) = match params.loss {
            Loss::CrossEntropy => rt.cross_entropy(&logits, &target)?,
            Loss::Mse => rt.mse(&logits, &target)?,
        };
        drop(logits);

        // zero_grad(set_to_none=True), then backward from the loss.
        grads.clear();
        let mut new_grads: Vec<Option<(Tensor, Tensor)>> = (0..depth).map(|_| None).collect();
        let mut dy = dlogits;
        for i in (0..depth).rev() {
            let input = if i == 0 { &x } else { &saved[i - 1].1 };
            let g = rt.linear_backward(input, &layers[i].w, &dy, i > 0, true)?;
            drop(dy);
            let db = g.db.ok_or_else(|| RuntimeError::Parameters("no bias gradient".into()))?;
            new_grads[i] = Some((g.dw, db));
            match g.dx {
                Some(dx) => {
                    let (z, a) = saved.pop().ok_or_else(|| RuntimeError::Parameters("no saved activation".into()))?;
                    drop(a);
                    dy = rt.activation_backward(act, &z, &dx)?;
                    drop(dx);
                    drop(z);
                }
                None => break,
            }
        }
        grads = new_grads.into_iter().flatten().collect();

        // The optimiser step; its state is allocated at the first step and kept.
        for (layer, (dw, db)) in layers.iter_mut().zip(&grads) {
            step_parameter(rt, params, &layer.w, dw, &mut layer.state_w, step)?;
            step_parameter(rt, params, &layer.b, db, &mut layer.state_b, step)?;
        }
        let value = rt.read_f32(&loss).await?.first().copied().unwrap_or(f32::NAN);
        outcome.losses.push(value);
        drop(loss);
        drop(target);
        drop(x);
        rt.synchronize()?;
        rt.record_time(format!("step {step}"), start.elapsed());
        rt.mark(format!("step{step}"))?;
    }
    drop(grads);
    if rt.computes() {
        // Each step trains on a new random batch of another size, so one step's loss moves with
        // its batch as much as with what the model learned: say so, and where guessing would be.
        let chance = match params.loss {
            Loss::CrossEntropy => format!("; guessing among {outputs} classes scores {:.6}", (outputs as f64).ln()),
            Loss::Mse => String::new(),
        };
        outcome.lines.push(format!(
            "loss {:.6} -> {:.6} over {} steps (each step sees a new batch, so single steps go up and down{chance})",
            outcome.losses.first().copied().unwrap_or(f32::NAN),
            outcome.losses.last().copied().unwrap_or(f32::NAN),
            params.steps
        ));
    }
    Ok(outcome)
}

fn step_parameter(
    rt: &Runtime,
    params: &MlpParams,
    param: &Tensor,
    grad: &Tensor,
    state: &mut Vec<Tensor>,
    step: u32,
) -> Result<(), RuntimeError> {
    match params.optimizer {
        Optimizer::Sgd => {
            let sgd = Sgd { momentum: params.momentum, ..Sgd::new(params.lr) };
            if params.momentum != 0.0 && state.is_empty() {
                // PyTorch creates the buffer from the first gradient (a clone).
                state.push(rt.empty(param.shape())?);
            }
            rt.sgd_step(param, grad, state.first(), sgd, step == 0)
        }
        Optimizer::Adam => {
            if state.is_empty() {
                state.push(rt.zeros(param.shape())?);
                state.push(rt.zeros(param.shape())?);
            }
            let adam = Adam { lr: params.lr, ..Adam::default() };
            rt.adam_step(param, grad, &state[0], &state[1], adam, step + 1)
        }
    }
}
