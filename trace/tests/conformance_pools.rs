//! Traces of PyTorch 2.11 programs that use private pools (`torch.cuda.MemPool` +
//! `use_mem_pool`, a CUDA graph capture), captured on an H100 by
//! `scripts/conformance/capture_pools.py`: each must replay to exactly what PyTorch recorded
//! (segment events, final segments with their `segment_pool_id`, every `memory_stats()` key,
//! `memory_summary()`, the OOM messages), the pool calls made where the capture listed them.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::path::PathBuf;

use cachalot_trace::replay::{CallKind, ReplayOptions, replay, verify_against_recording};

mod common;

fn traces() -> Vec<PathBuf> {
    common::pickles_in(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/conformance/pools"))
}

#[test]
fn every_pool_trace_matches_pytorch() {
    let traces = traces();
    assert_eq!(traces.len(), 8, "testdata/conformance/pools holds the eight captured pool traces");
    for path in traces {
        common::assert_matches_pytorch(&path);
    }
}

/// Without the pool calls the same trace does not match: the calls are what routes requests
/// (the trace's entries do not name pools), and the check sees the difference.
#[test]
fn without_the_pool_calls_a_pool_trace_does_not_match() {
    let path = traces().into_iter().find(|p| p.ends_with("pool_basic.pickle")).unwrap();
    let (snapshot, expected) = common::load(&path);
    let mut options = ReplayOptions::for_snapshot(&snapshot, Some(&expected)).unwrap();
    let calls = options.calls.as_mut().unwrap();
    let before = calls.len();
    calls.retain(|c| !matches!(c.call, CallKind::Pool(_)));
    assert!(calls.len() < before, "pool_basic makes pool calls");
    let outcome = replay(&snapshot, &options, |_, _| {}).unwrap();
    assert!(verify_against_recording(&snapshot, &outcome, Some(&expected)).is_err());
}
