//! The measured examples of `docs/allocator-rules.md`, replayed on the simulator. The numbers
//! were measured on an NVIDIA H200 with PyTorch 2.11.0+cu130, each experiment in a fresh process.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use cachalot_core::{
    AllocatorConfig, AllocatorError, BlockState, CachingAllocator, SegmentSnapshot, SimBackend, StreamId, TraceAction,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// `total_memory` of the H200 the examples were measured on.
const H200: u64 = 150_109_880_320;
const S0: StreamId = StreamId::DEFAULT;

fn allocator(settings: &str) -> CachingAllocator<SimBackend> {
    let mut a = CachingAllocator::new(SimBackend::new(H200), AllocatorConfig::parse(settings).unwrap()).unwrap();
    a.record_history(true, usize::MAX, &[], false);
    a
}

fn checked<B: cachalot_core::Backend>(a: &CachingAllocator<B>) {
    a.check_consistency().unwrap();
}

fn blocks(segment: &SegmentSnapshot) -> Vec<(u64, BlockState)> {
    segment.blocks.iter().map(|b| (b.size, b.state)).collect()
}

/// `docs/allocator-rules.md` §21: 4 B; 43,008,000 B; 1 MiB + 1; 15 MiB; 25 MiB, all kept alive.
#[test]
fn worked_example_kept_alive() {
    let mut a = allocator("");
    let requests = [4, 43_008_000, MIB + 1, 15 * MIB, 25 * MIB];
    let allocated = [512, 44_040_704, 45_089_792, 60_818_432, 88_081_408];
    let reserved = [2 * MIB, 44 * MIB, 64 * MIB, 64 * MIB, 90 * MIB];
    let requested = [4, 43_008_004, 44_056_581, 59_785_221, 85_999_621];
    let inactive_bytes = [2_096_640, 2_096_640, 22_019_072, 6_290_432, 6_290_432];
    let inactive = [1, 1, 2, 2, 2];
    let block_sizes = [512, 44_040_192, 1_049_088, 15_728_640, 27_262_976];
    let mut live = Vec::new();
    for i in 0..5 {
        let x = a.malloc(requests[i], S0).unwrap();
        assert_eq!(x.size(), block_sizes[i], "block of request {i}");
        live.push(x);
        let s = a.stats();
        assert_eq!(a.memory_allocated(), allocated[i], "allocated after {i}");
        assert_eq!(a.memory_reserved(), reserved[i], "reserved after {i}");
        assert_eq!(s.requested_bytes.all().current, requested[i], "requested after {i}");
        assert_eq!(s.inactive_split_bytes.all().current, inactive_bytes[i], "inactive bytes after {i}");
        assert_eq!(s.inactive_split.all().current, inactive[i], "inactive after {i}");
        checked(&a);
    }
    assert_eq!(a.stats().num_device_alloc, 4);
    assert_eq!(a.stats().segment.all().current, 4);
    // Snapshot (in creation order here, since the simulator's addresses increase).
    let snap = a.snapshot();
    assert_eq!(snap.len(), 4);
    use BlockState::*;
    assert_eq!(blocks(&snap[0]), [(512, ActiveAllocated), (2_096_640, Inactive)]);
    assert_eq!(snap[0].blocks[0].requested_size, 4);
    assert_eq!(blocks(&snap[1]), [(44_040_192, ActiveAllocated)]);
    assert_eq!(snap[1].blocks[0].requested_size, 43_008_000);
    assert_eq!(blocks(&snap[2]), [(1_049_088, ActiveAllocated), (15_728_640, ActiveAllocated), (4_193_792, Inactive)]);
    assert_eq!(blocks(&snap[3]), [(27_262_976, ActiveAllocated)]);
    assert_eq!(snap[3].blocks[0].requested_size, 26_214_400);

    // Free everything but the 25 MiB tensor, then empty_cache: three segments go.
    for x in live.drain(..4) {
        a.free(x).unwrap();
    }
    a.empty_cache().unwrap();
    checked(&a);
    let s = a.stats();
    assert_eq!(s.num_device_free, 3);
    assert_eq!(s.num_sync_all_streams, 1);
    assert_eq!(a.memory_reserved(), 27_262_976);
    assert_eq!(a.memory_allocated(), 27_262_976);
}

