//! Random operation sequences under every configuration, with every invariant checked after
//! every operation: blocks tile their segments, nothing overlaps or sits in two places, free
//! neighbours are merged, and each stat equals a recount from scratch — also after errors.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use cachalot_core::{Allocation, AllocatorConfig, AllocatorError, CachingAllocator, SimBackend, StreamId};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// Streams the operations use; 0 is the default stream.
const STREAMS: [StreamId; 4] = [StreamId(0), StreamId(0x5000), StreamId(0x9000), StreamId(0xd000)];

#[derive(Clone, Debug)]
enum Op {
    Malloc { size: u64, stream: usize },
    Free { pick: usize },
    RecordStream { pick: usize, stream: usize },
    HoldStream { stream: usize },
    FinishStream { stream: usize },
    EmptyCache,
    ToggleExpandable,
    ResetPeak,
    ResetAccumulated,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        // Log-uniform from 1 B to 64 MiB.
        (0u32..=26, any::<u64>()).prop_map(|(bits, r)| (1u64 << bits) + r % (1u64 << bits)),
        Just(MIB),
        Just(2 * MIB),
        Just(20 * MIB),
        Just(10 * MIB - 1),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => (size(), 0..STREAMS.len()).prop_map(|(size, stream)| Op::Malloc { size, stream }),
        30 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        6 => (any::<usize>(), 0..STREAMS.len()).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        4 => (0..STREAMS.len()).prop_map(|stream| Op::HoldStream { stream }),
        6 => (0..STREAMS.len()).prop_map(|stream| Op::FinishStream { stream }),
        3 => Just(Op::EmptyCache),
        1 => Just(Op::ToggleExpandable),
        2 => Just(Op::ResetPeak),
        2 => Just(Op::ResetAccumulated),
    ]
}

/// Every configuration family: defaults, oversize limits with power-of-two rounding, a bigger
/// large-segment size, expandable segments, and a memory fraction with garbage collection; then
/// cachalot's own policy alone, with oversize limits, and under a fraction with collection.
const CONFIGS: [(&str, Option<f64>); 9] = [
    ("", None),
    ("max_split_size_mb:40,roundup_power2_divisions:[1:2,4:4,>:8]", None),
    ("large_segment_size_mb:32,max_non_split_rounding_mb:24,max_split_size_mb:32", None),
    ("expandable_segments:True", None),
    ("expandable_segments:True,max_split_size_mb:20,roundup_power2_divisions:4", None),
    ("garbage_collection_threshold:0.5,max_split_size_mb:24", Some(0.75)),
    ("policy:cachalot", None),
    ("policy:cachalot,max_split_size_mb:40,roundup_power2_divisions:4", None),
    ("policy:cachalot,garbage_collection_threshold:0.5,max_split_size_mb:24", Some(0.75)),
];

/// A freed range whose cross-stream uses (`record_stream` on a stream held busy at the free) are
/// still running: no allocation may get any of it until those streams finish or are synchronized.
struct PendingFree {
    address: u64,
    size: u64,
    streams: Vec<usize>,
}

/// No live allocation shares a byte with another (no block handed out twice).
fn check_disjoint(live: &[(Allocation, Vec<usize>)]) -> Result<(), TestCaseError> {
    let mut ranges: Vec<(u64, u64)> =
        live.iter().filter(|(x, _)| !x.is_empty()).map(|(x, _)| (x.address(), x.address() + x.size())).collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        prop_assert!(pair[0].1 <= pair[1].0, "live blocks overlap: {:?}", pair);
    }
    Ok(())
}

