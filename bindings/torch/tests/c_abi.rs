//! The C ABI PyTorch calls, against simulated devices: the exported functions themselves, with
//! raw stream handles as PyTorch passes them (arbitrary pointer values: a fake stream map),
//! from many threads at once. Each test uses a device ordinal of its own, since the registry
//! behind the ABI is one per process.

use std::collections::BTreeMap;
use std::ffi::{CStr, c_int, c_void};
use std::sync::{Mutex, Once};

use cachalot_core::{Segments, StreamId};
use cachalot_torch::abi::{
    ERROR_NONE, ERROR_OTHER, ERROR_OUT_OF_MEMORY, cachalot_torch_alloc, cachalot_torch_configure,
    cachalot_torch_empty_cache, cachalot_torch_free, cachalot_torch_last_error, cachalot_torch_record_stream,
    cachalot_torch_set_memory_fraction, registry,
};
use cachalot_torch::abi::{
    cachalot_torch_begin_allocate_to_pool, cachalot_torch_cache_info, cachalot_torch_create_pool,
    cachalot_torch_empty_pool_cache, cachalot_torch_end_allocate_to_pool, cachalot_torch_pool_live_allocations_are,
    cachalot_torch_pool_use_count, cachalot_torch_release_pool,
};
use cachalot_torch::abi::{
    cachalot_torch_checkpoint_drop, cachalot_torch_pool_checkpoint, cachalot_torch_pool_restore,
};
use cachalot_torch::backend::DeviceBackend;
use std::sync::atomic::{AtomicUsize, Ordering};

const CAPACITY: u64 = 1 << 30;
const MIB: usize = 1 << 20;

/// `cudaStream_t` values as PyTorch would pass them: the legacy default stream and two others.
const DEFAULT: *mut c_void = std::ptr::null_mut();
const SIDE: *mut c_void = 0x7f3a_0000_1000usize as *mut c_void;
const OTHER: *mut c_void = 0x7f3a_0000_2000usize as *mut c_void;

fn simulated_devices() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: null settings mean the defaults.
        let status = unsafe { cachalot_torch_configure(std::ptr::null(), CAPACITY) };
        assert_eq!(status, 0);
    });
}

fn last_error() -> (c_int, String) {
    let mut kind = -1;
    // SAFETY: a writable int; the message is copied before the next call.
    let message = unsafe { CStr::from_ptr(cachalot_torch_last_error(&mut kind)) };
    (kind, message.to_string_lossy().into_owned())
}

fn stats(device: usize) -> (u64, u64) {
    registry()
        .with_device(device, |d| (d.allocator.memory_allocated(), d.allocator.memory_reserved()))
        .expect("device made")
}

fn consistent(device: usize) {
    let check = registry().with_device(device, |d| d.allocator.check_consistency()).expect("device made");
    assert_eq!(check, Ok(()));
}

fn with_simulator(device: usize, f: impl FnOnce(&mut cachalot_core::SimBackend)) {
    registry()
        .with_device(device, |d| match d.allocator.backend_mut() {
            DeviceBackend::Sim(sim) => f(sim),
            DeviceBackend::Cuda(_) => panic!("the tests configure simulated devices"),
        })
        .expect("device made");
}

#[test]
fn a_freed_pointer_is_cached_and_handed_out_again() {
    simulated_devices();
    let device = 1;
    let x = cachalot_torch_alloc(4 * MIB, device, DEFAULT);
    assert!(!x.is_null(), "{:?}", last_error());
    // PyTorch's rules: 4 MiB is a large block, from a 20 MiB segment.
    assert_eq!(stats(1), (4 << 20, 20 << 20));
    cachalot_torch_free(x, 4 * MIB, device, DEFAULT);
    assert_eq!(stats(1), (0, 20 << 20));
    let y = cachalot_torch_alloc(4 * MIB, device, DEFAULT);
    assert_eq!(y, x, "the cached block is reused");
    cachalot_torch_free(y, 4 * MIB, device, DEFAULT);
    cachalot_torch_empty_cache();
    assert_eq!(stats(1), (0, 0));
    consistent(1);
}

#[test]
fn zero_bytes_are_the_null_pointer_without_an_error() {
    simulated_devices();
    let _ = last_error();
    assert!(cachalot_torch_alloc(0, 2, DEFAULT).is_null());
    assert_eq!(last_error().0, ERROR_NONE);
    cachalot_torch_free(std::ptr::null_mut(), 0, 2, DEFAULT);
    assert_eq!(last_error().0, ERROR_NONE);
}