/// `docs/allocator-rules.md` §16 (stats dump) and §17 (summary text): the §21 sequence, then the
/// 1 MiB + 1 tensor freed.
#[test]
fn stats_dump_and_summary_text() {
    let mut a = allocator("");
    let mut live = Vec::new();
    for size in [4, 43_008_000, MIB + 1, 15 * MIB, 25 * MIB] {
        live.push(a.malloc(size, S0).unwrap());
    }
    a.free(live[2]).unwrap();
    checked(&a);
    let flat = a.stats().to_flat();
    let expect = [
        ("allocated_bytes.all.current", 87_032_320),
        ("allocated_bytes.all.peak", 88_081_408),
        ("allocated_bytes.all.allocated", 88_081_408),
        ("allocated_bytes.all.freed", 1_049_088),
        ("inactive_split_bytes.all.current", 7_339_520),
        ("inactive_split_bytes.all.peak", 22_019_072),
        ("inactive_split_bytes.all.allocated", 23_068_160),
        ("inactive_split_bytes.all.freed", 15_728_640),
        ("inactive_split.all.current", 3),
        ("requested_bytes.all.current", 84_951_044),
        ("reserved_bytes.large_pool.current", 92_274_688),
        ("segment.all.current", 4),
        ("max_split_size", -1),
    ];
    for (key, value) in expect {
        assert_eq!(flat[key], value, "{key}");
    }
    assert_eq!(flat.len(), 122);
    let expected_summary = "\
|===========================================================================|
|                  PyTorch CUDA memory summary, device ID 0                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |  84992 KiB |  86017 KiB |  86017 KiB |   1024 KiB |
|       from large pool |  84992 KiB |  86016 KiB |  86016 KiB |   1024 KiB |
|       from small pool |      0 KiB |      0 KiB |      0 KiB |      0 KiB |
|---------------------------------------------------------------------------|
| Active memory         |  84992 KiB |  86017 KiB |  86017 KiB |   1024 KiB |
|       from large pool |  84992 KiB |  86016 KiB |  86016 KiB |   1024 KiB |
|       from small pool |      0 KiB |      0 KiB |      0 KiB |      0 KiB |
|---------------------------------------------------------------------------|
| Requested memory      |  82960 KiB |  83984 KiB |  83984 KiB |   1024 KiB |
|       from large pool |  82960 KiB |  83984 KiB |  83984 KiB |   1024 KiB |
|       from small pool |      0 KiB |      0 KiB |      0 KiB |      0 KiB |
|---------------------------------------------------------------------------|
| GPU reserved memory   |  92160 KiB |  92160 KiB |  92160 KiB |      0 B   |
|       from large pool |  90112 KiB |  90112 KiB |  90112 KiB |      0 B   |
|       from small pool |   2048 KiB |   2048 KiB |   2048 KiB |      0 B   |
|---------------------------------------------------------------------------|
| Non-releasable memory |   7167 KiB |  21503 KiB |  22527 KiB |  15360 KiB |
|       from large pool |   5120 KiB |  19455 KiB |  20480 KiB |  15360 KiB |
|       from small pool |   2047 KiB |   2047 KiB |   2047 KiB |      0 KiB |
|---------------------------------------------------------------------------|
| Allocations           |       4    |       5    |       5    |       1    |
|       from large pool |       3    |       4    |       4    |       1    |
|       from small pool |       1    |       1    |       1    |       0    |
|---------------------------------------------------------------------------|
| Active allocs         |       4    |       5    |       5    |       1    |
|       from large pool |       3    |       4    |       4    |       1    |
|       from small pool |       1    |       1    |       1    |       0    |
|---------------------------------------------------------------------------|
| GPU reserved segments |       4    |       4    |       4    |       0    |
|       from large pool |       3    |       3    |       3    |       0    |
|       from small pool |       1    |       1    |       1    |       0    |
|---------------------------------------------------------------------------|
| Non-releasable allocs |       3    |       3    |       3    |       0    |
|       from large pool |       2    |       2    |       2    |       0    |
|       from small pool |       1    |       1    |       1    |       0    |
|---------------------------------------------------------------------------|
| Oversize allocations  |       0    |       0    |       0    |       0    |
|---------------------------------------------------------------------------|
| Oversize GPU segments |       0    |       0    |       0    |       0    |
|===========================================================================|
";
    assert_eq!(a.memory_summary(false), expected_summary);
    let abbreviated = a.memory_summary(true);
    assert!(!abbreviated.contains("from large pool"));
    assert_eq!(abbreviated.lines().count(), 29);
    assert_eq!(expected_summary.lines().count(), 47);
}

