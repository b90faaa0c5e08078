//! The PyTorch snapshot pickle reader, then a replay of what it read: no input may panic,
//! hang or exhaust memory, in the reader or in the replay of its trace.
#![no_main]

use cachalot_trace::replay::{ReplayOptions, replay, verify_against_recording};
use cachalot_trace::snapshot::pickle;
use libfuzzer_sys::fuzz_target;

/// Traces longer than this are read but not replayed, to keep each run short.
const MAX_REPLAYED: usize = 20_000;

fuzz_target!(|bytes: &[u8]| {
    let Ok(snapshot) = pickle::read_snapshot(bytes) else { return };
    if snapshot.device_traces.iter().map(Vec::len).sum::<usize>() > MAX_REPLAYED {
        return;
    }
    let Ok(options) = ReplayOptions::for_snapshot(&snapshot, None) else { return };
    if let Ok(outcome) = replay(&snapshot, &options, |_, _| {}) {
        outcome.allocator.check_consistency().expect("the replayed allocator is consistent");
        let _ = verify_against_recording(&snapshot, &outcome, None);
    }
});