#[test]
fn out_of_memory_is_null_with_pytorchs_message_and_the_allocator_stays_usable() {
    simulated_devices();
    let device = 3;
    let held = cachalot_torch_alloc(600 * MIB, device, DEFAULT);
    assert!(!held.is_null());
    let refused = cachalot_torch_alloc(600 * MIB, device, DEFAULT);
    assert!(refused.is_null());
    let (kind, message) = last_error();
    assert_eq!(kind, ERROR_OUT_OF_MEMORY);
    assert!(
        message
            .starts_with("CUDA out of memory. Tried to allocate 600.00 MiB. GPU 0 has a total capacity of 1024.00 MiB"),
        "{message}"
    );
    assert_eq!(last_error().0, ERROR_NONE, "reading the error clears it");
    consistent(3);
    cachalot_torch_free(held, 600 * MIB, device, DEFAULT);
    let again = cachalot_torch_alloc(600 * MIB, device, DEFAULT);
    assert!(!again.is_null(), "memory freed after an OOM is usable: {:?}", last_error());
    cachalot_torch_free(again, 600 * MIB, device, DEFAULT);
    consistent(3);
}

#[test]
fn a_block_used_on_a_side_stream_is_not_reused_before_that_stream_is_done() {
    simulated_devices();
    let device = 4;
    let x = cachalot_torch_alloc(12 * MIB, device, DEFAULT);
    cachalot_torch_record_stream(x, SIDE);
    assert_eq!(last_error().0, ERROR_NONE);
    // The side stream's kernel reading x is still running.
    with_simulator(4, |sim| sim.hold_stream(StreamId(SIDE as u64)));
    cachalot_torch_free(x, 12 * MIB, device, DEFAULT);
    let y = cachalot_torch_alloc(12 * MIB, device, DEFAULT);
    assert!(!y.is_null());
    assert_ne!(y, x, "x's block waits for the side stream");
    assert_eq!(
        stats(4).1,
        24 << 20,
        "so a second segment was needed (above 10 MiB, a segment of the block's own size)"
    );
    // The side stream finishes: the block comes back at the next allocation.
    with_simulator(4, |sim| sim.finish_stream(StreamId(SIDE as u64)));
    let z = cachalot_torch_alloc(12 * MIB, device, DEFAULT);
    assert_eq!(z, x);
    for p in [y, z] {
        cachalot_torch_free(p, 12 * MIB, device, DEFAULT);
    }
    consistent(4);
}

#[test]
fn without_record_stream_the_block_is_reused_at_once() {
    // The control of the test above: what the hook prevents.
    simulated_devices();
    let device = 5;
    let x = cachalot_torch_alloc(8 * MIB, device, DEFAULT);
    with_simulator(5, |sim| sim.hold_stream(StreamId(SIDE as u64)));
    cachalot_torch_free(x, 8 * MIB, device, DEFAULT);
    let y = cachalot_torch_alloc(8 * MIB, device, DEFAULT);
    assert_eq!(y, x);
    cachalot_torch_free(y, 8 * MIB, device, DEFAULT);
    with_simulator(5, |sim| sim.finish_stream(StreamId(SIDE as u64)));
}

#[test]
fn blocks_of_one_stream_are_not_given_to_another() {
    simulated_devices();
    let device = 6;
    let x = cachalot_torch_alloc(MIB, device, SIDE);
    cachalot_torch_free(x, MIB, device, SIDE);
    let y = cachalot_torch_alloc(MIB, device, OTHER);
    assert_ne!(y, x, "PyTorch keys cached blocks by stream");
    let z = cachalot_torch_alloc(MIB, device, SIDE);
    assert_eq!(z, x);
    cachalot_torch_free(y, MIB, device, OTHER);
    cachalot_torch_free(z, MIB, device, SIDE);
    let segments = registry().with_device(6, |d| d.allocator.snapshot()).expect("device made");
    let streams: Vec<u64> = segments.iter().map(|s| s.stream.0).collect();
    assert_eq!(streams.len(), 2);
    assert!(streams.contains(&(SIDE as u64)) && streams.contains(&(OTHER as u64)), "{streams:x?}");
}

