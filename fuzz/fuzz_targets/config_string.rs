//! `PYTORCH_CUDA_ALLOC_CONF` strings: parsed, and an allocator built and used with every
//! configuration that parses.
#![no_main]

use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else { return };
    let Ok(config) = AllocatorConfig::parse(text) else { return };
    let Ok(mut allocator) = CachingAllocator::new(SimBackend::new(80 << 30), config) else { return };
    let mut live = Vec::new();
    for size in [1, 512, 1 << 20, 3 << 20, 11 << 20, 100 << 20, 1 << 30] {
        if let Ok(allocation) = allocator.malloc(size, StreamId::DEFAULT) {
            live.push(allocation);
        }
    }
    for allocation in live {
        allocator.free(allocation).expect("free");
    }
    allocator.empty_cache().expect("empty_cache");
    allocator.check_consistency().expect("consistent");
});
