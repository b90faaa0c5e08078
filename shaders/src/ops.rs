//! Every kernel op defined once: its operands, the arguments beyond them (sizes, shapes,
//! scalars) and the checks of those arguments, with the message each failure reports.
//!
//! Each struct is generic over the operand handle `T`: the runtime passes `&Allocation`, the
//! CUDA kernels anything that converts into a `DeviceSpan`, the WGSL runner `&Allocation`.
//! A kernel method then takes one value (`matmul(op: Matmul<T>)`), so no backend spells the
//! op's parameter list again. The CUDA kernels (`cachalot-cuda`), the WGSL kernel runner
//! (`cachalot-wgpu`) and the runtime's simulator device (the CPU references of
//! [`crate::cpu`]) call the struct's `validate` instead of keeping a copy of each check, so
//! every backend refuses the same calls with the same words. Operands are checked by the
//! backend (each handle holds what the op touches).
//!
//! Adding an op: its struct (operands and arguments) and checks here, its WGSL in `wgsl/` and
//! CUDA C in `cuda/kernels.cu`, its CPU reference in `cpu.rs`, then one kernel method per
//! backend and one method of the runtime's `DeviceKernels` trait, each taking the struct.

use crate::{Adam, MatmulShape, Sgd};

/// Arguments a kernel op refuses, whatever the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// A mean (or a mean loss) over zero elements.
    #[error("the mean of no elements is undefined")]
    EmptyMean,
    /// Cross-entropy with no row or no class.
    #[error("cross-entropy needs at least one row and one class")]
    EmptyCrossEntropy,
    /// SGD with momentum but no momentum buffer.
    #[error("SGD with momentum needs a momentum buffer")]
    MissingMomentumBuffer,
    /// An Adam step numbered 0.
    #[error("Adam steps are counted from 1")]
    AdamStepZero,
}

/// An element-wise activation: forward `y = act(x)`, backward `dx = act'(x) · dy`. The
/// kernels of both directions have the same entry names in WGSL and CUDA C.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "lowercase"))]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// Exact GELU, `x · Φ(x)`.
    Gelu,
}

impl Activation {
    /// `relu` or `gelu` (PyTorch's name of the op).
    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
        }
    }

    /// The forward kernel's entry point.
    pub fn forward_entry(self) -> &'static str {
        match self {
            Activation::Relu => "relu_forward",
            Activation::Gelu => "gelu_forward",
        }
    }

    /// The backward kernel's entry point (also the name of the backward op).
    pub fn backward_entry(self) -> &'static str {
        match self {
            Activation::Relu => "relu_backward",
            Activation::Gelu => "gelu_backward",
        }
    }
}

/// `y = act(x)` for `n` elements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationForward<T> {
    /// Which activation.
    pub act: Activation,
    /// The input.
    pub x: T,
    /// The output.
    pub y: T,
    /// Elements of `x` and `y`.
    pub n: u64,
}

/// `dx = act'(x) · dy` for `n` elements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationBackward<T> {
    /// Which activation.
    pub act: Activation,
    /// The forward input.
    pub x: T,
    /// The gradient of the output.
    pub dy: T,
    /// The gradient of the input (written).
    pub dx: T,
    /// Elements of every operand.
    pub n: u64,
}

/// `C = op(A) · op(B) (+ beta · C) (+ bias)`; layouts in [`MatmulShape`] (row-major).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Matmul<T> {
    /// `A`.
    pub a: T,
    /// `B`.
    pub b: T,
    /// `C` (written; read when `beta != 0`).
    pub c: T,
    /// Sizes and transposes.
    pub shape: MatmulShape,
    /// Scale of the existing `C` added to the product: 0 overwrites `C` (its old contents are
    /// not read), 1 accumulates (e.g. into a gradient).
    pub beta: f32,
    /// `bias[n]` added to every row of `C`.
    pub bias: Option<T>,
}

impl<T> Matmul<T> {
    /// `C = op(A) · op(B)`: no accumulation, no bias.
    pub fn new(a: T, b: T, c: T, shape: MatmulShape) -> Self {
        Matmul { a, b, c, shape, beta: 0.0, bias: None }
    }
}

/// `1 / count` rounded once from f64, as PyTorch computes a mean's scale in Python floats.
fn reciprocal(count: u64) -> f32 {
    (1.0 / count as f64) as f32
}

/// `out[0] = mean(x[0..n])`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mean<T> {
    /// The input.
    pub x: T,
    /// PyTorch's reduction scratch (2,112 bytes), for the partial sums.
    pub staging: T,
    /// The result, one element.
    pub out: T,
    /// Elements of `x`.
    pub n: u64,
}