fn run(config_index: usize, ops: &[Op]) -> Result<(), TestCaseError> {
    let (settings, fraction) = CONFIGS[config_index];
    let config = AllocatorConfig::parse(settings).unwrap();
    // A small device so that out-of-memory errors are common.
    let mut a = CachingAllocator::new(SimBackend::new(256 * MIB), config.clone()).unwrap();
    if let Some(f) = fraction {
        a.set_memory_fraction(f).unwrap();
    }
    // Each live allocation with the streams `record_stream` named for it.
    let mut live: Vec<(Allocation, Vec<usize>)> = Vec::new();
    let mut pending: Vec<PendingFree> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Malloc { size, stream } => {
                let retries = a.stats().num_alloc_retries;
                let result = a.malloc(size, STREAMS[stream]);
                // The retry chain synchronizes every outstanding event before releasing.
                if a.stats().num_alloc_retries != retries {
                    pending.clear();
                }
                match result {
                    Ok(x) => {
                        prop_assert!(x.size() >= size && x.size() % 512 == 0);
                        prop_assert_eq!(x.stream(), STREAMS[stream]);
                        let (start, end) = (x.address(), x.address() + x.size());
                        for p in &pending {
                            prop_assert!(
                                end <= p.address || p.address + p.size <= start,
                                "config {:?}, step {}: {:#x}+{} handed out while a free of {:#x}+{} waits on streams {:?}",
                                settings,
                                step,
                                start,
                                x.size(),
                                p.address,
                                p.size,
                                p.streams
                            );
                        }
                        live.push((x, Vec::new()));
                        check_disjoint(&live)?;
                    }
                    Err(AllocatorError::OutOfMemory(_)) => {}
                    Err(other) => return Err(TestCaseError::fail(format!("step {step}: {other}"))),
                }
            }
            Op::Free { pick } if !live.is_empty() => {
                let (x, used_on) = live.swap_remove(pick % live.len());
                a.free(x).unwrap();
                prop_assert!(a.free(x).is_err(), "a second free must fail");
                let held = |s: usize| a.backend().is_held(STREAMS[s]);
                let streams: Vec<usize> =
                    used_on.into_iter().filter(|&s| held(s) && STREAMS[s] != x.stream()).collect();
                if !streams.is_empty() && !x.is_empty() {
                    pending.push(PendingFree { address: x.address(), size: x.size(), streams });
                }
            }
            Op::RecordStream { pick, stream } if !live.is_empty() => {
                let index = pick % live.len();
                a.record_stream(&live[index].0, STREAMS[stream]).unwrap();
                live[index].1.push(stream);
            }
            Op::HoldStream { stream } => a.backend_mut().hold_stream(STREAMS[stream]),
            Op::FinishStream { stream } => a.backend_mut().finish_stream(STREAMS[stream]),
            Op::EmptyCache => {
                a.empty_cache().unwrap();
                pending.clear();
            }
            Op::ToggleExpandable => {
                let enabled = !a.config().expandable_segments();
                a.set_config(a.config().clone().with_expandable_segments(enabled)).unwrap();
            }
            Op::ResetPeak => a.reset_peak_stats(),
            Op::ResetAccumulated => a.reset_accumulated_stats(),
            _ => {}
        }
        // A stream that stopped being held (finished, or waited for by an unmap) has completed
        // the events of the frees waiting on it.
        for p in &mut pending {
            p.streams.retain(|&s| a.backend().is_held(STREAMS[s]));
        }
        pending.retain(|p| !p.streams.is_empty());
        if let Err(violation) = a.check_consistency() {
            return Err(TestCaseError::fail(format!("config {settings:?}, step {step} ({op:?}): {violation}")));
        }
        prop_assert_eq!(a.memory_reserved(), a.backend().used(), "reserved bytes equal device bytes");
        let allocated: u64 = live.iter().map(|(x, _)| x.size()).sum();
        prop_assert_eq!(a.memory_allocated(), allocated);
    }
    // Everything freed and the cache emptied: the device is empty again.
    for (x, _) in live {
        a.free(x).unwrap();
    }
    for s in STREAMS {
        a.backend_mut().finish_stream(s);
    }
    a.empty_cache().unwrap();
    a.check_consistency().map_err(TestCaseError::fail)?;
    prop_assert_eq!(a.memory_reserved(), 0);
    prop_assert_eq!(a.backend().used(), 0);
    Ok(())
}

proptest! {
    // 40 cases x 9 configurations (six of PyTorch's policy, three of policy:cachalot) x 4,200
    // operations = 1,512,000 checked operations, over four streams. The configurations of a case run on threads of their own (CI has two
    // cores).
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]
    #[test]
    fn invariants_hold_after_every_operation(ops in prop::collection::vec(op(), 4_200)) {
        let outcomes: Vec<Result<(), TestCaseError>> = std::thread::scope(|scope| {
            let ops = &ops;
            let runs: Vec<_> = (0..CONFIGS.len()).map(|config_index| scope.spawn(move || run(config_index, ops))).collect();
            runs.into_iter().map(|r| r.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
        });
        for outcome in outcomes {
            outcome?;
        }
    }
}
