//! `matmul-sweep`: matrix products over a range of shapes and layouts; every result is read
//! back and checked against the CPU reference (norm-wise relative error).

use web_time::Instant;

use cachalot_shaders::MatmulShape;
use cachalot_shaders::cpu::{self as reference, Rng};

use super::{Check, Outcome};
use crate::device::cpu;
use crate::error::RuntimeError;
use crate::runtime::Runtime;

/// Parameters of `matmul-sweep`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepParams {
    /// `(m, n, k)` of each product.
    pub shapes: Vec<(u32, u32, u32)>,
    /// Layouts: `nn`, `nt` (B transposed, the linear layer's forward) and `tn` (A transposed,
    /// its weight gradient).
    pub layouts: Vec<String>,
    /// Largest norm-wise relative error accepted.
    pub tolerance: f64,
    /// Seed of the operands.
    pub seed: u64,
}

impl Default for SweepParams {
    fn default() -> Self {
        SweepParams {
            shapes: vec![
                (64, 64, 64),
                (256, 256, 256),
                (512, 512, 512),
                (1024, 1024, 1024),
                (127, 33, 65),
                (333, 555, 77),
                (1, 1000, 300),
                (300, 1, 1000),
            ],
            layouts: vec!["nn".into(), "nt".into(), "tn".into()],
            tolerance: 1e-4,
            seed: 0,
        }
    }
}

/// `(m, n, k)` and a layout as a [`MatmulShape`].
pub fn shape_of(m: u32, n: u32, k: u32, layout: &str) -> Result<MatmulShape, RuntimeError> {
    match layout {
        "nn" => Ok(MatmulShape::nn(m, n, k)),
        "nt" => Ok(MatmulShape::nt(m, n, k)),
        "tn" => Ok(MatmulShape::tn(m, n, k)),
        other => Err(RuntimeError::Parameters(format!("layout '{other}' (expected nn, nt or tn)"))),
    }
}

/// Runs `matmul-sweep` on `rt`.
pub async fn run(rt: &Runtime, params: &SweepParams) -> Result<Outcome, RuntimeError> {
    let mut outcome = Outcome::default();
    let mut rng = Rng::new(params.seed);
    let binding_limit = rt.device_facts().max_binding_size;
    for &(m, n, k) in &params.shapes {
        for layout in &params.layouts {
            let shape = shape_of(m, n, k, layout)?;
            let label = format!("{m}x{n}x{k} {layout}");
            rt.set_phase(label.clone());
            let (ea, eb, ec) = shape.elements();
            // Products need every operand bound whole: a device limit makes this shape impossible.
            if let Some(limit) = binding_limit.filter(|&l| ea.max(eb).max(ec) * 4 > l) {
                let note = format!(
                    "{label}: skipped, an operand of {} bytes is over max_storage_buffer_binding_size ({limit} bytes)",
                    ea.max(eb).max(ec) * 4
                );
                outcome.checks.push(Check { name: label.clone(), passed: true, detail: note.clone() });
                rt.note(note);
                continue;
            }
            let a_host = rng.vec(ea as usize, -1.0, 1.0);
            let b_host = rng.vec(eb as usize, -1.0, 1.0);
            let start = Instant::now();
            let a = rt.from_f32(&[ea as usize], &a_host)?;
            let b = rt.from_f32(&[eb as usize], &b_host)?;
            let c = rt.matmul(&a, &b, shape)?;
            let got = rt.read_f32(&c).await?;
            rt.record_time(label.clone(), start.elapsed());
            rt.mark(label.clone())?;
            drop((a, b, c));
            if rt.computes() {
                let mut want = vec![0.0f32; ec as usize];
                cpu::matmul(&a_host, &b_host, &mut want, shape, 0.0, None);
                let error = reference::relative_error(&got, &want);
                outcome.checks.push(Check {
                    name: label,
                    passed: error <= params.tolerance,
                    detail: format!("relative error {error:.2e} (tolerance {:.0e})", params.tolerance),
                });
            }
        }
    }
    Ok(outcome)
}
