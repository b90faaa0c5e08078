//! The replay of a CUDA-graph tree's pool calls (torch.compile's `mode="reduce-overhead"`):
//! captures into the tree's pool, warm-ups routed to it, checkpoints taken after recordings and
//! restored to record off the path (`setCheckpointPoolState`). The trace is made here, by an
//! allocator whose pool calls are listed beside it as `scripts/conformance/pool_calls.py` lists a
//! program's; the replay must match it exactly, and does not without the restores.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use cachalot_core::trace::TraceAction;
use cachalot_core::{
    AllocatorConfig, CachingAllocator, PoolCheckpoint, PoolFilter, PoolId, RestoreDelta, SimBackend, StreamId,
};
use cachalot_trace::pool_calls::PoolCall;
use cachalot_trace::replay::{ReplayOptions, record_pool_calls, replay, verify_against_recording};
use cachalot_trace::snapshot::torch::{self, TorchSnapshot};

const MIB: u64 = 1 << 20;
const POOL: PoolId = PoolId(1, 0);
const MAIN: StreamId = StreamId(0x7000);
/// The tree's capture stream.
const CAPTURE: StreamId = StreamId(0x7100);

/// An allocator making a program's pool calls and listing each with the entries recorded
/// before it.
struct Program {
    a: CachingAllocator<SimBackend>,
    calls: Vec<(usize, PoolCall)>,
    checkpoints: Vec<PoolCheckpoint>,
}

impl Program {
    fn call(&mut self, call: PoolCall) -> Option<RestoreDelta> {
        self.calls.push((self.a.trace_len_total() as usize, call));
        match call {
            PoolCall::Begin(pool, stream) => {
                let filter = stream.map_or(PoolFilter::AllStreams, PoolFilter::Stream);
                self.a.begin_allocate_to_pool(pool, filter).unwrap();
            }
            PoolCall::End(pool) => self.a.end_allocate_to_pool(pool).unwrap(),
            PoolCall::Release(pool) => self.a.release_pool(pool).unwrap(),
            PoolCall::Checkpoint(pool, n) => {
                assert_eq!(n as usize, self.checkpoints.len());
                self.checkpoints.push(self.a.checkpoint_pool(pool).unwrap());
            }
            PoolCall::Restore(_, n) => return Some(self.a.restore_pool(&self.checkpoints[n as usize]).unwrap()),
            other => panic!("not made here: {other:?}"),
        }
        None
    }
}

/// A graph tree's life on one device: two recordings and a warm-up into its pool, with an
/// output of the first dying while the second path is taken, and the pool restored to a
/// checkpoint three times. Returns the trace and the calls.
fn graph_tree() -> (TorchSnapshot, Vec<(usize, PoolCall)>) {
    let mut a = CachingAllocator::new(SimBackend::new(80 << 30), AllocatorConfig::default()).unwrap();
    a.record_history(true, usize::MAX, &[], false);
    let weights = a.malloc(24 * MIB, MAIN).unwrap();
    let mut p = Program { a, calls: Vec::new(), checkpoints: Vec::new() };
    // The manager's empty capture keeps the pool alive.
    p.call(PoolCall::Begin(POOL, Some(CAPTURE)));
    p.call(PoolCall::End(POOL));
    // Recording A: activations, some freed within, outputs kept.
    p.call(PoolCall::Begin(POOL, Some(CAPTURE)));
    let sizes = [6 * MIB, 512, 3 * MIB, 40_000, 2 * MIB, 30 * MIB];
    let mut a_out: Vec<_> = sizes.iter().map(|&s| p.a.malloc(s, CAPTURE).unwrap()).collect();
    for i in [5, 2] {
        p.a.free(a_out.remove(i)).unwrap();
    }
    p.call(PoolCall::End(POOL));
    p.call(PoolCall::Checkpoint(POOL, 0));
    // Warm-up of another function off the path: routed by thread, then released.
    p.call(PoolCall::Begin(POOL, None));
    let warm: Vec<_> = [5 * MIB, 700].iter().map(|&s| p.a.malloc(s, MAIN).unwrap()).collect();
    p.a.free(warm[1]).unwrap();
    p.call(PoolCall::End(POOL));
    p.call(PoolCall::Release(POOL));
    p.a.free(warm[0]).unwrap();

    // Back to A's checkpoint to record B: A's first output died meanwhile.
    let delta = p.call(PoolCall::Restore(POOL, 0)).unwrap();
    let dead = delta.allocated.iter().find(|x| x.address() == a_out[0].address()).copied().unwrap();
    p.a.free(dead).unwrap(); // `_cuda_cudaCachingAllocator_raw_delete` of the dead output
    p.call(PoolCall::Begin(POOL, Some(CAPTURE)));
    let b_out: Vec<_> = [4 * MIB, 1536, 9 * MIB].iter().map(|&s| p.a.malloc(s, CAPTURE).unwrap()).collect();
    p.call(PoolCall::End(POOL));
    p.call(PoolCall::Checkpoint(POOL, 1));

    // Off the path again: A's state once more (B's outputs freed by the restore).
    let delta = p.call(PoolCall::Restore(POOL, 0)).unwrap();
    assert!(b_out.iter().all(|x| delta.freed.contains(&x.address())));
    let mut owned = delta.allocated;
    // And B's: every block freed, B's allocated.
    let delta = p.call(PoolCall::Restore(POOL, 1)).unwrap();
    owned.retain(|x| !delta.freed.contains(&x.address()));
    assert!(owned.is_empty());
    for x in delta.allocated {
        p.a.free(x).unwrap();
    }
    p.a.free(weights).unwrap();
    p.a.check_consistency().unwrap();
    (torch::from_allocator(&p.a, None), p.calls)
}