/// `docs/allocator-rules.md` §21: each tensor freed before the next: everything reuses the 42 MiB block.
#[test]
fn worked_example_freed_in_between() {
    let mut a = allocator("");
    let tails = [None, None, Some(42_991_104), Some(28_311_552), Some(17_825_792)];
    for (i, size) in [4, 43_008_000, MIB + 1, 15 * MIB, 25 * MIB].into_iter().enumerate() {
        let x = a.malloc(size, S0).unwrap();
        if let Some(tail) = tails[i] {
            let large = a.snapshot().into_iter().find(|s| s.total_size == 44_040_192).unwrap();
            assert_eq!(large.blocks[1].size, tail, "tail after request {i}");
        }
        a.free(x).unwrap();
        checked(&a);
    }
    assert_eq!(a.memory_reserved(), 46_137_344);
}

/// `docs/allocator-rules.md` §21: the kept-alive sequence with `expandable_segments:True`.
#[test]
fn worked_example_expandable_segments() {
    let mut a = allocator("expandable_segments:True");
    let table = [
        (4, 512, 2 * MIB),
        (43_008_000, 43_008_512, 62 * MIB),
        (MIB + 1, 44_057_600, 62 * MIB),
        (15 * MIB, 59_786_240, 62 * MIB),
        (25 * MIB, 86_000_640, 102 * MIB),
    ];
    let mut live = Vec::new();
    for (size, allocated, reserved) in table {
        live.push(a.malloc(size, S0).unwrap());
        assert_eq!(a.memory_allocated(), allocated, "allocated after {size}");
        assert_eq!(a.memory_reserved(), reserved, "reserved after {size}");
        let s = a.stats();
        assert_eq!(s.segment.all().current, 0);
        assert_eq!(s.inactive_split.all().current, 0);
        assert_eq!(s.inactive_split_bytes.all().current, 0);
        checked(&a);
    }
    assert_eq!(a.stats().num_device_alloc, 3, "one map call per map_block");
    let large = a.snapshot().into_iter().find(|s| s.pool == cachalot_core::size::PoolKind::Large).unwrap();
    assert!(large.is_expandable);
    assert_eq!(large.total_size, 100 * MIB);
    assert_eq!(large.blocks.last().unwrap().size, 18_857_472);
    let large_start = large.address;

    for x in live.drain(..4) {
        a.free(x).unwrap();
    }
    a.empty_cache().unwrap();
    checked(&a);
    assert_eq!(a.memory_reserved(), 62_914_560);
    assert_eq!(a.stats().num_device_free, 2);
    let snap = a.snapshot();
    assert_eq!(snap.len(), 1, "the small segment is gone entirely");
    assert_eq!(snap[0].address, large_start + 40 * MIB, "the large segment now starts 40 MiB later");
    let unmaps: Vec<u64> = a.trace().iter().filter(|e| e.action == TraceAction::SegmentUnmap).map(|e| e.size).collect();
    assert_eq!(unmaps, [40 * MIB, 2 * MIB]);
}

/// `docs/allocator-rules.md` §14 and §21, companion: freeing each tensor before the next gives
/// 44 MiB without expandable segments (checked above) — and with `large_segment_size_mb:40` a
/// 25 MiB request maps one 40 MiB page.
#[test]
fn expandable_pages_follow_large_segment_size() {
    let mut a = allocator("expandable_segments:True,large_segment_size_mb:40");
    a.malloc(25 * MIB, S0).unwrap();
    assert_eq!(a.memory_reserved(), 40 * MIB);
    checked(&a);
}

