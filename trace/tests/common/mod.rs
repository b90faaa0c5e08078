//! What the trace crate's integration tests share: where the reference traces are, and how a
//! trace is loaded with the `expected.json` recorded beside it.

use std::path::{Path, PathBuf};

use cachalot_trace::replay::ExpectedRun;
use cachalot_trace::snapshot::pickle::read_snapshot;
use cachalot_trace::snapshot::torch::TorchSnapshot;

/// The vendored copy of `../shared/traces/pytorch-2.11-h200` (see `testdata/README.md`).
#[allow(dead_code, reason = "not every test file reads the reference traces")]
pub fn vendored() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/traces/pytorch-2.11-h200")
}

/// The nine reference trace pickles, sorted by name.
#[allow(dead_code, reason = "not every test file reads the reference traces")]
pub fn reference_traces() -> Vec<PathBuf> {
    let traces = pickles_in(&vendored());
    assert_eq!(traces.len(), 9, "all nine reference traces");
    traces
}

/// The trace pickles in `dir` (not its subfolders), sorted by name.
#[allow(dead_code, reason = "not every test file reads a folder of traces")]
pub fn pickles_in(dir: &Path) -> Vec<PathBuf> {
    let mut traces: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e} (the traces are required)", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    traces.sort();
    traces
}

/// A trace pickle and the `NAME.expected.json` beside it.
pub fn load(path: &Path) -> (TorchSnapshot, ExpectedRun) {
    let snapshot = read_snapshot(&std::fs::read(path).unwrap()).unwrap();
    let expected = ExpectedRun::from_json(&std::fs::read(path.with_extension("expected.json")).unwrap()).unwrap();
    (snapshot, expected)
}

/// Replays the trace at `path` with the calls its `expected.json` lists and panics, naming the
/// file, where anything differs from what PyTorch recorded.
#[allow(dead_code, reason = "not every test file checks whole traces")]
pub fn assert_matches_pytorch(path: &Path) {
    use cachalot_trace::replay::{ReplayOptions, replay, verify_against_recording};
    let (snapshot, expected) = load(path);
    let options = ReplayOptions::for_snapshot(&snapshot, Some(&expected)).unwrap();
    let outcome = replay(&snapshot, &options, |_, _| {}).unwrap();
    outcome.allocator.check_consistency().unwrap();
    if let Err(difference) = verify_against_recording(&snapshot, &outcome, Some(&expected)) {
        panic!("{}: {difference}", path.display());
    }
}
