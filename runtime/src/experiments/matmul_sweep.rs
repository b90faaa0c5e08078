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

/// Bytes of a product's three f32 operands, which are on the device (and on the host) at once.
fn operand_bytes(m: u32, n: u32, k: u32) -> u128 {
    let (m, n, k) = (u128::from(m), u128::from(n), u128::from(k));
    4 * (m * k + k * n + m * n)
}

/// Checks every shape against the memory of the device described by `facts`, before any
/// buffer is made: a product whose operands alone take more than the whole device would only
/// fail after its operands had been built on the host (40 GB for one 100000³ operand).
pub fn check(params: &SweepParams, facts: &cachalot_core::DeviceFacts) -> Result<(), RuntimeError> {
    for &(m, n, k) in &params.shapes {
        let bytes = operand_bytes(m, n, k);
        if bytes > u128::from(facts.total_memory) {
            return Err(RuntimeError::Parameters(format!(
                "shape {m}x{n}x{k}: its operands take {bytes} bytes, more than the device's {} bytes ({})",
                facts.total_memory,
                cachalot_core::error::format_size(facts.total_memory)
            )));
        }
    }
    Ok(())
}

/// `elements` random operand values in `[-1, 1)`, or an error naming the product where the
/// host cannot hold them (instead of the process aborting on a failed allocation).
fn host_operand(rng: &mut Rng, elements: u64, label: &str) -> Result<Vec<f32>, RuntimeError> {
    let refused =
        || RuntimeError::Parameters(format!("{label}: an operand of {elements} elements does not fit in host memory"));
    let n = usize::try_from(elements).map_err(|_| refused())?;
    let mut values = Vec::new();
    values.try_reserve_exact(n).map_err(|_| refused())?;
    values.extend((0..n).map(|_| rng.uniform(-1.0, 1.0)));
    Ok(values)
}

/// Runs `matmul-sweep` on `rt`.
pub async fn run(rt: &Runtime, params: &SweepParams) -> Result<Outcome, RuntimeError> {
    check(params, &rt.device_facts())?;
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
            let a_host = host_operand(&mut rng, ea, &label)?;
            let b_host = host_operand(&mut rng, eb, &label)?;
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
