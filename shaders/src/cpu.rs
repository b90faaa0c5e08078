//! CPU reference implementations of every kernel: the functions the GPU tests compare with.
//!
//! Data are f32, flat and row-major (`x[r * cols + c]`); sums accumulate in f64, so the
//! references are at least as precise as any kernel. Slices must hold at least the elements
//! the shape names: a shorter slice panics, as indexing does (these are test oracles, not a
//! runtime).

use crate::ops::Activation;
use crate::{Adam, MatmulShape, Sgd};

/// `C = op(A) · op(B) + beta · C (+ bias[n] per row)`; see [`MatmulShape`] for the layouts.
/// `beta == 0` ignores the old `C` (even NaN), as BLAS does.
pub fn matmul(a: &[f32], b: &[f32], c: &mut [f32], shape: MatmulShape, beta: f32, bias: Option<&[f32]>) {
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let a_at = |i: usize, p: usize| if shape.trans_a { a[p * m + i] } else { a[i * k + p] };
    let b_at = |p: usize, j: usize| if shape.trans_b { b[j * k + p] } else { b[p * n + j] };
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f64;
            for p in 0..k {
                acc += a_at(i, p) as f64 * b_at(p, j) as f64;
            }
            if beta != 0.0 {
                acc += beta as f64 * c[i * n + j] as f64;
            }
            if let Some(bias) = bias {
                acc += bias[j] as f64;
            }
            c[i * n + j] = acc as f32;
        }
    }
}

/// Linear layer forward, `y[batch, out] = x[batch, in] · w[out, in]ᵀ + bias[out]`
/// (PyTorch's `nn.Linear` weight layout).
pub fn linear_forward(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    batch: u32,
    inputs: u32,
    outputs: u32,
) {
    matmul(x, w, y, MatmulShape::nt(batch, outputs, inputs), 0.0, bias);
}

/// Linear layer backward from `dy[batch, out]`: `dx[batch, in] = dy · w`,
/// `dw[out, in] = dyᵀ · x` and `db[out] = Σ_batch dy` (gradients overwritten, not accumulated).
#[allow(clippy::too_many_arguments)] // mirrors the kernel's operands one to one
pub fn linear_backward(
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    dw: &mut [f32],
    db: Option<&mut [f32]>,
    batch: u32,
    inputs: u32,
    outputs: u32,
) {
    matmul(dy, w, dx, MatmulShape::nn(batch, inputs, outputs), 0.0, None);
    matmul(dy, x, dw, MatmulShape::tn(outputs, inputs, batch), 0.0, None);
    if let Some(db) = db {
        sum_rows(dy, db, batch, outputs, false);
    }
}

/// `x[i] = value`.
pub fn fill(x: &mut [f32], value: f32) {
    x.fill(value);
}

/// `y[i] = x[i]` over `y.len()` elements.
pub fn copy(x: &[f32], y: &mut [f32]) {
    let n = y.len();
    y.copy_from_slice(&x[..n]);
}

/// `x[r, c] += bias[c]` for `x` of `[rows, cols]`, `cols = bias.len()`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// Column sums `out[c] = Σ_r x[r, c]` (plus the old `out[c]` when `accumulate`): the bias
/// gradient of a linear layer.
pub fn sum_rows(x: &[f32], out: &mut [f32], rows: u32, cols: u32, accumulate: bool) {
    let (rows, cols) = (rows as usize, cols as usize);
    for j in 0..cols {
        let mut acc: f64 = if accumulate { out[j] as f64 } else { 0.0 };
        for r in 0..rows {
            acc += x[r * cols + j] as f64;
        }
        out[j] = acc as f32;
    }
}

/// `y = max(x, 0)`.
pub fn relu_forward(x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y = x.max(0.0);
    }
}

/// `grad_in = grad_out` where `input > 0`, else 0 (PyTorch's `threshold_backward`).
pub fn relu_backward(input: &[f32], grad_out: &[f32], grad_in: &mut [f32]) {
    for ((g, &x), &dy) in grad_in.iter_mut().zip(input).zip(grad_out) {
        *g = if x > 0.0 { dy } else { 0.0 };
    }
}

