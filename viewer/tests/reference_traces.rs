//! The viewer's rebuilt state against what PyTorch 2.11 really did: for every reference trace,
//! the end state rebuilt from the trace must equal the pickle's `segments` block for block, and
//! the rebuilt `memory_stats()` must equal the recorded ones in `NAME.expected.json`.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers outside #[test] functions")]

use std::collections::BTreeMap;
use std::path::PathBuf;

use cachalot_viewer::load::{Progress, load_bytes};
use cachalot_viewer::model::Verification;

fn traces() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/traces/pytorch-2.11-h200")
}

fn expected_stats(name: &str) -> BTreeMap<String, i64> {
    let path = traces().join(format!("{name}.expected.json"));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    json["memory_stats"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_i64().unwrap())).collect()
}

#[test]
fn every_reference_trace_rebuilds_pytorchs_end_state_and_stats() {
    let dir = traces();
    if !dir.is_dir() {
        eprintln!("skipped: {} not found", dir.display());
        return;
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".pickle").map(str::to_owned))
        .collect();
    names.sort();
    assert!(names.len() >= 9, "{names:?}");
    let mut failures = Vec::new();
    for name in &names {
        let bytes = std::fs::read(dir.join(format!("{name}.pickle"))).unwrap();
        let runs = load_bytes(name, &bytes, &Progress::default()).unwrap();
        let run = &runs[0];
        if !matches!(run.verification, Verification::Matches { .. }) {
            failures.push(format!("{name}: {:?}", run.verification));
        }
        if run.anomaly_count > 0 {
            failures.push(format!("{name}: {} anomalies, first {:?}", run.anomaly_count, run.anomalies.first()));
        }
        let ours = run.head().stats.to_flat();
        for (key, value) in expected_stats(name) {
            let got = ours.get(&key).copied();
            if got != Some(value) && key != "num_oom_rejections" {
                failures.push(format!("{name}: {key} = {got:?}, PyTorch {value}"));
            }
        }
        println!(
            "{name}: {} entries, {:?}, markers: {} empty_cache, {} retries, {} ooms, {} gc",
            run.trace.len(),
            run.verification,
            run.markers.empty_cache.len(),
            run.markers.retries.len(),
            run.markers.ooms.len(),
            run.markers.collections.len()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