/// `docs/allocator-rules.md` §22, the micro-cases.
#[test]
fn micro_cases() {
    // Two 1 MiB requests fill one 2 MiB small segment exactly.
    let mut a = allocator("");
    let x = a.malloc(MIB, S0).unwrap();
    let y = a.malloc(MIB, S0).unwrap();
    assert_eq!((x.size(), y.size()), (MIB, MIB));
    assert_eq!(a.memory_reserved(), 2 * MIB);
    assert_eq!(a.snapshot()[0].blocks.len(), 2);

    // 15 MiB -> 16 MiB segment, whole block; then 12 MiB reuses and splits it; then 3.5 MiB takes
    // the 4 MiB tail whole.
    let mut a = allocator("");
    let x = a.malloc(15 * MIB, S0).unwrap();
    assert_eq!(x.size(), 16 * MIB);
    a.free(x).unwrap();
    let y = a.malloc(12 * MIB, S0).unwrap();
    assert_eq!(y.size(), 12 * MIB);
    let snap = a.snapshot();
    assert_eq!(snap[0].blocks[1].size, 4_194_304);
    assert_eq!(snap[0].blocks[1].requested_size, 15_728_640, "the tail keeps the stale requested size");
    let z = a.malloc(3 * MIB + MIB / 2, S0).unwrap();
    assert_eq!(z.size(), 4 * MIB);
    assert_eq!(a.memory_reserved(), 16 * MIB);
    checked(&a);

    // 1 MiB + 1, 9 MiB, 9 MiB share one 20 MiB segment; the third takes the 10,485,248 B rest.
    let mut a = allocator("");
    a.malloc(MIB + 1, S0).unwrap();
    a.malloc(9 * MIB, S0).unwrap();
    let third = a.malloc(9 * MIB, S0).unwrap();
    assert_eq!(third.size(), 10_485_248);
    assert_eq!(a.memory_reserved(), 20 * MIB);

    // 10 MiB - 1 -> a 10 MiB segment.
    let mut a = allocator("");
    a.malloc(10 * MIB - 1, S0).unwrap();
    assert_eq!(a.memory_reserved(), 10 * MIB);

    // A block cached on a side stream is not used by the default stream.
    let mut a = allocator("");
    let side = StreamId(0x1234);
    let x = a.malloc(30 * MIB, side).unwrap();
    a.free(x).unwrap();
    a.malloc(30 * MIB, S0).unwrap();
    assert_eq!(a.memory_reserved(), 60 * MIB);
    assert_eq!(a.stats().segment.all().current, 2);

    // 300 MiB + 1 -> 302 MiB segment, split with a 2,096,640 B tail.
    let mut a = allocator("");
    let x = a.malloc(300 * MIB + 1, S0).unwrap();
    assert_eq!(x.size(), 314_573_312);
    assert_eq!(a.memory_reserved(), 302 * MIB);
    assert_eq!(a.snapshot()[0].blocks[1].size, 2_096_640);
    checked(&a);
}

/// `docs/allocator-rules.md` §12 with `max_split_size_mb:100`: the oversize and slack rules.
#[test]
fn oversize_blocks_and_rounding_slack() {
    let mut a = allocator("max_split_size_mb:100");
    let x = a.malloc(300 * MIB, S0).unwrap();
    a.free(x).unwrap();
    let before = a.stats().num_device_alloc;
    let y = a.malloc(250 * MIB, S0).unwrap();
    assert_eq!(a.stats().num_device_alloc, before + 1, "300 >= 250 + 20: a new segment");
    a.free(y).unwrap();
    let allocated_before = a.stats().allocated_bytes.all().allocated;
    let z = a.malloc(285 * MIB, S0).unwrap();
    assert_eq!(z.size(), 300 * MIB, "285 MiB reuses the 300 MiB block unsplit");
    assert_eq!(a.stats().allocated_bytes.all().allocated - allocated_before, 314_572_800);
    assert_eq!(a.stats().oversize_allocations.current, 1);
    let segments = a.stats().segment.all().current;
    a.malloc(50 * MIB, S0).unwrap();
    assert_eq!(a.stats().segment.all().current, segments + 1, "only oversize blocks free: new segment");
    assert_eq!(a.stats().oversize_segments.current, 2);
    checked(&a);
}

/// `docs/allocator-rules.md` §12: with a 1 GiB allowance and `max_split_size_mb:100`, a 500 MiB request frees the
/// cached 600 MiB block instead of retrying with everything.
#[test]
fn release_available_cached_blocks_frees_one_oversize_block() {
    let mut a = allocator("max_split_size_mb:100");
    a.set_memory_fraction(GIB as f64 / H200 as f64).unwrap();
    let x = a.malloc(600 * MIB, S0).unwrap();
    a.free(x).unwrap();
    a.malloc(500 * MIB, S0).unwrap();
    let s = a.stats();
    assert_eq!(s.num_device_free, 1);
    assert_eq!(s.num_alloc_retries, 0);
    assert_eq!(s.num_sync_all_streams, 0);
    assert_eq!(a.memory_reserved(), 500 * MIB);
    checked(&a);
}

