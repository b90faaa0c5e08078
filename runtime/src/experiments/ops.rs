//! `ops FILE`: an op file of `shared/bench/` (`a ID SIZE [STREAM]`, `f ID`) as allocations of
//! the device, with no kernels. Streams are folded onto the default stream, as PyTorch's
//! reference harness (`torch_alloc_bench.py`) replays them.

use web_time::Instant;

use cachalot_trace::ops::{Op, OpFile};

use super::Outcome;
use crate::error::RuntimeError;
use crate::runtime::{Runtime, Tensor};

/// Parameters of `ops`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OpsParams {
    /// The op file.
    pub path: String,
    /// A mark every this many ops (0: only at the end).
    pub mark_every: usize,
    /// Ops per second to run at, sleeping between steps (0: as fast as possible): a run paced
    /// like a real job, for measuring what watching it costs (`cachalot view --bench-live`).
    /// The sleeps are not counted in the op loop's time. Ignored in the browser.
    #[serde(default)]
    pub ops_per_second: u64,
}

/// Ops run between two [`Runtime::yield_now`]s: an op file has no readbacks, and a page must
/// get to draw while a long one runs.
const OPS_PER_YIELD: usize = 20_000;
/// Ops between two pauses of a paced run.
#[cfg(not(target_arch = "wasm32"))]
const OPS_PER_PACE: usize = 500;

/// Runs `ops` on `rt`, reading the op file at `params.path`.
pub async fn run(rt: &Runtime, params: &OpsParams) -> Result<Outcome, RuntimeError> {
    let text = read(&params.path)?;
    run_text(rt, params, &text).await
}

/// The text of the op file at `path`, read within the input limit every reader applies
/// ([`cachalot_trace::input`]).
pub fn read(path: &str) -> Result<String, RuntimeError> {
    let input = |message: String| RuntimeError::Input { path: path.to_owned(), message };
    let bytes = cachalot_trace::input::read(std::path::Path::new(path)).map_err(|e| input(e.reason()))?;
    String::from_utf8(bytes)
        .map_err(|e| input(format!("not an op file: not UTF-8 text (byte {} is not)", e.utf8_error().valid_up_to())))
}

/// Runs `ops` on `rt` with the op file's text (the browser's uploaded file); `params.path`
/// names it in errors.
pub async fn run_text(rt: &Runtime, params: &OpsParams, text: &str) -> Result<Outcome, RuntimeError> {
    let input = |message: String| RuntimeError::Input { path: params.path.clone(), message };
    let file = OpFile::parse(text).map_err(|e| input(e.to_string()))?;
    let mut outcome = Outcome::default();
    let mut live: Vec<Option<Tensor>> = (0..file.handles).map(|_| None).collect();
    rt.set_phase("ops");
    // The time spent running ops, not the pauses at `yield_now` (where a page draws).
    let mut elapsed = std::time::Duration::ZERO;
    let mut start = Instant::now();
    // A paced run's schedule starts here (natively: the browser has no thread to sleep).
    #[cfg(not(target_arch = "wasm32"))]
    let began = start;
    for (i, op) in file.ops.iter().enumerate() {
        match *op {
            Op::Alloc { id, size, .. } => {
                // An out-of-memory error (or any other) names the op file and the line it came from.
                let tensor = rt.raw(size).map_err(|e| match OpFile::line_of(text, i) {
                    Some(line) => input(format!("line {line}: {e}")),
                    None => e,
                })?;
                live[id as usize] = Some(tensor);
            }
            Op::Free { id } => live[id as usize] = None,
        }
        if params.mark_every > 0 && (i + 1) % params.mark_every == 0 {
            rt.mark(format!("op {}", i + 1))?;
        }
        if (i + 1) % OPS_PER_YIELD == 0 {
            elapsed += start.elapsed();
            rt.yield_now().await;
            start = Instant::now();
        }
        #[cfg(not(target_arch = "wasm32"))]
        if params.ops_per_second > 0 && (i + 1) % OPS_PER_PACE == 0 {
            let due = began + std::time::Duration::from_secs_f64((i + 1) as f64 / params.ops_per_second as f64);
            let now = Instant::now();
            if due > now {
                elapsed += now - start;
                std::thread::sleep(due - now);
                start = Instant::now();
            }
        }
    }
    elapsed += start.elapsed();
    rt.record_time("ops", elapsed);
    rt.mark("end")?;
    live.clear();
    rt.mark("freed")?;
    rt.empty_cache()?;
    rt.mark("empty")?;
    outcome.lines.push(format!(
        "{} ops in {:.3} s ({:.0} ns per op, allocator and device together)",
        file.ops.len(),
        elapsed.as_secs_f64(),
        elapsed.as_nanos() as f64 / file.ops.len().max(1) as f64
    ));
    Ok(outcome)
}