#[test]
fn bad_pointers_and_devices_are_errors_naming_them() {
    simulated_devices();
    cachalot_torch_free(0xdead_0000usize as *mut c_void, 512, 7, DEFAULT);
    let (kind, message) = last_error();
    assert_eq!(kind, ERROR_OTHER);
    assert!(message.contains("0xdead0000") && message.contains("did not hand out"), "{message}");
    assert!(cachalot_torch_alloc(512, -1, DEFAULT).is_null());
    let (kind, message) = last_error();
    assert_eq!(kind, ERROR_OTHER);
    assert!(message.contains("device -1"), "{message}");
    assert!(cachalot_torch_alloc(512, 64, DEFAULT).is_null());
    assert!(last_error().1.contains("device 64"));
    cachalot_torch_record_stream(0xbeef_0000usize as *mut c_void, SIDE);
    let (kind, message) = last_error();
    assert_eq!(kind, ERROR_OTHER);
    assert!(message.contains("0xbeef0000"), "{message}");
}

#[test]
fn a_configuration_that_does_not_parse_is_refused_and_changes_nothing() {
    simulated_devices();
    let before = registry().settings();
    // SAFETY: a NUL-terminated string.
    let status = unsafe { cachalot_torch_configure(c"expandable_segments:Maybe".as_ptr(), CAPACITY) };
    assert_eq!(status, 1);
    let (kind, message) = last_error();
    assert_eq!(kind, ERROR_OTHER);
    assert!(message.contains("expandable_segments"), "{message}");
    assert_eq!(registry().settings().config, before.config);
}

#[test]
fn a_memory_fraction_caps_reserved_memory() {
    simulated_devices();
    let device = 8;
    cachalot_torch_set_memory_fraction(0.25, device);
    assert_eq!(last_error().0, ERROR_NONE);
    assert!(cachalot_torch_alloc(300 * MIB, device, DEFAULT).is_null());
    let (kind, message) = last_error();
    assert_eq!(kind, ERROR_OUT_OF_MEMORY);
    assert!(message.contains("256.00 MiB allowed"), "{message}");
    let fits = cachalot_torch_alloc(200 * MIB, device, DEFAULT);
    assert!(!fits.is_null());
    cachalot_torch_free(fits, 200 * MIB, device, DEFAULT);
}

#[test]
fn many_threads_on_many_streams_never_share_a_byte() {
    simulated_devices();
    let device = 9;
    // Every live block, by address: an overlap would mean two tensors share memory.
    let live = Mutex::new(BTreeMap::<u64, u64>::new());
    // As integers: raw pointers do not cross threads.
    let streams = [DEFAULT as usize, SIDE as usize, OTHER as usize, 0x7f3a_0000_3000usize];
    std::thread::scope(|scope| {
        for thread in 0..8u64 {
            let live = &live;
            let streams = &streams;
            scope.spawn(move || {
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ thread;
                let mut next = move || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed
                };
                let mut mine: Vec<(*mut c_void, usize, *mut c_void)> = Vec::new();
                for _ in 0..3000 {
                    if !mine.is_empty() && (mine.len() > 40 || next() % 2 == 0) {
                        let (p, size, stream) = mine.swap_remove((next() % mine.len() as u64) as usize);
                        live.lock().unwrap().remove(&(p as u64));
                        cachalot_torch_free(p, size, device, stream);
                    } else {
                        let size = 1 + (next() % (3 * MIB as u64)) as usize;
                        let stream = streams[(next() % streams.len() as u64) as usize] as *mut c_void;
                        let p = cachalot_torch_alloc(size, device, stream);
                        assert!(!p.is_null(), "{:?}", last_error());
                        let address = p as u64;
                        let mut live = live.lock().unwrap();
                        if let Some((&before, &len)) = live.range(..=address).next_back() {
                            assert!(before + len <= address, "{address:#x} overlaps the block at {before:#x}");
                        }
                        if let Some((&after, _)) = live.range(address..).next() {
                            assert!(address + size as u64 <= after, "{address:#x} overlaps the block at {after:#x}");
                        }
                        live.insert(address, size as u64);
                        drop(live);
                        mine.push((p, size, stream));
                    }
                }
                for (p, size, stream) in mine {
                    live.lock().unwrap().remove(&(p as u64));
                    cachalot_torch_free(p, size, device, stream);
                }
            });
        }
    });
    assert_eq!(stats(9).0, 0, "everything was freed");
    assert_eq!(registry().with_device(9, |d| d.live_count()).expect("device made"), 0);
    consistent(9);
    let facts_backend =
        registry().with_device(9, |d| d.allocator.backend().device().backend.clone()).expect("device made");
    assert_eq!(facts_backend, "sim");
}