impl<T> Mean<T> {
    /// Refuses an empty mean.
    pub fn validate(&self) -> Result<(), OpError> {
        if self.n == 0 {
            return Err(OpError::EmptyMean);
        }
        Ok(())
    }

    /// The factor the sum is scaled by, `1 / n`.
    pub fn scale(&self) -> f32 {
        reciprocal(self.n)
    }
}

/// Column sums `out[c] (+)= Σ_r x[r, c]` of `x[rows, cols]` (the bias gradient).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SumRows<T> {
    /// The input, `[rows, cols]`.
    pub x: T,
    /// The column sums, `cols` elements.
    pub out: T,
    /// Rows of `x`.
    pub rows: u32,
    /// Columns of `x`, elements of `out`.
    pub cols: u32,
    /// Adds into `out` instead of overwriting it (autograd's `.grad` accumulation).
    pub accumulate: bool,
}

impl<T> SumRows<T> {
    /// Elements of `x`.
    pub fn elements(&self) -> u64 {
        u64::from(self.rows) * u64::from(self.cols)
    }
}

/// Mean squared error of `n` predictions, `loss[0] = mean((pred - target)²)`, and its
/// gradient `grad = 2 (pred - target) / n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mse<T> {
    /// The predictions.
    pub pred: T,
    /// The targets.
    pub target: T,
    /// The loss, one element.
    pub loss: T,
    /// The gradient of the loss by `pred`; computed only when given.
    pub grad: Option<T>,
    /// Elements of `pred`, `target` and `grad`.
    pub n: u64,
}

impl<T> Mse<T> {
    /// Refuses an empty loss (its mean is undefined).
    pub fn validate(&self) -> Result<(), OpError> {
        Mean { x: (), staging: (), out: (), n: self.n }.validate()
    }

    /// The factor of the loss's sum, `1 / n`.
    pub fn loss_scale(&self) -> f32 {
        reciprocal(self.n)
    }

    /// The factor of the gradient, `2 / n`.
    pub fn grad_scale(&self) -> f32 {
        (2.0 / self.n as f64) as f32
    }
}

/// Softmax cross-entropy of `logits[rows, cols]` against u32 class indices `targets[rows]`:
/// `loss[0]` = the mean over rows and `grad = (softmax - onehot) / rows`. A target outside
/// `[0, cols)` makes the loss NaN. The kernels take a scratch row of `rows` f32 from the
/// allocator for the per-row losses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrossEntropy<T> {
    /// The logits, `[rows, cols]`.
    pub logits: T,
    /// The class of each row (u32).
    pub targets: T,
    /// The loss, one element.
    pub loss: T,
    /// The gradient of the loss by `logits`.
    pub grad: T,
    /// Rows (samples).
    pub rows: u32,
    /// Columns (classes).
    pub cols: u32,
}

impl<T> CrossEntropy<T> {
    /// Refuses a loss with no row or no class.
    pub fn validate(&self) -> Result<(), OpError> {
        if self.rows == 0 || self.cols == 0 {
            return Err(OpError::EmptyCrossEntropy);
        }
        Ok(())
    }

    /// Elements of `logits` and `grad`.
    pub fn elements(&self) -> u64 {
        u64::from(self.rows) * u64::from(self.cols)
    }

    /// The factor of the mean over rows and of the gradient, `1 / rows`.
    pub fn scale(&self) -> f32 {
        reciprocal(u64::from(self.rows))
    }
}

/// One `torch.optim.SGD` step on `n` parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdStep<T> {
    /// The parameter (updated).
    pub param: T,
    /// Its gradient.
    pub grad: T,
    /// The momentum buffer (updated), needed when `sgd.momentum != 0`.
    pub momentum: Option<T>,
    /// Elements of the parameter, its gradient and its momentum buffer.
    pub n: u64,
    /// The hyper-parameters.
    pub sgd: Sgd,
    /// The first step: the momentum buffer is initialised from the gradient, as PyTorch does
    /// when it has none yet.
    pub first_step: bool,
}

impl<T> SgdStep<T> {
    /// Refuses momentum without a buffer.
    pub fn validate(&self) -> Result<(), OpError> {
        if self.sgd.momentum != 0.0 && self.momentum.is_none() {
            return Err(OpError::MissingMomentumBuffer);
        }
        Ok(())
    }
}

