//! `memory_summary()` of the nine real PyTorch 2.11 runs in `shared/traces`, rebuilt from their
//! recorded `memory_stats()`: the formatter must reproduce PyTorch's text byte for byte.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::collections::BTreeMap;
use std::path::PathBuf;

use cachalot_core::MemoryStats;

fn traces_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/traces/pytorch-2.11-h200")
}

#[test]
fn summaries_match_pytorch_for_every_reference_run() {
    let dir = traces_dir();
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().ends_with(".expected.json") {
            continue;
        }
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let flat: BTreeMap<String, i64> = serde_json::from_value(json["memory_stats"].clone()).unwrap();
        let stats = MemoryStats::from_flat(&flat).unwrap();
        assert_eq!(stats.to_flat(), flat, "{}: stats keys round trip", path.display());
        let expected = json["memory_summary"].as_str().unwrap();
        assert_eq!(cachalot_core::summary::memory_summary(&stats, 0, false), expected, "{}", path.display());
        checked += 1;
    }
    assert_eq!(checked, 9, "all nine reference runs");
}