/// `docs/allocator-rules.md` §11: the garbage collector frees the four segments older than the average age.
#[test]
fn garbage_collection_frees_old_segments() {
    let setup = |segments: usize| {
        let mut a = allocator("garbage_collection_threshold:0.5");
        a.set_memory_fraction((8 * GIB) as f64 / H200 as f64).unwrap();
        let live: Vec<_> = (0..segments).map(|_| a.malloc(GIB, S0).unwrap()).collect();
        for x in live {
            a.free(x).unwrap();
        }
        a
    };
    let mut a = setup(5);
    for _ in 0..3 {
        let x = a.malloc(64 * MIB, S0).unwrap();
        a.free(x).unwrap();
    }
    let frees = a.stats().num_device_free;
    a.malloc(GIB + GIB / 2, S0).unwrap();
    assert_eq!(a.stats().num_device_free - frees, 4, "the four untouched segments are collected");
    assert_eq!(a.memory_reserved(), GIB + GIB + GIB / 2);
    checked(&a);

    // Exactly at the threshold nothing is collected.
    let mut a = setup(4);
    a.malloc(GIB + GIB / 2, S0).unwrap();
    assert_eq!(a.stats().num_device_free, 0);
    checked(&a);
}

/// `docs/allocator-rules.md` §10: the two real out-of-memory messages and the counters of one OOM.
#[test]
fn out_of_memory_messages_and_counters() {
    let free = 149_527_838_720; // "139.26 GiB"
    let process = "Including non-PyTorch memory, this process has 544.00 MiB memory in use. ";
    let mut a = allocator("");
    a.backend_mut().set_free_memory_override(Some(free));
    a.backend_mut().set_process_memory_text(process);
    let keep = a.malloc(26 * MIB, S0).unwrap();
    let cached = a.malloc(MIB, S0).unwrap();
    a.free(cached).unwrap();
    let err = a.malloc(1024 * GIB, S0).unwrap_err();
    let AllocatorError::OutOfMemory(oom) = err else { panic!("expected OOM") };
    assert_eq!(
        oom.message,
        "CUDA out of memory. Tried to allocate 1024.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 139.26 GiB is free. Including non-PyTorch memory, this process has 544.00 MiB memory in use. Of the allocated memory 26.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
    );
    let s = a.stats();
    assert_eq!((s.num_ooms, s.num_alloc_retries, s.num_sync_all_streams), (1, 1, 1));
    assert_eq!(s.num_device_free, 1, "the cached small segment was released on the way");
    let oom_entry = a.trace().into_iter().find(|e| e.action == TraceAction::Oom).unwrap();
    assert_eq!((oom_entry.addr, oom_entry.size), (free, 1024 * GIB));
    checked(&a);
    a.free(keep).unwrap();

    // The fraction-limited form: refused before asking the device.
    let mut a = allocator("");
    a.backend_mut().set_free_memory_override(Some(free));
    a.backend_mut().set_process_memory_text(process);
    a.set_memory_fraction(0.01).unwrap();
    a.malloc(26 * MIB, S0).unwrap();
    let device_allocs = a.stats().num_device_alloc;
    let err = a.malloc(2 * GIB, S0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 139.26 GiB is free. Including non-PyTorch memory, this process has 544.00 MiB memory in use. 1.40 GiB allowed; Of the allocated memory 26.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
    );
    assert_eq!(a.stats().num_device_alloc, device_allocs);
    assert_eq!((a.stats().num_alloc_retries, a.stats().num_sync_all_streams), (1, 1));
    checked(&a);

    // More than 1 EB fails at once and changes nothing.
    let err = a.malloc(1 << 60, S0).unwrap_err();
    assert_eq!(err.to_string(), "CUDA out of memory. Tried to allocate more than 1EB memory.");
    assert_eq!(a.stats().num_ooms, 1);
}