/// Replays `snapshot` with `calls` recorded into it as a capture records them.
fn replayed(mut snapshot: TorchSnapshot, calls: &[(usize, PoolCall)]) -> Result<(), String> {
    let program_calls = record_pool_calls(&mut snapshot.device_traces[0], calls);
    let options = ReplayOptions { calls: Some(program_calls), ..ReplayOptions::for_snapshot(&snapshot, None).unwrap() };
    let outcome = replay(&snapshot, &options, |_, _| {}).map_err(|e| e.to_string())?;
    verify_against_recording(&snapshot, &outcome, None).map_err(|e| e.to_string())?;
    outcome.allocator.check_consistency()?;
    Ok(())
}

#[test]
fn a_graph_trees_checkpoints_and_restores_replay_exactly() {
    let (snapshot, calls) = graph_tree();
    let restores = calls.iter().filter(|(_, c)| matches!(c, PoolCall::Restore(..))).count();
    assert_eq!(restores, 3);
    replayed(snapshot, &calls).unwrap();
}

/// PyTorch frees a pool's blocks in its hash set's order, not by address: the restore's entries
/// in another order replay the same.
#[test]
fn a_restores_entries_in_pytorchs_own_order_replay_the_same() {
    let (mut snapshot, calls) = graph_tree();
    let trace = &mut snapshot.device_traces[0];
    let (at, _) = calls.iter().find(|(_, c)| matches!(c, PoolCall::Restore(..))).copied().unwrap();
    // The first restore starts with two frees (requested + completed each): swap them.
    let frees = &trace[at..at + 4];
    assert!(frees.iter().all(|e| matches!(e.action, TraceAction::FreeRequested | TraceAction::FreeCompleted)));
    trace[at..at + 4].rotate_left(2);
    replayed(snapshot, &calls).unwrap();
}

/// Without the restores listed, the replay does not match: they are what makes it exact.
#[test]
fn without_the_restores_the_replay_does_not_match() {
    let (snapshot, calls) = graph_tree();
    let without: Vec<_> = calls.iter().copied().filter(|(_, c)| !matches!(c, PoolCall::Restore(..))).collect();
    let error = replayed(snapshot, &without).unwrap_err();
    assert!(error.contains("got"), "the restore's allocations are not where PyTorch's were: {error}");
}

/// A restore of a checkpoint the recording never listed is an error naming it.
#[test]
fn a_restore_of_a_checkpoint_never_taken_is_named() {
    let (snapshot, calls) = graph_tree();
    let renamed: Vec<_> = calls
        .iter()
        .map(|&(at, c)| match c {
            PoolCall::Restore(pool, 1) => (at, PoolCall::Restore(pool, 7)),
            other => (at, other),
        })
        .collect();
    let error = replayed(snapshot, &renamed).unwrap_err();
    assert!(error.contains("checkpoint 7"), "{error}");
}
