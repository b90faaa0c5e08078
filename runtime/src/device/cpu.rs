//! CPU kernels of the simulator: the references of `cachalot_shaders::cpu`, with the matrix
//! product laid out for speed and spread over threads.
//!
//! [`matmul`] gives bit for bit what `cachalot_shaders::cpu::matmul` gives (every element is the
//! same f64 sum over `k` in the same order, rounded once), but transposes operands first so the
//! inner loop reads both contiguously, and splits the rows of `C` over the machine's cores: the
//! plain reference takes minutes on the products of a training step.

use cachalot_shaders::MatmulShape;

/// Products below this many multiply-adds run on the calling thread.
const PARALLEL_WORK: u64 = 1 << 18;

/// `C = op(A) · op(B) + beta · C (+ bias)`, exactly as `cachalot_shaders::cpu::matmul`.
pub fn matmul(a: &[f32], b: &[f32], c: &mut [f32], shape: MatmulShape, beta: f32, bias: Option<&[f32]>) {
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    if m == 0 || n == 0 {
        return;
    }
    // Row-major A [m, k] and B as its transpose [n, k]: both dot-product operands contiguous.
    let a_rows: Vec<f32> = if shape.trans_a { transpose(a, k, m) } else { a[..m * k].to_vec() };
    let b_cols: Vec<f32> = if shape.trans_b { b[..n * k].to_vec() } else { transpose(b, k, n) };
    let work = (m as u64) * (n as u64) * (k.max(1) as u64);
    let threads =
        if work < PARALLEL_WORK { 1 } else { std::thread::available_parallelism().map_or(1, |t| t.get()).min(m) };
    let rows_per = m.div_ceil(threads.max(1));
    let c = &mut c[..m * n];
    let run = |row0: usize, chunk: &mut [f32]| {
        for (r, out_row) in chunk.chunks_mut(n).enumerate() {
            let i = row0 + r;
            let a_row = &a_rows[i * k..(i + 1) * k];
            for (j, out) in out_row.iter_mut().enumerate() {
                let b_row = &b_cols[j * k..(j + 1) * k];
                let mut acc = 0.0f64;
                for p in 0..k {
                    acc += a_row[p] as f64 * b_row[p] as f64;
                }
                if beta != 0.0 {
                    acc += beta as f64 * *out as f64;
                }
                if let Some(bias) = bias {
                    acc += bias[j] as f64;
                }
                *out = acc as f32;
            }
        }
    };
    if threads <= 1 {
        run(0, c);
        return;
    }
    std::thread::scope(|scope| {
        for (t, chunk) in c.chunks_mut(rows_per * n).enumerate() {
            let run = &run;
            scope.spawn(move || run(t * rows_per, chunk));
        }
    });
}

/// The transpose of a row-major `[rows, cols]` matrix.
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = x[r * cols + c];
        }
    }
    out
}

/// The sum of `x` in f64.
pub fn sum(x: &[f32]) -> f64 {
    x.iter().map(|&v| v as f64).sum()
}

#[cfg(test)]
mod tests {
    use cachalot_shaders::cpu::{self, Rng};

    use super::*;

    #[test]
    fn equals_the_reference_bit_for_bit() {
        let mut rng = Rng::new(5);
        for shape in [
            MatmulShape::nn(67, 33, 129),
            MatmulShape::nt(70, 40, 100),
            MatmulShape::tn(64, 31, 90),
            MatmulShape::nn(1, 1, 0),
        ] {
            let (ea, eb, ec) = shape.elements();
            let a = rng.vec(ea as usize, -1.0, 1.0);
            let b = rng.vec(eb as usize, -1.0, 1.0);
            let c0 = rng.vec(ec as usize, -1.0, 1.0);
            let bias = rng.vec(shape.n as usize, -1.0, 1.0);
            for (beta, bias) in [(0.0, None), (1.0, Some(&bias[..]))] {
                let (mut want, mut got) = (c0.clone(), c0.clone());
                cpu::matmul(&a, &b, &mut want, shape, beta, bias);
                matmul(&a, &b, &mut got, shape, beta, bias);
                assert_eq!(got, want, "{shape:?}");
            }
        }
    }
}
