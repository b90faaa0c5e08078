//! `seeds`: the demonstrations PyTorch users learn memory from, as `capture.py`'s `seeds`
//! runs them (the marks of `shared/traces/pytorch-2.11-h200/seeds.expected.json`):
//!
//! ```python
//! a = torch.zeros(1).to("cuda"); mark("tiny"); del a; mark("tiny_del"); torch.cuda.empty_cache(); mark("tiny_empty")
//! a = torch.zeros(10240, 1050).to("cuda"); mark("10240x1050"); del a; torch.cuda.empty_cache(); mark("empty")
//! m = torch.nn.Linear(1024, 10).cuda(); mark("linear_model")
//! d = torch.zeros(10240, 1024).to("cuda"); mark("linear_input")
//! o = m(d); mark("linear_output"); del m, d, o; torch.cuda.empty_cache(); mark("linear_empty")
//! x = torch.zeros([1, 1024, 1024, 64], requires_grad=True, device="cuda"); y = 5 * x; mark("bw_y")
//! torch.mean(y).backward(); mark("bw_after"); del x, y; torch.cuda.empty_cache(); mark("bw_empty")
//! ```
//!
//! Autograd is written out: the allocations are the ones PyTorch 2.11's trace shows, in its
//! order — the mean's result, reduction staging and semaphore; the 4-byte ones gradient of the
//! loss; `grad_y` materialised (256 MiB); `grad_x = 5 · grad_y`; then `grad_y`, the ones and the
//! mean freed.

use cachalot_shaders::cpu::Rng;

use super::{Check, Outcome};
use crate::error::RuntimeError;
use crate::runtime::Runtime;

/// Runs `seeds` on `rt`.
pub async fn run(rt: &Runtime) -> Result<Outcome, RuntimeError> {
    let mut outcome = Outcome::default();

    rt.set_phase("tiny");
    let a = rt.from_f32(&[1], &[0.0])?;
    rt.mark("tiny")?;
    drop(a);
    rt.mark("tiny_del")?;
    rt.empty_cache()?;
    rt.mark("tiny_empty")?;

    rt.set_phase("10240x1050");
    let a = rt.zeros(&[10240, 1050])?;
    rt.mark("10240x1050")?;
    drop(a);
    rt.empty_cache()?;
    rt.mark("empty")?;

    // nn.Linear(1024, 10): weight then bias, uniform in ±1/sqrt(in) as PyTorch initialises.
    rt.set_phase("Linear(1024, 10)");
    let mut rng = Rng::new(2);
    let bound = 1.0 / 1024f32.sqrt();
    let w = rt.from_f32(&[10, 1024], &rng.vec(10 * 1024, -bound, bound))?;
    let b = rt.from_f32(&[10], &rng.vec(10, -bound, bound))?;
    rt.mark("linear_model")?;
    let d = rt.zeros(&[10240, 1024])?;
    rt.mark("linear_input")?;
    // The output first; on CUDA the first product then allocates the cuBLAS and cuBLASLt
    // workspaces, which stay.
    let o = rt.linear(&d, &w, Some(&b))?;
    rt.mark("linear_output")?;
    if rt.computes() {
        let bias = rt.read_f32(&b).await?;
        let out = rt.read_f32_prefix(&o, 20).await?;
        let ok = out[..10] == bias[..] && out[10..] == bias[..];
        outcome.checks.push(Check {
            name: "Linear(1024, 10) of zeros = bias".into(),
            passed: ok,
            detail: format!("first row {:?}", &out[..3]),
        });
    }
    // del m, d, o: PyTorch freed the input, the weight, the bias, then the output.
    drop(d);
    drop(w);
    drop(b);
    drop(o);
    rt.empty_cache()?;
    rt.mark("linear_empty")?;

    rt.set_phase("y = 5x");
    let shape = [1, 1024, 1024, 64];
    let n = shape.iter().product::<usize>();
    let x = rt.zeros(&shape)?;
    let y = rt.scale(&x, 5.0)?;
    rt.mark("bw_y")?;

    rt.set_phase("mean(y).backward()");
    let m = rt.mean(&y)?;
    let ones = rt.full(&[], 1.0)?; // autograd's ones_like(loss)
    let grad_y = rt.full(&shape, 1.0 / n as f32)?; // MeanBackward: expand(grad) / n, materialised
    let grad_x = rt.scale(&grad_y, 5.0)?; // MulBackward: 5 · grad, accumulated into x.grad
    drop(grad_y);
    drop(ones);
    drop(m);
    rt.mark("bw_after")?;
    if rt.computes() {
        let want = 5.0 / n as f32;
        let got = rt.read_f32_prefix(&grad_x, 4).await?;
        outcome.checks.push(Check {
            name: "x.grad of mean(5x) = 5/n".into(),
            passed: got.iter().all(|&g| (g - want).abs() <= want * 1e-6),
            detail: format!("{got:?}, want {want:e}"),
        });
    }
    // del x, y: x.grad goes with x.
    drop(grad_x);
    drop(x);
    drop(y);
    rt.empty_cache()?;
    rt.mark("bw_empty")?;
    Ok(outcome)
}