/// One `torch.optim.Adam` step on `n` parameters, updating both moments.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep<T> {
    /// The parameter (updated).
    pub param: T,
    /// Its gradient.
    pub grad: T,
    /// The first moment (updated).
    pub exp_avg: T,
    /// The second moment (updated).
    pub exp_avg_sq: T,
    /// Elements of the parameter, its gradient and both moments.
    pub n: u64,
    /// The hyper-parameters.
    pub adam: Adam,
    /// The step number, counted from 1 (the bias corrections depend on it).
    pub step: u32,
}

impl<T> AdamStep<T> {
    /// Refuses step 0.
    pub fn validate(&self) -> Result<(), OpError> {
        if self.step == 0 {
            return Err(OpError::AdamStepZero);
        }
        Ok(())
    }

    /// `(step_size, sqrt_bc2)` of this step (see [`Adam::step_constants`]).
    pub fn constants(&self) -> (f32, f32) {
        self.adam.step_constants(self.step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean(n: u64) -> Mean<()> {
        Mean { x: (), staging: (), out: (), n }
    }

    fn mse(n: u64) -> Mse<()> {
        Mse { pred: (), target: (), loss: (), grad: Some(()), n }
    }

    fn cross_entropy(rows: u32, cols: u32) -> CrossEntropy<()> {
        CrossEntropy { logits: (), targets: (), loss: (), grad: (), rows, cols }
    }

    fn sgd(sgd: Sgd, momentum: bool) -> SgdStep<()> {
        SgdStep { param: (), grad: (), momentum: momentum.then_some(()), n: 4, sgd, first_step: true }
    }

    fn adam(step: u32) -> AdamStep<()> {
        AdamStep { param: (), grad: (), exp_avg: (), exp_avg_sq: (), n: 4, adam: Adam::default(), step }
    }

    /// The messages are the ones every backend reported before the checks moved here; the
    /// command line's outputs depend on them byte for byte.
    #[test]
    fn refusals_say_why() {
        let message = |r: Result<(), OpError>| r.map_err(|e| e.to_string()).err();
        assert_eq!(message(mean(0).validate()).as_deref(), Some("the mean of no elements is undefined"));
        assert_eq!(message(mse(0).validate()).as_deref(), Some("the mean of no elements is undefined"));
        for (rows, cols) in [(0, 3), (3, 0)] {
            assert_eq!(
                message(cross_entropy(rows, cols).validate()).as_deref(),
                Some("cross-entropy needs at least one row and one class")
            );
        }
        let momentum = Sgd { momentum: 0.9, ..Sgd::new(0.1) };
        assert_eq!(
            message(sgd(momentum, false).validate()).as_deref(),
            Some("SGD with momentum needs a momentum buffer")
        );
        assert_eq!(message(adam(0).validate()).as_deref(), Some("Adam steps are counted from 1"));
    }

    #[test]
    fn valid_arguments_pass() {
        assert_eq!(mean(1).validate(), Ok(()));
        assert_eq!(mse(1).validate(), Ok(()));
        assert_eq!(cross_entropy(1, 1).validate(), Ok(()));
        let momentum = Sgd { momentum: 0.9, ..Sgd::new(0.1) };
        assert_eq!(sgd(momentum, true).validate(), Ok(()));
        assert_eq!(sgd(Sgd::new(0.1), false).validate(), Ok(()));
        assert_eq!(adam(1).validate(), Ok(()));
    }

    #[test]
    fn activation_entries_are_kernels_of_both_sources() {
        for act in [Activation::Relu, Activation::Gelu] {
            for entry in [act.forward_entry(), act.backward_entry()] {
                assert!(entry.starts_with(act.name()), "{entry}");
                assert!(crate::cuda::KERNEL_NAMES.contains(&entry), "{entry} is not a CUDA C kernel");
                assert!(
                    crate::wgsl::Module::Elementwise.entry_points().contains(&entry),
                    "{entry} is not a WGSL entry"
                );
            }
        }
    }

    #[test]
    fn scales_are_rounded_once_from_f64() {
        assert_eq!(mean(3).scale(), (1.0f64 / 3.0) as f32);
        assert_eq!(mse(3).grad_scale(), (2.0f64 / 3.0) as f32);
        assert_eq!(cross_entropy(7, 2).scale(), (1.0f64 / 7.0) as f32);
        assert_eq!(cross_entropy(7, 2).elements(), 14);
        assert_eq!(SumRows { x: (), out: (), rows: 5, cols: 6, accumulate: false }.elements(), 30);
    }
}
