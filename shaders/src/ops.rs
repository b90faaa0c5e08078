//! Every kernel op defined once: the arguments beyond its operands (sizes, shapes, scalars)
//! and the checks of those arguments, with the message each failure reports.
//!
//! The CUDA kernels (`cachalot-cuda`), the WGSL kernel runner (`cachalot-wgpu`) and the
//! runtime's simulator device (the CPU references of [`crate::cpu`]) take these structs and
//! call their `validate` instead of keeping a copy of each check, so every backend refuses the
//! same calls with the same words. Operands are the backend's own handles and are checked by
//! the backend (each holds what the op touches).
//!
//! Adding an op: its struct and checks here, its WGSL in `wgsl/` and CUDA C in
//! `cuda/kernels.cu`, its CPU reference in `cpu.rs`, then one kernel method per backend and
//! one method of the runtime's `DeviceKernels` trait.

use crate::{Adam, Sgd};

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

/// `1 / count` rounded once from f64, as PyTorch computes a mean's scale in Python floats.
fn reciprocal(count: u64) -> f32 {
    (1.0 / count as f64) as f32
}

/// `out[0] = mean(x[0..n])`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mean {
    /// Elements of `x`.
    pub n: u64,
}

impl Mean {
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
pub struct SumRows {
    /// Rows of `x`.
    pub rows: u32,
    /// Columns of `x`, elements of `out`.
    pub cols: u32,
    /// Adds into `out` instead of overwriting it (autograd's `.grad` accumulation).
    pub accumulate: bool,
}

impl SumRows {
    /// Elements of `x`.
    pub fn elements(&self) -> u64 {
        u64::from(self.rows) * u64::from(self.cols)
    }
}

/// Mean squared error of `n` predictions, `loss[0] = mean((pred - target)²)`, and its
/// gradient `grad = 2 (pred - target) / n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mse {
    /// Elements of `pred`, `target` and `grad`.
    pub n: u64,
}

impl Mse {
    /// Refuses an empty loss (its mean is undefined).
    pub fn validate(&self) -> Result<(), OpError> {
        Mean { n: self.n }.validate()
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
pub struct CrossEntropy {
    /// Rows (samples).
    pub rows: u32,
    /// Columns (classes).
    pub cols: u32,
}

impl CrossEntropy {
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
pub struct SgdStep {
    /// Elements of the parameter, its gradient and its momentum buffer.
    pub n: u64,
    /// The hyper-parameters.
    pub sgd: Sgd,
    /// The first step: the momentum buffer is initialised from the gradient, as PyTorch does
    /// when it has none yet.
    pub first_step: bool,
}

impl SgdStep {
    /// Refuses momentum without a buffer; `has_momentum_buffer` says whether the call passed one.
    pub fn validate(&self, has_momentum_buffer: bool) -> Result<(), OpError> {
        if self.sgd.momentum != 0.0 && !has_momentum_buffer {
            return Err(OpError::MissingMomentumBuffer);
        }
        Ok(())
    }
}

/// One `torch.optim.Adam` step on `n` parameters, updating both moments.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    /// Elements of the parameter, its gradient and both moments.
    pub n: u64,
    /// The hyper-parameters.
    pub adam: Adam,
    /// The step number, counted from 1 (the bias corrections depend on it).
    pub step: u32,
}

impl AdamStep {
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

    /// The messages are the ones every backend reported before the checks moved here; the
    /// command line's outputs depend on them byte for byte.
    #[test]
    fn refusals_say_why() {
        let message = |r: Result<(), OpError>| r.map_err(|e| e.to_string()).err();
        assert_eq!(message(Mean { n: 0 }.validate()).as_deref(), Some("the mean of no elements is undefined"));
        assert_eq!(message(Mse { n: 0 }.validate()).as_deref(), Some("the mean of no elements is undefined"));
        for (rows, cols) in [(0, 3), (3, 0)] {
            assert_eq!(
                message(CrossEntropy { rows, cols }.validate()).as_deref(),
                Some("cross-entropy needs at least one row and one class")
            );
        }
        let momentum = Sgd { momentum: 0.9, ..Sgd::new(0.1) };
        let sgd = SgdStep { n: 4, sgd: momentum, first_step: true };
        assert_eq!(message(sgd.validate(false)).as_deref(), Some("SGD with momentum needs a momentum buffer"));
        let adam = AdamStep { n: 4, adam: Adam::default(), step: 0 };
        assert_eq!(message(adam.validate()).as_deref(), Some("Adam steps are counted from 1"));
    }

    #[test]
    fn valid_arguments_pass() {
        assert_eq!(Mean { n: 1 }.validate(), Ok(()));
        assert_eq!(Mse { n: 1 }.validate(), Ok(()));
        assert_eq!(CrossEntropy { rows: 1, cols: 1 }.validate(), Ok(()));
        let momentum = Sgd { momentum: 0.9, ..Sgd::new(0.1) };
        assert_eq!(SgdStep { n: 4, sgd: momentum, first_step: false }.validate(true), Ok(()));
        assert_eq!(SgdStep { n: 4, sgd: Sgd::new(0.1), first_step: false }.validate(false), Ok(()));
        assert_eq!(AdamStep { n: 4, adam: Adam::default(), step: 1 }.validate(), Ok(()));
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
        assert_eq!(Mean { n: 3 }.scale(), (1.0f64 / 3.0) as f32);
        assert_eq!(Mse { n: 3 }.grad_scale(), (2.0f64 / 3.0) as f32);
        assert_eq!(CrossEntropy { rows: 7, cols: 2 }.scale(), (1.0f64 / 7.0) as f32);
        assert_eq!(CrossEntropy { rows: 7, cols: 2 }.elements(), 14);
        assert_eq!(SumRows { rows: 5, cols: 6, accumulate: false }.elements(), 30);
    }
}
