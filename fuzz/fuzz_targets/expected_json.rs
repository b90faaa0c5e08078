//! A recorded run's `NAME.expected.json`: parsed, and turned into replay options (its settings
//! string, memory fraction and device size), which set up an allocator.
#![no_main]

use cachalot_core::{CachingAllocator, SimBackend};
use cachalot_trace::replay::{ExpectedRun, ReplayOptions};
use cachalot_trace::snapshot::torch::TorchSnapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(expected) = ExpectedRun::from_json(bytes) else { return };
    let Ok(options) = ReplayOptions::for_snapshot(&TorchSnapshot::default(), Some(&expected)) else { return };
    let Ok(mut allocator) = CachingAllocator::new(SimBackend::new(options.device_total), options.config) else {
        return;
    };
    if let Some(fraction) = options.memory_fraction {
        allocator.set_memory_fraction(fraction).expect("a checked fraction is accepted");
    }
});
