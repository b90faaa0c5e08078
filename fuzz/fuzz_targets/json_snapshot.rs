//! The cachalot snapshot (JSON) reader, then what the viewer and `compare` derive from a
//! snapshot: its context table, the viewer's model (the state rebuilt entry by entry from the
//! trace, from the state before it where its start was lost, as `Run::build` in
//! `viewer/src/model` does through `cachalot_trace::rebuild`), its PyTorch form and a replay of
//! its trace.
#![no_main]

use cachalot_core::AllocatorConfig;
use cachalot_trace::Snapshot;
use cachalot_trace::rebuild::{PoolState, Rules};
use cachalot_trace::replay::{ReplayOptions, replay};
use cachalot_trace::snapshot::torch;
use libfuzzer_sys::fuzz_target;

const MAX_REPLAYED: usize = 20_000;

fuzz_target!(|bytes: &[u8]| {
    let Ok(snapshot) = Snapshot::from_json(bytes) else { return };
    let _ = snapshot.context_table();
    if snapshot.trace.len() <= MAX_REPLAYED {
        view_model(&snapshot);
    }
    let Ok(torch) = torch::from_snapshot(&snapshot) else { return };
    if snapshot.trace.len() > MAX_REPLAYED {
        return;
    }
    let Ok(mut options) = ReplayOptions::for_snapshot(&torch, None) else { return };
    options.device_total = snapshot.device.total_memory;
    if let Ok(outcome) = replay(&torch, &options, |_, _| {}) {
        outcome.allocator.check_consistency().expect("the replayed allocator is consistent");
    }
});

/// The viewer's model of `snapshot` (`viewer/src/load.rs` `snapshot_run`, then `Run::build`):
/// the rules of its settings (defaults where they do not parse), the state before the trace
/// where the file says its start was lost, every entry applied (an anomaly is shown, not fatal),
/// and the look-ups the panels make at each entry's address.
fn view_model(snapshot: &Snapshot) {
    let rules = AllocatorConfig::parse(&snapshot.settings).map(|c| Rules::from_config(&c)).unwrap_or_default();
    let trace = &snapshot.trace;
    let state = match snapshot.trace_complete {
        true => PoolState::empty(&rules),
        false => PoolState::before(trace, &snapshot.segments, &rules),
    };
    let anomalies = apply_all(state, snapshot, &rules);
    // A file that says its trace is complete but frees memory it never allocated is built
    // again from the state before the trace, as the viewer does.
    if snapshot.trace_complete && anomalies > 0 {
        apply_all(PoolState::before(trace, &snapshot.segments, &rules), snapshot, &rules);
    }
}

/// Applies every entry of the trace to `state`; returns how many were anomalies.
fn apply_all(mut state: PoolState, snapshot: &Snapshot, rules: &Rules) -> usize {
    let trace = &snapshot.trace;
    let mut anomalies = 0;
    for i in 0..trace.len() {
        anomalies += usize::from(state.apply_entry(trace, i, rules).is_err());
        let _ = state.segment_at(trace[i].addr);
        let _ = state.block_at(trace[i].addr);
    }
    let _ = state.has_whole_free_segment();
    anomalies
}
