//! Op files: parsed, then replayed on the simulator as `cachalot stats FILE.ops` does.
#![no_main]

use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend};
use cachalot_trace::ops::OpFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else { return };
    let Ok(ops) = OpFile::parse(text) else { return };
    // The handles a replay needs are bounded by the ops, whatever ids the file names.
    assert!(ops.handles <= ops.ops.len());
    let mut allocator =
        CachingAllocator::new(SimBackend::new(80 << 30), AllocatorConfig::default()).expect("simulator");
    let mut handles = vec![None; ops.handles];
    let _ = ops.replay(&mut allocator, &mut handles, false);
    allocator.check_consistency().expect("consistent after the replay, whatever it met");
    OpFile::free_live(&mut allocator, &mut handles).expect("live handles free");
    allocator.check_consistency().expect("consistent after freeing");
});