/// The filter the shim hands `beginAllocateToPool`: here, requests on SIDE (a graph capture on
/// that stream); the context counts how often the filter was asked.
extern "C" fn side_stream_only(context: *mut c_void, stream: *mut c_void) -> c_int {
    // SAFETY: the tests pass a pointer to a static AtomicUsize as the context.
    let asked = unsafe { &*(context as *const AtomicUsize) };
    asked.fetch_add(1, Ordering::Relaxed);
    c_int::from(stream == SIDE)
}

static FILTER_ASKED: AtomicUsize = AtomicUsize::new(0);
static FILTER_RELEASED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn count_release(_: *mut c_void) {
    FILTER_RELEASED.fetch_add(1, Ordering::Relaxed);
}

fn pool_of(device: usize, address: *mut c_void) -> (u64, u64) {
    registry()
        .with_device(device, |d| {
            let segments = d.allocator.snapshot();
            let segment = segments
                .iter()
                .find(|s| (s.address..s.address + s.total_size).contains(&(address as u64)))
                .expect("a segment holds it");
            (segment.pool_id.0, segment.pool_id.1)
        })
        .expect("device made")
}

/// A graph capture through PyTorch's pool hooks, as the shim calls them: the requests PyTorch's
/// filter accepts come from the graph's private pool, the others from the default pools; the
/// pool's live allocations are what a CUDA-graph tree expects; after the graph is reset, the
/// pool's `emptyCache` gives its memory back; and the filter is released once.
#[test]
fn a_capture_through_the_pool_hooks_allocates_from_the_graphs_pool() {
    simulated_devices();
    let device = 10;
    let context = &FILTER_ASKED as *const AtomicUsize as *mut c_void;
    let (id0, id1) = (1, 0);
    let begun = cachalot_torch_begin_allocate_to_pool(device, id0, id1, side_stream_only, count_release, context);
    assert_eq!(begun, 0, "{:?}", last_error());
    let captured = cachalot_torch_alloc(4 * MIB, device, SIDE);
    let outside = cachalot_torch_alloc(4 * MIB, device, DEFAULT);
    assert_eq!(pool_of(10, captured), (1, 0));
    assert_eq!(pool_of(10, outside), (0, 0));
    assert_eq!(FILTER_ASKED.load(Ordering::Relaxed), 2, "asked once a request");
    let live = [captured as u64];
    // SAFETY: one readable pointer.
    assert_eq!(unsafe { cachalot_torch_pool_live_allocations_are(device, id0, id1, live.as_ptr(), 1) }, 1);
    // SAFETY: none to read.
    assert_eq!(unsafe { cachalot_torch_pool_live_allocations_are(device, id0, id1, live.as_ptr(), 0) }, 0);
    assert_eq!(cachalot_torch_end_allocate_to_pool(device, id0, id1), 0);
    assert_eq!(FILTER_RELEASED.load(Ordering::Relaxed), 1);
    assert_eq!(cachalot_torch_pool_use_count(device, id0, id1), 1, "the graph holds the pool");
    let after = cachalot_torch_alloc(4 * MIB, device, SIDE);
    assert_eq!(pool_of(10, after), (0, 0), "no longer routed");

    cachalot_torch_free(captured, 4 * MIB, device, SIDE);
    assert_eq!(cachalot_torch_release_pool(device, id0, id1), 0);
    assert_eq!(cachalot_torch_pool_use_count(device, id0, id1), 0);
    // (Other tests' `empty_cache` may have given it back already: it reaches every device.)
    assert_eq!(cachalot_torch_empty_pool_cache(id0, id1), 0);
    let pool_segments =
        registry().with_device(10, |d| d.allocator.snapshot().iter().filter(|s| s.pool_id.0 == 1).count());
    assert_eq!(pool_segments, Ok(0), "the released pool's segment went back");
    // A second release of a released pool is an error naming it, and changes nothing.
    assert_eq!(cachalot_torch_release_pool(device, id0, id1), 1);
    assert!(last_error().1.contains("(1, 0)"), "names the pool");
    cachalot_torch_free(outside, 4 * MIB, device, DEFAULT);
    cachalot_torch_free(after, 4 * MIB, device, SIDE);
    consistent(10);
}