/// `docs/allocator-rules.md` §8: a block used on another stream stays active until that stream's work is done; the
/// free completes in the next malloc's `process_events`, before the new allocation.
#[test]
fn record_stream_delays_the_free() {
    let mut a = allocator("");
    let side = StreamId(0xbeef);
    a.backend_mut().hold_stream(side);
    let x = a.malloc(30 * MIB, S0).unwrap();
    a.record_stream(&x, side).unwrap();
    a.free(x).unwrap();
    let s = a.stats();
    assert_eq!(a.memory_allocated(), 0);
    assert_eq!(s.active_bytes.all().current, 30 * MIB as i64);
    assert_eq!(s.requested_bytes.all().current, 30 * MIB as i64);
    assert_eq!(a.snapshot()[0].blocks[0].state, BlockState::ActivePendingFree);
    checked(&a);

    // While the side stream runs, an equal request cannot reuse the block.
    let y = a.malloc(30 * MIB, S0).unwrap();
    assert_ne!(y.address(), x.address());
    assert_eq!(a.stats().segment.all().current, 2);
    a.free(y).unwrap();

    // Once it is done, the next malloc completes the free first, then allocates.
    a.backend_mut().finish_stream(side);
    let z = a.malloc(1000, S0).unwrap();
    let tail: Vec<TraceAction> = a.trace().iter().rev().take(3).rev().map(|e| e.action).collect();
    assert_eq!(tail, [TraceAction::FreeCompleted, TraceAction::SegmentAlloc, TraceAction::Alloc]);
    assert_eq!(a.stats().active_bytes.all().current, z.size() as i64);
    checked(&a);

    // empty_cache waits for everything still pending.
    a.backend_mut().hold_stream(side);
    let w = a.malloc(8 * MIB, S0).unwrap();
    a.record_stream(&w, side).unwrap();
    a.free(w).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().active.all().current, 1);
    checked(&a);
}

#[test]
fn handles_are_checked() {
    let mut a = allocator("");
    let mut b = allocator("");
    let x = a.malloc(1000, S0).unwrap();
    assert!(matches!(b.free(x), Err(AllocatorError::InvalidHandle(cachalot_core::HandleError::Foreign { .. }))));
    a.free(x).unwrap();
    assert!(matches!(a.free(x), Err(AllocatorError::InvalidHandle(cachalot_core::HandleError::DoubleFree { .. }))));
    // The freed block was carved again: the old handle is refused, the new one works.
    let y = a.malloc(1000, S0).unwrap();
    assert_eq!(y.address(), x.address());
    assert!(matches!(a.free(x), Err(AllocatorError::InvalidHandle(_))));
    assert!(matches!(a.record_stream(&x, StreamId(5)), Err(AllocatorError::InvalidHandle(_))));
    a.free(y).unwrap();
    // The same block object handed out again: the old handle is stale.
    let big = a.malloc(20 * MIB, S0).unwrap();
    a.free(big).unwrap();
    let again = a.malloc(20 * MIB, S0).unwrap();
    assert_eq!(again.address(), big.address());
    assert!(matches!(a.free(big), Err(AllocatorError::InvalidHandle(cachalot_core::HandleError::Stale { .. }))));
    a.free(again).unwrap();
    checked(&a);
    // Zero-byte requests touch nothing.
    let empty = a.malloc(0, S0).unwrap();
    assert!(empty.is_empty());
    a.free(empty).unwrap();
    assert_eq!(a.stats().allocation.all().allocated, 4);
}

#[test]
fn peak_and_accumulated_resets() {
    let mut a = allocator("");
    let x = a.malloc(8 * MIB, S0).unwrap();
    a.free(x).unwrap();
    a.reset_peak_stats();
    assert_eq!(a.stats().allocated_bytes.all().peak, 0);
    assert_eq!(a.stats().reserved_bytes.all().peak, 20 * MIB as i64);
    a.reset_accumulated_stats();
    let s = a.stats();
    assert_eq!((s.allocated_bytes.all().allocated, s.num_device_alloc), (0, 0));
    assert_eq!(s.max_split_size, -1);
}

#[test]
fn unsupported_configurations_are_refused() {
    let err = CachingAllocator::new(SimBackend::new(GIB), AllocatorConfig::parse("backend:cudaMallocAsync").unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("cudaMallocAsync"));
}
