//! The cachalot snapshot (JSON) reader, then what the viewer and `compare` derive from a
//! snapshot: its context table, its PyTorch form and a replay of its trace.
#![no_main]

use cachalot_trace::Snapshot;
use cachalot_trace::replay::{ReplayOptions, replay};
use cachalot_trace::snapshot::torch;
use libfuzzer_sys::fuzz_target;

const MAX_REPLAYED: usize = 20_000;

fuzz_target!(|bytes: &[u8]| {
    let Ok(snapshot) = Snapshot::from_json(bytes) else { return };
    let _ = snapshot.context_table();
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