/// `MemPool()` then `use_mem_pool`: created with one user, routed with a second, and the users
/// counted back down as PyTorch's context manager and the pool's deletion release them.
#[test]
fn a_mem_pool_is_created_routed_and_released() {
    simulated_devices();
    let device = 11;
    assert_eq!(cachalot_torch_create_pool(device, 0, 7), 0);
    assert_eq!(cachalot_torch_pool_use_count(device, 0, 7), 1);
    extern "C" fn every_request(_: *mut c_void, _: *mut c_void) -> c_int {
        1
    }
    extern "C" fn nothing_to_release(_: *mut c_void) {}
    let begun =
        cachalot_torch_begin_allocate_to_pool(device, 0, 7, every_request, nothing_to_release, std::ptr::null_mut());
    assert_eq!(begun, 0);
    assert_eq!(cachalot_torch_pool_use_count(device, 0, 7), 2);
    let inside = cachalot_torch_alloc(MIB, device, OTHER);
    assert_eq!(pool_of(11, inside), (0, 7));
    assert_eq!(cachalot_torch_end_allocate_to_pool(device, 0, 7), 0);
    assert_eq!(cachalot_torch_release_pool(device, 0, 7), 0);
    assert_eq!(cachalot_torch_release_pool(device, 0, 7), 0);
    assert_eq!(cachalot_torch_pool_use_count(device, 0, 7), 0);
    // The tensor outlives its pool: its memory stays until it is freed.
    assert_eq!(cachalot_torch_empty_pool_cache(0, 7), 0);
    assert_eq!(pool_of(11, inside), (0, 7));
    cachalot_torch_free(inside, MIB, device, OTHER);
    assert_eq!(cachalot_torch_empty_pool_cache(0, 7), 0);
    assert_eq!(stats(11), (0, 0), "the pool's segment went back with its last tensor");
    // Routing to a pool twice is refused, naming it.
    assert_eq!(cachalot_torch_create_pool(device, 0, 8), 0);
    let twice =
        || cachalot_torch_begin_allocate_to_pool(device, 0, 8, every_request, nothing_to_release, std::ptr::null_mut());
    assert_eq!(twice(), 0);
    assert_eq!(twice(), 1);
    assert!(last_error().1.contains("(0, 8)"));
    consistent(11);
}

/// `cacheInfo`, as cuDNN's autotuner calls it: from 0, the device's free memory is the first
/// guess; the largest cached free block counts where larger than the value passed in.
#[test]
fn cache_info_is_the_largest_free_block_or_the_guess() {
    simulated_devices();
    let device = 12;
    let a = cachalot_torch_alloc(30 * MIB, device, DEFAULT);
    cachalot_torch_free(a, 30 * MIB, device, DEFAULT);
    let mut largest = 0usize;
    // SAFETY: a writable size_t.
    assert_eq!(unsafe { cachalot_torch_cache_info(device, &mut largest) }, 0);
    assert_eq!(largest as u64, CAPACITY - 30 * MIB as u64, "the device's free bytes, larger than any block");
    let mut largest = 1usize;
    // SAFETY: as above.
    assert_eq!(unsafe { cachalot_torch_cache_info(device, &mut largest) }, 0);
    assert_eq!(largest, 30 * MIB, "the cached 30 MiB segment, free");
}

/// What `cachalot_torch_pool_restore` told its sink: pointers freed, and pointers handed out
/// with their size and stream.
#[derive(Default)]
struct Delta {
    freed: Vec<u64>,
    allocated: Vec<(u64, usize, u64)>,
}

extern "C" fn collect(context: *mut c_void, allocated: c_int, ptr: *mut c_void, size: usize, stream: *mut c_void) {
    // SAFETY: the test passes a pointer to its Delta, alive for the call.
    let delta = unsafe { &mut *(context as *mut Delta) };
    match allocated {
        0 => delta.freed.push(ptr as u64),
        _ => delta.allocated.push((ptr as u64, size, stream as u64)),
    }
}

