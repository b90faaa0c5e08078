//! # cachalot-shaders
//!
//! The kernels cachalot runs on its allocations, in three forms that compute the same
//! functions:
//!
//! - [`wgsl`]: WGSL compute shaders for the wgpu backend (`cachalot-wgpu`): a tiled, vectorised
//!   f32 matrix product (NN, NT, TN, with bias and accumulation: the linear layer's forward and
//!   backward passes), ReLU and GELU forward and backward, bias add and bias gradient, MSE and
//!   softmax cross-entropy with their gradients, SGD and Adam steps, fill and copy.
//! - [`cuda`]: CUDA C sources of the same element-wise, loss and optimiser kernels for the CUDA
//!   backend, which compiles them with NVRTC (its matrix products go to cuBLAS).
//! - [`cpu`]: plain-Rust reference implementations (f32 data, f64 accumulation), which the
//!   GPU tests compare against.
//!
//! The hyper-parameter types ([`MatmulShape`], [`Sgd`], [`Adam`]) are shared by all three,
//! and [`ops`] defines each op once: its arguments and the checks every backend makes.
//! This crate depends on no GPU crate, so every backend can use it.

#![forbid(unsafe_code)]

pub mod cpu;
pub mod cuda;
pub mod ops;
pub mod wgsl;

/// Shape of `C = op(A) · op(B)`, all matrices row-major.
///
/// `op(A)` is `[m, k]`: `A` is stored `[m, k]`, or `[k, m]` when `trans_a`. `op(B)` is
/// `[k, n]`: `B` is stored `[k, n]`, or `[n, k]` when `trans_b`. `C` is `[m, n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulShape {
    /// Rows of `C` and of `op(A)`.
    pub m: u32,
    /// Columns of `C` and of `op(B)`.
    pub n: u32,
    /// The contracted dimension.
    pub k: u32,
    /// `A` is stored transposed, as `[k, m]`.
    pub trans_a: bool,
    /// `B` is stored transposed, as `[n, k]`.
    pub trans_b: bool,
}

impl MatmulShape {
    /// `C[m, n] = A[m, k] · B[k, n]`.
    pub fn nn(m: u32, n: u32, k: u32) -> Self {
        MatmulShape { m, n, k, trans_a: false, trans_b: false }
    }

    /// `C[m, n] = A[m, k] · B[n, k]ᵀ` (the linear layer's forward pass, `x · Wᵀ`).
    pub fn nt(m: u32, n: u32, k: u32) -> Self {
        MatmulShape { m, n, k, trans_a: false, trans_b: true }
    }

    /// `C[m, n] = A[k, m]ᵀ · B[k, n]` (the linear layer's weight gradient, `dyᵀ · x`).
    pub fn tn(m: u32, n: u32, k: u32) -> Self {
        MatmulShape { m, n, k, trans_a: true, trans_b: false }
    }

    /// Whether `C` is empty (`m` or `n` is 0): the product does nothing.
    pub fn is_empty(&self) -> bool {
        self.m == 0 || self.n == 0
    }

    /// Elements of `A`, `B` and `C`.
    pub fn elements(&self) -> (u64, u64, u64) {
        let (m, n, k) = (self.m as u64, self.n as u64, self.k as u64);
        (m * k, k * n, m * n)
    }

    /// Floating-point operations of the product (`2·m·n·k`).
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// `torch.optim.SGD` hyper-parameters (`maximize=False`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor; 0 disables the momentum buffer.
    pub momentum: f32,
    /// Dampening of the momentum.
    pub dampening: f32,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
    /// Nesterov momentum.
    pub nesterov: bool,
}

impl Sgd {
    /// Plain SGD with learning rate `lr` (PyTorch's defaults otherwise).
    pub fn new(lr: f32) -> Self {
        Sgd { lr, momentum: 0.0, dampening: 0.0, weight_decay: 0.0, nesterov: false }
    }
}

/// `torch.optim.Adam` hyper-parameters (`amsgrad=False`, `maximize=False`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adam {
    /// Learning rate.
    pub lr: f32,
    /// Decay of the first moment.
    pub beta1: f32,
    /// Decay of the second moment.
    pub beta2: f32,
    /// Term added to the denominator.
    pub eps: f32,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
}

impl Default for Adam {
    /// PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay.
    fn default() -> Self {
        Adam { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 }
    }
}

impl Adam {
    /// `(step_size, sqrt_bc2)` of step `step` (counted from 1), computed in f64 as PyTorch
    /// computes them in Python floats: `lr / (1 - beta1^step)` and `sqrt(1 - beta2^step)`.
    pub fn step_constants(&self, step: u32) -> (f32, f32) {
        let t = step.max(1) as i32;
        let bc1 = 1.0 - (self.beta1 as f64).powi(t);
        let bc2 = 1.0 - (self.beta2 as f64).powi(t);
        ((self.lr as f64 / bc1) as f32, bc2.sqrt() as f32)
    }
}
