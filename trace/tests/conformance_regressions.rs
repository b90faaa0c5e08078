//! Regression traces of the differential campaign (`scripts/conformance/`, `CONFORMANCE.md`):
//! small PyTorch 2.11 traces, captured on an H100, whose replay once differed from what PyTorch
//! did. Each must now replay to exactly what PyTorch recorded. Beside them, two of seed 4
//! (captured on an H200) that set the memory fraction as a key, `per_process_memory_fraction`,
//! and run out of memory under it (`c4_00054`; `c4_00319` with expandable segments): that
//! setting's first traces, which matched at once.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::path::PathBuf;

use cachalot_trace::replay::{ExpectedRun, ReplayOptions, replay, verify_against_recording};
use cachalot_trace::snapshot::torch::TorchSnapshot;

mod common;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/conformance")
}

fn load(name: &str) -> (TorchSnapshot, ExpectedRun) {
    common::load(&dir().join(format!("{name}.pickle")))
}

fn names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|n| n.strip_suffix(".pickle").map(str::to_owned))
        .collect();
    names.sort();
    names
}

#[test]
fn every_regression_trace_matches_pytorch() {
    let names = names();
    assert!(!names.is_empty(), "testdata/conformance holds the campaign's regression traces");
    for name in names {
        let (snapshot, expected) = load(&name);
        let options = ReplayOptions::for_snapshot(&snapshot, Some(&expected)).unwrap();
        let outcome = replay(&snapshot, &options, |_, _| {}).unwrap();
        outcome.allocator.check_consistency().unwrap();
        if let Err(difference) = verify_against_recording(&snapshot, &outcome, Some(&expected)) {
            panic!("{name}: {difference}");
        }
    }
}

/// `c1_00013` calls `empty_cache` where nothing is cached and resets the peak stats mid-run:
/// neither leaves an entry of its own in the trace, so only the `calls` list of its
/// expected.json tells the replay where they were; without it the stats differ.
#[test]
fn calls_the_trace_does_not_show_are_replayed_from_the_capture_list() {
    let (snapshot, expected) = load("c1_00013");
    let calls = expected.calls.clone().unwrap();
    assert!(calls.len() > 2, "the trace's program made calls");
    let mut options = ReplayOptions::for_snapshot(&snapshot, Some(&expected)).unwrap();
    assert_eq!(options.calls.as_ref(), Some(&calls));
    options.calls = None;
    let outcome = replay(&snapshot, &options, |_, _| {}).unwrap();
    let difference = verify_against_recording(&snapshot, &outcome, Some(&expected)).unwrap_err();
    assert!(difference.message.starts_with("memory_stats["), "{difference}");
}

#[test]
fn a_calls_list_naming_an_unknown_call_is_an_error_naming_it() {
    let error = ExpectedRun::from_json(
        br#"{"calls": [{"call": "empty_cache", "trace_len": 3}, {"call": "gc", "trace_len": 5}]}"#,
    )
    .unwrap_err();
    assert!(error.starts_with("calls[1].call: 'gc' is not one of"), "{error}");
    let error = ExpectedRun::from_json(br#"{"calls": [{"call": "empty_cache"}]}"#).unwrap_err();
    assert!(error.starts_with("calls[0].trace_len"), "{error}");
}