/// A CUDA-graph tree's checkpoint and restore, as the shim makes them: a graph recorded into its
/// pool and checkpointed; replays and another recording change the pool; the restore frees
/// everything allocated in the pool now and hands out again the blocks the checkpoint had
/// allocated, which PyTorch then owns and frees through `free`.
#[test]
fn a_pool_restored_to_its_checkpoint_hands_out_the_checkpointed_blocks() {
    simulated_devices();
    let device = 13;
    let (id0, id1) = (3, 0);
    extern "C" fn every_request(_: *mut c_void, _: *mut c_void) -> c_int {
        1
    }
    extern "C" fn nothing_to_release(_: *mut c_void) {}
    let route = || {
        let begun = cachalot_torch_begin_allocate_to_pool(
            device,
            id0,
            id1,
            every_request,
            nothing_to_release,
            std::ptr::null_mut(),
        );
        assert_eq!(begun, 0, "{:?}", last_error());
    };
    // The recording: four tensors, one freed before its end.
    route();
    let recorded: Vec<*mut c_void> =
        [MIB, 512, 3 * MIB, 6 * MIB].iter().map(|&s| cachalot_torch_alloc(s, device, SIDE)).collect();
    cachalot_torch_free(recorded[1], 512, device, SIDE);
    assert_eq!(cachalot_torch_end_allocate_to_pool(device, id0, id1), 0);
    let checkpoint = cachalot_torch_pool_checkpoint(device, id0, id1);
    assert_ne!(checkpoint, 0, "{:?}", last_error());
    let at_checkpoint = stats(13);

    // Another recording into the same pool, after some outputs died.
    cachalot_torch_free(recorded[0], MIB, device, SIDE);
    route();
    let later = cachalot_torch_alloc(2 * MIB, device, SIDE);
    assert_eq!(cachalot_torch_end_allocate_to_pool(device, id0, id1), 0);

    let mut delta = Delta::default();
    let restored = cachalot_torch_pool_restore(device, checkpoint, collect, &mut delta as *mut Delta as *mut c_void);
    assert_eq!(restored, 0, "{:?}", last_error());
    let mut freed = delta.freed.clone();
    freed.sort_unstable();
    let mut expected_freed = vec![later as u64, recorded[2] as u64, recorded[3] as u64];
    expected_freed.sort_unstable();
    assert_eq!(freed, expected_freed, "everything allocated in the pool was freed");
    let handed: Vec<(u64, usize)> = delta.allocated.iter().map(|&(p, size, _)| (p, size)).collect();
    let mut expected: Vec<(u64, usize)> = [(recorded[0], MIB), (recorded[2], 3 * MIB), (recorded[3], 6 * MIB)]
        .iter()
        .map(|&(p, s)| (p as u64, s))
        .collect();
    expected.sort_unstable();
    assert_eq!(handed, expected, "the checkpoint's allocated blocks, in address order");
    assert!(delta.allocated.iter().all(|&(_, _, stream)| stream == SIDE as u64));
    assert_eq!(stats(13), at_checkpoint);
    let live: Vec<u64> = expected.iter().map(|&(p, _)| p).collect();
    // SAFETY: `live.len()` readable pointers.
    assert_eq!(unsafe { cachalot_torch_pool_live_allocations_are(device, id0, id1, live.as_ptr(), live.len()) }, 1);
    consistent(13);

    // PyTorch owns the handed-out pointers and frees them through `free`; the freed one it no
    // longer owns is not the allocator's to free any more.
    cachalot_torch_free(later, 2 * MIB, device, SIDE);
    assert!(last_error().1.contains("did not hand out"), "{:?}", last_error());
    for &(ptr, size) in &expected {
        cachalot_torch_free(ptr as *mut c_void, size, device, SIDE);
        assert_eq!(last_error().0, ERROR_NONE);
    }
    assert_eq!(stats(13).0, 0);

    // Dropped, the checkpoint is gone; a restore of it is refused, naming it.
    cachalot_torch_checkpoint_drop(device, checkpoint);
    let mut delta = Delta::default();
    assert_eq!(cachalot_torch_pool_restore(device, checkpoint, collect, &mut delta as *mut Delta as *mut c_void), 1);
    assert!(last_error().1.contains(&format!("checkpoint {checkpoint}")));
    assert!(delta.freed.is_empty() && delta.allocated.is_empty());
    // A pool that does not exist has no checkpoint.
    assert_eq!(cachalot_torch_pool_checkpoint(device, 9, 9), 0);
    assert!(last_error().1.contains("(9, 9)"), "{:?}", last_error());
    consistent(13);
}
