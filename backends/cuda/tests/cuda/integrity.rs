//! Memory integrity under a random workload of 100,000+ operations through
//! `CachingAllocator<CudaBackend>`: every live block is filled with its own pattern by a kernel
//! and checked on the device — when it is freed, when another stream rewrites it, and in
//! sweeps over all live blocks — with allocations on four streams, cross-stream writes with
//! `record_stream`, and `empty_cache` now and then. Not one word may differ.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cachalot_core::{Allocation, AllocatorConfig, CachingAllocator, StreamId};
use cachalot_cuda::{CudaBackend, CudaDevice, CudaKernels, DeviceSpan};
use cachalot_shaders::cpu::Rng;

use crate::common;

const OPS: usize = 100_000;
const MAX_LIVE: usize = 400;
const SWEEP_EVERY: usize = 2_000;
const EMPTY_CACHE_EVERY: usize = 10_000;

struct Live {
    allocation: Allocation,
    seed: u64,
    /// The stream of the last write; it saw every earlier write of the block.
    writer: StreamId,
}

impl Live {
    fn span(&self) -> DeviceSpan {
        DeviceSpan::block(&self.allocation)
    }

    fn words(&self) -> u64 {
        self.allocation.size() / 4
    }
}

/// Sizes log-uniform from 1 byte to 32 MiB: both pools, splits, oversize remainders.
fn random_size(rng: &mut Rng) -> u64 {
    let log = rng.uniform(0.0, 25.0);
    (2f64.powf(log as f64) as u64).max(1)
}

struct Counts {
    allocs: usize,
    frees: usize,
    cross_writes: usize,
    checks: usize,
}

fn run(config: AllocatorConfig, seed: u64, test: &str) {
    let Some(device) = common::device(test) else { return };
    let backend = CudaBackend::with_device(Arc::clone(&device)).expect("backend");
    let mut allocator = CachingAllocator::new(backend, config).expect("allocator");
    let kernels = CudaKernels::new(&device).expect("kernels");
    let streams =
        [StreamId::DEFAULT, device.new_stream().unwrap(), device.new_stream().unwrap(), device.new_stream().unwrap()];
    let counter = allocator.malloc(4, StreamId::DEFAULT).unwrap();
    kernels.fill_u32(StreamId::DEFAULT, &counter, 1, 0).unwrap();
    device.synchronize().unwrap();

    let mut rng = Rng::new(seed);
    let mut live: Vec<Live> = Vec::new();
    let mut next_seed = 1u64;
    let mut counts = Counts { allocs: 0, frees: 0, cross_writes: 0, checks: 0 };
    let started = Instant::now();
    let check = |kernels: &CudaKernels, block: &Live, counts: &mut Counts| {
        kernels.check_pattern(block.writer, block.span(), block.words(), block.seed, &counter).unwrap();
        counts.checks += 1;
    };

    for op in 1..=OPS {
        let roll = rng.below(100);
        if live.len() < 8 || (live.len() < MAX_LIVE && roll < 45) {
            let stream = streams[rng.below(streams.len() as u32) as usize];
            let allocation = allocator.malloc(random_size(&mut rng), stream).unwrap();
            let block = Live { allocation, seed: next_seed, writer: stream };
            next_seed += 1;
            kernels.fill_pattern(stream, block.span(), block.words(), block.seed).unwrap();
            live.push(block);
            counts.allocs += 1;
        } else if roll < 85 {
            // Check on the last writer's stream, then free: a block used on other streams comes
            // back only after their events (recorded now, after the check).
            let block = live.swap_remove(rng.below(live.len() as u32) as usize);
            check(&kernels, &block, &mut counts);
            if block.writer != block.allocation.stream() {
                allocator.record_stream(&block.allocation, block.writer).unwrap();
            }
            allocator.free(block.allocation).unwrap();
            counts.frees += 1;
        } else {
            // Another stream checks the block and writes a new pattern, sometimes slowly.
            let i = rng.below(live.len() as u32) as usize;
            let others: Vec<StreamId> = streams.iter().copied().filter(|&s| s != live[i].writer).collect();
            let stream = others[rng.below(others.len() as u32) as usize];
            device.wait_stream(stream, live[i].writer).unwrap();
            live[i].writer = stream;
            check(&kernels, &live[i], &mut counts);
            live[i].seed = next_seed;
            next_seed += 1;
            let block = &live[i];
            if rng.below(20) == 0 {
                kernels
                    .spin_fill_pattern(stream, block.span(), block.words(), block.seed, Duration::from_micros(200), 2)
                    .unwrap();
            } else {
                kernels.fill_pattern(stream, block.span(), block.words(), block.seed).unwrap();
            }
            if stream != block.allocation.stream() {
                allocator.record_stream(&block.allocation, stream).unwrap();
            }
            counts.cross_writes += 1;
        }
        if op % SWEEP_EVERY == 0 {
            for block in &live {
                check(&kernels, block, &mut counts);
            }
            let errors = common::read_counter(&device, &kernels, &counter);
            assert_eq!(errors, 0, "after {op} ops: {errors} corrupted words");
            allocator.check_consistency().unwrap();
        }
        if op % EMPTY_CACHE_EVERY == 0 {
            allocator.empty_cache().unwrap();
            assert_eq!(allocator.backend().device_bytes(), allocator.memory_reserved());
        }
    }
    for block in live.drain(..) {
        check(&kernels, &block, &mut counts);
        if block.writer != block.allocation.stream() {
            allocator.record_stream(&block.allocation, block.writer).unwrap();
        }
        allocator.free(block.allocation).unwrap();
    }
    let errors = common::read_counter(&device, &kernels, &counter);
    allocator.free(counter).unwrap();
    allocator.empty_cache().unwrap();
    println!(
        "{OPS} ops in {:.1?}: {} allocations, {} frees, {} cross-stream writes, {} pattern checks; peak reserved \
         {} bytes; {} device allocations and maps, {} frees and unmaps; {errors} corrupted words",
        started.elapsed(),
        counts.allocs,
        counts.frees,
        counts.cross_writes,
        counts.checks,
        allocator.stats().reserved_bytes.all().peak,
        allocator.stats().num_device_alloc,
        allocator.stats().num_device_free,
    );
    assert_eq!(errors, 0, "corrupted words");
    assert!(counts.allocs + counts.frees + counts.cross_writes >= OPS);
    assert_eq!(allocator.memory_allocated(), 0);
    assert_eq!(allocator.memory_reserved(), 0);
    assert_eq!(allocator.backend().device_bytes(), 0);
    allocator.check_consistency().unwrap();
    drop(allocator);
    let _: &Arc<CudaDevice> = &device;
}

#[test]
fn random_workload_keeps_every_byte() {
    run(AllocatorConfig::default(), 0x5eed_0001, "random_workload_keeps_every_byte");
}

#[test]
fn random_workload_keeps_every_byte_with_expandable_segments() {
    let config = AllocatorConfig::parse("expandable_segments:True").expect("config");
    run(config, 0x5eed_0002, "random_workload_keeps_every_byte_with_expandable_segments");
}

/// cachalot's own policy (`docs/allocator-rules.md` §24): at its peak it unmaps the free pages
/// at the top of free blocks that sit between live ones, and maps pages for misses beside
/// them, on every repeat of the workload's sizes; not one word of a live block may move.
#[test]
fn random_workload_keeps_every_byte_under_policy_cachalot() {
    let config = AllocatorConfig::parse("policy:cachalot").expect("config");
    run(config, 0x5eed_0003, "random_workload_keeps_every_byte_under_policy_cachalot");
}