/// `y = act(x)`.
pub fn activation_forward(act: Activation, x: &[f32], y: &mut [f32]) {
    match act {
        Activation::Relu => relu_forward(x, y),
        Activation::Gelu => gelu_forward(x, y),
    }
}

/// `grad_in = act'(input) · grad_out`.
pub fn activation_backward(act: Activation, input: &[f32], grad_out: &[f32], grad_in: &mut [f32]) {
    match act {
        Activation::Relu => relu_backward(input, grad_out, grad_in),
        Activation::Gelu => gelu_backward(input, grad_out, grad_in),
    }
}

/// Complementary error function in f64, accurate to about 1e-14 relative: the power series
/// of erf below 2.5 and Lentz's continued fraction of erfc above (independent of the
/// Chebyshev fit the kernels use).
pub fn erfc(x: f64) -> f64 {
    if x < 0.0 {
        return 2.0 - erfc(-x);
    }
    if x < 2.5 {
        // erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        let mut term = x;
        let mut sum = x;
        let x2 = x * x;
        for n in 1..200 {
            term *= -x2 / n as f64;
            let add = term / (2 * n + 1) as f64;
            sum += add;
            if add.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        return 1.0 - sum * std::f64::consts::FRAC_2_SQRT_PI;
    }
    // erfc(x) = exp(-x^2)/sqrt(pi) * 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), evaluated
    // with the modified Lentz method.
    let tiny = 1e-300;
    let mut f = x;
    let mut c = x;
    let mut d = 0.0;
    for n in 1..500 {
        let a = n as f64 / 2.0;
        d = x + a * d;
        if d.abs() < tiny {
            d = tiny;
        }
        c = x + a / c;
        if c.abs() < tiny {
            c = tiny;
        }
        d = 1.0 / d;
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    (-x * x).exp() / (f * std::f64::consts::PI.sqrt())
}

/// Standard normal CDF.
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
}

/// Exact GELU, `y = x · Φ(x)` (PyTorch's `approximate='none'`).
pub fn gelu_forward(x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        let v = x as f64;
        *y = (v * normal_cdf(v)) as f32;
    }
}

/// `grad_in = grad_out · (Φ(x) + x · φ(x))`.
pub fn gelu_backward(input: &[f32], grad_out: &[f32], grad_in: &mut [f32]) {
    for ((g, &x), &dy) in grad_in.iter_mut().zip(input).zip(grad_out) {
        let v = x as f64;
        let density = (-0.5 * v * v).exp() / (2.0 * std::f64::consts::PI).sqrt();
        *g = (dy as f64 * (normal_cdf(v) + v * density)) as f32;
    }
}

/// `mean((pred - target)²)` over `pred.len()` elements.
pub fn mse_loss(pred: &[f32], target: &[f32]) -> f32 {
    let sum: f64 = pred.iter().zip(target).map(|(&p, &t)| (p as f64 - t as f64).powi(2)).sum();
    (sum / pred.len().max(1) as f64) as f32
}

/// `grad = scale · (pred - target)`; `scale = 2 / n` times the incoming gradient of the loss.
pub fn mse_grad(pred: &[f32], target: &[f32], grad: &mut [f32], scale: f32) {
    for ((g, &p), &t) in grad.iter_mut().zip(pred).zip(target) {
        *g = (scale as f64 * (p as f64 - t as f64)) as f32;
    }
}

/// Softmax cross-entropy of `logits[rows, cols]` against class indices `targets[rows]`, mean
/// over rows (PyTorch's `cross_entropy(reduction='mean')`). Writes
/// `grad = scale · (softmax - onehot)` (`scale = 1 / rows` times the incoming gradient) and
/// returns the loss. A target outside `[0, cols)` makes the loss NaN.
pub fn cross_entropy(logits: &[f32], targets: &[u32], grad: &mut [f32], rows: u32, cols: u32, scale: f32) -> f32 {
    let (rows, cols) = (rows as usize, cols as usize);
    let mut total = 0.0f64;
    for r in 0..rows {
        let row = &logits[r * cols..(r + 1) * cols];
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
        let t = targets[r] as usize;
        total += if t < cols { sum.ln() + max - row[t] as f64 } else { f64::NAN };
        for (j, &v) in row.iter().enumerate() {
            let prob = (v as f64 - max).exp() / sum;
            let onehot = if j == t { 1.0 } else { 0.0 };
            grad[r * cols + j] = (scale as f64 * (prob - onehot)) as f32;
        }
    }
    (total / rows.max(1) as f64) as f32
}

