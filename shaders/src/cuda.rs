//! CUDA C sources of the element-wise, loss and optimiser kernels, for NVRTC.
//!
//! [`KERNELS`] is one translation unit with no `#include`, so NVRTC compiles it without a CUDA
//! toolkit on the include path. Every kernel is `extern "C"` (its name survives compilation)
//! and computes the same function as the WGSL entry point of the same name in
//! [`crate::wgsl`]; the matrix products of the CUDA backend go to cuBLAS instead.
//!
//! Launch rules: 1-D kernels use grid-stride loops, so any grid is correct; `mse_loss` and
//! `xent_mean` take one block of 256 threads; `xent_rows` one block of 256 threads per row.
//!
//! | kernel | signature |
//! |---|---|
//! | `fill` | `(float* x, float value, u64 n)` |
//! | `copy` | `(const float* x, float* y, u64 n)` |
//! | `add_bias` | `(float* x, const float* bias, u64 n, u32 cols)`: `x[r, c] += bias[c]` |
//! | `sum_rows` | `(const float* x, float* out, u32 rows, u32 cols, int accumulate)`: bias gradient |
//! | `relu_forward` | `(const float* x, float* y, u64 n)` |
//! | `relu_backward` | `(const float* input, const float* grad_out, float* grad_in, u64 n)` |
//! | `gelu_forward` | `(const float* x, float* y, u64 n)` (exact GELU) |
//! | `gelu_backward` | `(const float* input, const float* grad_out, float* grad_in, u64 n)` |
//! | `mse_loss` | `(const float* pred, const float* target, float* loss, u64 n, float scale)` |
//! | `mse_grad` | `(const float* pred, const float* target, float* grad, u64 n, float scale)` |
//! | `xent_rows` | `(const float* logits, const u32* targets, float* grad, float* row_loss, u32 rows, u32 cols, float scale)` |
//! | `xent_mean` | `(const float* row_loss, float* loss, u32 rows, float scale)` |
//! | `sgd_step` | `(float* param, const float* grad, float* momentum_buf, u64 n, float lr, float momentum, float dampening, float weight_decay, int nesterov, int first_step)` |
//! | `adam_step` | `(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, u64 n, float step_size, float beta1, float beta2, float eps, float weight_decay, float sqrt_bc2)` |
//!
//! `u64` is `unsigned long long`, `u32` is `unsigned int`. Scales and step constants are as in
//! [`crate::cpu`]: `mse_loss` scale `1/n`, `mse_grad` scale `2/n`, `xent_*` scale `1/rows`,
//! Adam's `(step_size, sqrt_bc2)` from [`crate::Adam::step_constants`].

/// The CUDA C translation unit.
pub const KERNELS: &str = include_str!("../cuda/kernels.cu");

/// The names of the kernels in [`KERNELS`], for loading them from the compiled module.
pub const KERNEL_NAMES: &[&str] = &[
    "fill",
    "copy",
    "add_bias",
    "sum_rows",
    "relu_forward",
    "relu_backward",
    "gelu_forward",
    "gelu_backward",
    "mse_loss",
    "mse_grad",
    "xent_rows",
    "xent_mean",
    "sgd_step",
    "adam_step",
];

/// Threads per block that the reductions (`mse_loss`, `xent_rows`, `xent_mean`) require.
pub const REDUCTION_BLOCK: u32 = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_kernel_is_defined_extern_c() {
        for name in KERNEL_NAMES {
            let signature = format!("extern \"C\" __global__ void {name}(");
            assert!(KERNELS.contains(&signature), "{name} is not defined");
        }
        assert_eq!(KERNELS.matches("extern \"C\" __global__").count(), KERNEL_NAMES.len());
        assert!(!KERNELS.contains("#include"), "NVRTC must compile it without headers");
    }
}
