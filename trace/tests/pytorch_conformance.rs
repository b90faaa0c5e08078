//! Conformance with PyTorch 2.11: every reference trace in `shared/traces` replays to exactly
//! what PyTorch recorded (segment events in order, final segments and blocks, all 122
//! memory_stats keys, the memory_summary text, and the OOM messages), and a replay under a wrong
//! configuration is caught.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::path::PathBuf;

use cachalot_core::AllocatorConfig;
use cachalot_trace::replay::{ReplayOptions, replay, verify_against_recording};

mod common;
use common::{load, reference_traces as traces, vendored};

#[test]
fn every_reference_trace_matches_pytorch() {
    for path in traces() {
        let (snapshot, expected) = load(&path);
        let options = ReplayOptions::for_snapshot(&snapshot, Some(&expected)).unwrap();
        let outcome = replay(&snapshot, &options, |_, _| {}).unwrap();
        outcome.allocator.check_consistency().unwrap();
        if let Err(difference) = verify_against_recording(&snapshot, &outcome, Some(&expected)) {
            panic!("{}: {difference}", path.display());
        }
        assert!(!expected.memory_stats.is_empty(), "{}: the stats were compared", path.display());
    }
}

#[test]
fn a_wrong_configuration_is_caught() {
    for (name, wrong) in [
        ("random_stress_maxsplit", ""),
        ("gpt_train_expandable", "expandable_segments:True,large_segment_size_mb:40"),
        ("convnet_train_gc", "garbage_collection_threshold:0.9"),
        ("gpt_train", "roundup_power2_divisions:4"),
    ] {
        let path = traces().into_iter().find(|p| p.to_string_lossy().contains(&format!("{name}.pickle"))).unwrap();
        let (snapshot, expected) = load(&path);
        let mut options = ReplayOptions::for_snapshot(&snapshot, Some(&expected)).unwrap();
        options.config = AllocatorConfig::parse(wrong).unwrap();
        let outcome = replay(&snapshot, &options, |_, _| {}).unwrap();
        assert!(
            verify_against_recording(&snapshot, &outcome, Some(&expected)).is_err(),
            "{name} under {wrong:?} must not match"
        );
    }
}

/// The copy in `testdata/` is byte for byte the project's ground truth wherever that is checked
/// out beside the repository.
#[test]
fn vendored_traces_equal_the_shared_ground_truth() {
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/pytorch-2.11-h200");
    if !shared.exists() {
        eprintln!("no ../shared/traces beside the repository: nothing to compare the vendored copy with");
        return;
    }
    let mut compared = 0;
    for entry in std::fs::read_dir(&shared).unwrap() {
        let path = entry.unwrap().path();
        let copy = vendored().join(path.file_name().unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(&copy).unwrap(), "{}", copy.display());
        compared += 1;
    }
    assert_eq!(compared, 18, "nine pickles and nine expected.json files");
}

/// The shipped standard workloads are what `shared/bench/workloads.sh` writes (it needs python3
/// and the shared folder beside the repository; without them there is nothing to compare with).
#[test]
fn vendored_bench_ops_equal_the_shared_workloads() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = root.join("../shared/bench/workloads.sh");
    let python = std::process::Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success());
    if !script.exists() || !python {
        eprintln!("no ../shared/bench/workloads.sh or no python3: nothing to compare the shipped op files with");
        return;
    }
    let fresh = std::env::temp_dir().join(format!("cachalot-bench-ops-{}", std::process::id()));
    let status = std::process::Command::new("bash").arg(&script).arg(&fresh).status().unwrap();
    assert!(status.success(), "{} failed", script.display());
    let shipped = root.join("testdata/bench-ops");
    let names = |dir: &PathBuf| {
        let mut names: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        names
    };
    assert_eq!(names(&fresh), names(&shipped));
    for name in names(&fresh) {
        let (a, b) = (std::fs::read(fresh.join(&name)).unwrap(), std::fs::read(shipped.join(&name)).unwrap());
        assert!(a == b, "testdata/bench-ops/{} differs from what workloads.sh writes", name.to_string_lossy());
    }
    std::fs::remove_dir_all(&fresh).ok();
}