/// One `torch.optim.SGD` step on `param` (`first_step`: the momentum buffer is initialised
/// from the gradient, as PyTorch does when it has none yet). `momentum_buf` may be empty
/// when `momentum == 0`.
pub fn sgd_step(param: &mut [f32], grad: &[f32], momentum_buf: &mut [f32], sgd: Sgd, first_step: bool) {
    for i in 0..param.len() {
        let mut g = grad[i];
        if sgd.weight_decay != 0.0 {
            g += sgd.weight_decay * param[i];
        }
        if sgd.momentum != 0.0 {
            let buf = if first_step { g } else { sgd.momentum * momentum_buf[i] + (1.0 - sgd.dampening) * g };
            momentum_buf[i] = buf;
            g = if sgd.nesterov { g + sgd.momentum * buf } else { buf };
        }
        param[i] -= sgd.lr * g;
    }
}

/// One `torch.optim.Adam` step (`step` counted from 1) on `param`, updating the moments.
pub fn adam_step(param: &mut [f32], grad: &[f32], exp_avg: &mut [f32], exp_avg_sq: &mut [f32], adam: Adam, step: u32) {
    let (step_size, sqrt_bc2) = adam.step_constants(step);
    for i in 0..param.len() {
        let mut g = grad[i];
        if adam.weight_decay != 0.0 {
            g += adam.weight_decay * param[i];
        }
        let m = exp_avg[i] + (1.0 - adam.beta1) * (g - exp_avg[i]);
        let v = adam.beta2 * exp_avg_sq[i] + (1.0 - adam.beta2) * g * g;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        param[i] -= step_size * m / (v.sqrt() / sqrt_bc2 + adam.eps);
    }
}

/// Largest element-wise difference relative to the largest reference magnitude,
/// `max|got - want| / max|want|` (the norm-wise relative error of BLAS tests; an element that
/// is NaN in one and not the other counts as infinitely wrong).
pub fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "compared slices differ in length");
    let scale = want.iter().fold(0.0f64, |m, &w| m.max((w as f64).abs())).max(f64::MIN_POSITIVE);
    got.iter()
        .zip(want)
        .map(|(&g, &w)| match (g.is_nan(), w.is_nan()) {
            (true, true) => 0.0,
            (false, false) => (g as f64 - w as f64).abs() / scale,
            _ => f64::INFINITY,
        })
        .fold(0.0, f64::max)
}

/// Largest element-wise relative difference `|got - want| / max(|want|, floor)`: stricter than
/// [`relative_error`] for element-wise kernels, where every element stands alone.
pub fn elementwise_relative_error(got: &[f32], want: &[f32], floor: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "compared slices differ in length");
    got.iter()
        .zip(want)
        .map(|(&g, &w)| match (g.is_nan(), w.is_nan()) {
            (true, true) => 0.0,
            (false, false) => (g as f64 - w as f64).abs() / (w as f64).abs().max(floor),
            _ => f64::INFINITY,
        })
        .fold(0.0, f64::max)
}

/// A small deterministic generator (SplitMix64) for test inputs, so tests need no extra crate
/// and a failing seed can be replayed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// A generator seeded from the clock: fresh inputs on every run (print the seed).
    pub fn from_time() -> (Self, u64) {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed);
        (Rng(seed), seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }

    /// `n` values uniform in `[lo, hi)`.
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    /// Uniform integer in `[0, bound)`.
    pub fn below(&mut self, bound: u32) -> u32 {
        (((self.next_u64() >> 32) * bound as u64) >> 32) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_variants_agree_with_explicit_transposes() {
        let mut rng = Rng::new(1);
        let (m, n, k) = (5usize, 7usize, 3usize);
        let a = rng.vec(m * k, -1.0, 1.0);
        let b = rng.vec(k * n, -1.0, 1.0);
        let transpose = |x: &[f32], rows: usize, cols: usize| {
            let mut t = vec![0.0; rows * cols];
            for r in 0..rows {
                for c in 0..cols {
                    t[c * rows + r] = x[r * cols + c];
                }
            }
            t
        };
        let mut nn = vec![0.0; m * n];
        matmul(&a, &b, &mut nn, MatmulShape::nn(m as u32, n as u32, k as u32), 0.0, None);
        let mut tn = vec![0.0; m * n];
        matmul(&transpose(&a, m, k), &b, &mut tn, MatmulShape::tn(m as u32, n as u32, k as u32), 0.0, None);
        let mut nt = vec![0.0; m * n];
        matmul(&a, &transpose(&b, k, n), &mut nt, MatmulShape::nt(m as u32, n as u32, k as u32), 0.0, None);
        assert_eq!(nn, tn);
        assert_eq!(nn, nt);
        // Element (1, 2) by hand; beta and bias.
        let want: f32 = (0..k).map(|p| a[k + p] * b[p * n + 2]).sum();
        assert!((nn[n + 2] - want).abs() < 1e-6);
        let bias: Vec<f32> = (0..n).map(|j| j as f32).collect();
        let mut acc = nn.clone();
        matmul(&a, &b, &mut acc, MatmulShape::nn(m as u32, n as u32, k as u32), 1.0, Some(&bias));
        assert!((acc[n + 2] - (2.0 * want + 2.0)).abs() < 1e-5);
    }

    #[test]
    fn erfc_matches_known_values() {
        // Values from tables of erfc (the C library's erfc, through Python's math.erfc).
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.4795001221869535),
            (1.0, 0.15729920705028513),
            (2.0, 0.004677734981047266),
            (2.4999, 4.071699003334514e-4),
            (2.5, 4.069_520_174_449_59e-4),
            (3.0, 2.209049699858544e-5),
            (5.0, 1.537_459_794_428_035e-12),
            (10.0, 2.088487583762545e-45),
            (-1.0, 1.8427007929497148),
        ] {
            let got = erfc(x);
            assert!(((got - want) / want).abs() < 1e-9, "erfc({x}) = {got}, want {want}");
        }
        assert!((normal_cdf(1.0) - 0.8413447460685429).abs() < 1e-12);
    }

    /// Central differences of a scalar function of one input element.
    fn numeric_grad(f: &dyn Fn(&[f32]) -> f64, x: &[f32], i: usize) -> f64 {
        let h = 1e-2f32;
        let mut plus = x.to_vec();
        plus[i] += h;
        let mut minus = x.to_vec();
        minus[i] -= h;
        (f(&plus) - f(&minus)) / (2.0 * h as f64)
    }

    #[test]
    fn gelu_backward_is_the_derivative_of_gelu_forward() {
        let x: Vec<f32> = vec![-4.0, -1.5, -0.3, 0.0, 0.2, 1.0, 3.0];
        let ones = vec![1.0; x.len()];
        let mut grad = vec![0.0; x.len()];
        gelu_backward(&x, &ones, &mut grad);
        for i in 0..x.len() {
            let f = |v: &[f32]| {
                let mut y = vec![0.0; v.len()];
                gelu_forward(v, &mut y);
                y[i] as f64
            };
            assert!((numeric_grad(&f, &x, i) - grad[i] as f64).abs() < 1e-3, "at {}", x[i]);
        }
        let mut y = vec![0.0; 1];
        gelu_forward(&[1.0], &mut y);
        assert!((y[0] as f64 - 0.841_344_746_068_543).abs() < 1e-7);
    }

    #[test]
    fn loss_gradients_are_derivatives_of_the_losses() {
        let mut rng = Rng::new(7);
        let (rows, cols) = (3u32, 5u32);
        let logits = rng.vec((rows * cols) as usize, -2.0, 2.0);
        let targets = vec![0u32, 4, 2];
        let mut grad = vec![0.0; logits.len()];
        let loss = cross_entropy(&logits, &targets, &mut grad, rows, cols, 1.0 / rows as f32);
        assert!(loss > 0.0);
        let mut scratch = vec![0.0; logits.len()];
        for (i, &g) in grad.iter().enumerate() {
            let f = |v: &[f32]| cross_entropy(v, &targets, &mut scratch.clone(), rows, cols, 1.0) as f64;
            assert!((numeric_grad(&f, &logits, i) - g as f64).abs() < 1e-3);
        }
        scratch.clear();
        let mut bad = vec![0.0; logits.len()];
        assert!(cross_entropy(&logits, &[0, 9, 1], &mut bad, rows, cols, 1.0).is_nan());

        let pred = rng.vec(6, -1.0, 1.0);
        let target = rng.vec(6, -1.0, 1.0);
        let mut grad = vec![0.0; 6];
        mse_grad(&pred, &target, &mut grad, 2.0 / 6.0);
        for (i, &g) in grad.iter().enumerate() {
            let f = |v: &[f32]| mse_loss(v, &target) as f64;
            assert!((numeric_grad(&f, &pred, i) - g as f64).abs() < 1e-4);
        }
    }

    #[test]
    fn linear_backward_matches_numeric_gradients() {
        let mut rng = Rng::new(3);
        let (batch, inputs, outputs) = (2u32, 3u32, 4u32);
        let x = rng.vec(6, -1.0, 1.0);
        let w = rng.vec(12, -1.0, 1.0);
        let bias = rng.vec(4, -1.0, 1.0);
        // Loss = sum(y * g) for a fixed g, so dy = g.
        let g = rng.vec(8, -1.0, 1.0);
        let loss = |x: &[f32], w: &[f32], bias: &[f32]| {
            let mut y = vec![0.0; 8];
            linear_forward(x, w, Some(bias), &mut y, batch, inputs, outputs);
            y.iter().zip(&g).map(|(&y, &g)| y as f64 * g as f64).sum::<f64>()
        };
        let (mut dx, mut dw, mut db) = (vec![0.0; 6], vec![0.0; 12], vec![0.0; 4]);
        linear_backward(&x, &w, &g, &mut dx, &mut dw, Some(&mut db), batch, inputs, outputs);
        for (i, &g) in dx.iter().enumerate() {
            assert!((numeric_grad(&|v| loss(v, &w, &bias), &x, i) - g as f64).abs() < 1e-3);
        }
        for (i, &g) in dw.iter().enumerate() {
            assert!((numeric_grad(&|v| loss(&x, v, &bias), &w, i) - g as f64).abs() < 1e-3);
        }
        for (i, &g) in db.iter().enumerate() {
            assert!((numeric_grad(&|v| loss(&x, &w, v), &bias, i) - g as f64).abs() < 1e-3);
        }
    }

    #[test]
    fn optimiser_steps_follow_pytorch() {
        // SGD with momentum: first step buf = g, then momentum * buf + g.
        let sgd = Sgd { lr: 0.1, momentum: 0.9, dampening: 0.0, weight_decay: 0.0, nesterov: false };
        let mut p = vec![1.0f32];
        let mut buf = vec![0.0f32];
        sgd_step(&mut p, &[0.5], &mut buf, sgd, true);
        assert!((p[0] - 0.95).abs() < 1e-7 && (buf[0] - 0.5).abs() < 1e-7);
        sgd_step(&mut p, &[0.5], &mut buf, sgd, false);
        assert!((buf[0] - 0.95).abs() < 1e-6 && (p[0] - 0.855).abs() < 1e-6);

        // Adam's first step moves each parameter by about lr (m̂ / sqrt(v̂) = sign(g)).
        let adam = Adam { lr: 0.01, ..Adam::default() };
        let mut p = vec![1.0f32, -1.0];
        let (mut m, mut v) = (vec![0.0; 2], vec![0.0; 2]);
        adam_step(&mut p, &[0.3, -2.0], &mut m, &mut v, adam, 1);
        assert!((p[0] - 0.99).abs() < 1e-6 && (p[1] + 0.99).abs() < 1e-6, "{p:?}");
    }

    #[test]
    fn relative_errors_treat_nan_as_wrong() {
        assert_eq!(relative_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((relative_error(&[1.0, 2.1], &[1.0, 2.0]) - 0.05).abs() < 1e-6);
        assert_eq!(relative_error(&[f32::NAN], &[1.0]), f64::INFINITY);
        assert_eq!(elementwise_relative_error(&[f32::NAN], &[f32::NAN], 1e-6), 0.0);
        let mut rng = Rng::new(9);
        assert!((0..1000).all(|_| rng.below(10) < 10));
    }
}
