//! The private-pool calls of a recorded program (`torch.cuda.MemPool`, `use_mem_pool`, CUDA
//! graph captures, CUDA-graph trees' checkpoints), which a trace does not show:
//! `scripts/conformance/pool_calls.py` lists them in the run's `expected.json` (`calls`, each
//! after a `snapshot` entry), in the words of PyTorch's device allocator, and the replay makes
//! them there (`docs/allocator-rules.md` §25).
//!
//! ```text
//! {"call": "create_pool", "pool": [0, 1], "trace_len": 6}             MemPool()
//! {"call": "begin_allocate_to_pool", "pool": [0, 1], "trace_len": 7}  use_mem_pool entering
//! {"call": "begin_allocate_to_pool", "pool": [1, 0], "stream": S, …}  a capture on stream S
//! {"call": "end_allocate_to_pool", "pool": [0, 1], …}
//! {"call": "release_pool", "pool": [0, 1], …}
//! {"call": "empty_cache", "pool": [0, 1], …}                          emptyCache(pool)
//! {"call": "checkpoint_pool", "pool": [1, 0], "checkpoint": 3, …}     getCheckpointState
//! {"call": "set_checkpoint_pool_state", "pool": [1, 0], "checkpoint": 3, …}
//! ```
//!
//! A checkpoint is named by its number in the recording; the replay takes its own at the same
//! place ([`PoolCheckpoints`]), which is the same state where the replay is exact, and restores
//! that one.

use cachalot_core::backend::{Backend, StreamId};
use cachalot_core::error::AllocatorError;
use cachalot_core::{CachingAllocator, PoolCheckpoint, PoolFilter, PoolId, RestoreDelta};
use rustc_hash::FxHashMap;

/// One private-pool call of a recorded program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolCall {
    /// `MemPool()`: [`CachingAllocator::create_pool`].
    Create(PoolId),
    /// Routing to the pool begins, for one stream (a capture) or every stream (`use_mem_pool`):
    /// [`CachingAllocator::begin_allocate_to_pool`].
    Begin(PoolId, Option<StreamId>),
    /// Routing to the pool ends: [`CachingAllocator::end_allocate_to_pool`].
    End(PoolId),
    /// A user of the pool is gone: [`CachingAllocator::release_pool`].
    Release(PoolId),
    /// `emptyCache(pool)`: [`CachingAllocator::empty_pool_cache`].
    EmptyCache(PoolId),
    /// `getCheckpointState(pool)`, the recording's checkpoint number `n`:
    /// [`CachingAllocator::checkpoint_pool`].
    Checkpoint(PoolId, u64),
    /// `setCheckpointPoolState` with the recording's checkpoint number `n`:
    /// [`CachingAllocator::restore_pool`].
    Restore(PoolId, u64),
}

/// The names of [`PoolCall`]s in `expected.json`.
pub const POOL_CALL_NAMES: [&str; 7] = [
    "create_pool",
    "begin_allocate_to_pool",
    "end_allocate_to_pool",
    "release_pool",
    "empty_cache (with a pool)",
    "checkpoint_pool",
    "set_checkpoint_pool_state",
];

/// The checkpoints a replay took, by the recording's checkpoint number.
#[derive(Clone, Debug, Default)]
pub struct PoolCheckpoints(FxHashMap<u64, PoolCheckpoint>);

impl PoolCall {
    /// The pool the call names.
    pub fn pool(self) -> PoolId {
        match self {
            PoolCall::Create(p) | PoolCall::Begin(p, _) | PoolCall::End(p) | PoolCall::Release(p) => p,
            PoolCall::EmptyCache(p) | PoolCall::Checkpoint(p, _) | PoolCall::Restore(p, _) => p,
        }
    }

    /// Parses call `i` of an `expected.json`'s `calls` named `name`; `Ok(None)` when `name` is
    /// not a pool call (an `empty_cache` without a `pool` is the plain one). Errors name the field.
    pub fn parse(name: &str, call: &serde_json::Value, i: usize) -> Result<Option<Self>, String> {
        let pool = || -> Result<PoolId, String> {
            let pair =
                call.get("pool").and_then(|p| p.as_array()).ok_or(format!("calls[{i}].pool: expected [a, b]"))?;
            match pair.as_slice() {
                [a, b] => match (a.as_u64(), b.as_u64()) {
                    (Some(a), Some(b)) if (a, b) != (0, 0) => Ok(PoolId(a, b)),
                    _ => Err(format!("calls[{i}].pool: expected two non-negative integers, not both 0")),
                },
                _ => Err(format!("calls[{i}].pool: expected [a, b]")),
            }
        };
        let checkpoint = || {
            call.get("checkpoint")
                .and_then(|n| n.as_u64())
                .ok_or(format!("calls[{i}].checkpoint: expected a non-negative integer"))
        };
        Ok(Some(match name {
            "create_pool" => PoolCall::Create(pool()?),
            "begin_allocate_to_pool" => {
                let stream = match call.get("stream") {
                    None | Some(serde_json::Value::Null) => None,
                    Some(s) => {
                        Some(StreamId(s.as_u64().ok_or(format!("calls[{i}].stream: expected a non-negative integer"))?))
                    }
                };
                PoolCall::Begin(pool()?, stream)
            }
            "end_allocate_to_pool" => PoolCall::End(pool()?),
            "release_pool" => PoolCall::Release(pool()?),
            "empty_cache" if call.get("pool").is_some() => PoolCall::EmptyCache(pool()?),
            "checkpoint_pool" => PoolCall::Checkpoint(pool()?, checkpoint()?),
            "set_checkpoint_pool_state" => PoolCall::Restore(pool()?, checkpoint()?),
            _ => return Ok(None),
        }))
    }

    /// Makes the call on `allocator`, with a capture's stream replaced by `stream_of(stream)`.
    /// A checkpoint is taken and not kept; a restore, which needs the checkpoint and hands out
    /// allocations the caller must then own, is refused: [`PoolCall::perform_with`] makes both.
    pub fn perform<B: Backend>(
        self,
        allocator: &mut CachingAllocator<B>,
        stream_of: impl Fn(StreamId) -> StreamId,
    ) -> Result<(), AllocatorError> {
        match self {
            PoolCall::Checkpoint(pool, _) => allocator.checkpoint_pool(pool).map(|_| ()),
            PoolCall::Restore(pool, n) => Err(AllocatorError::Unsupported(format!(
                "restoring checkpoint {n} of pool {pool} (setCheckpointPoolState) is made by the simulator's replay \
                 only, which keeps the checkpoints and the allocations the restore hands out"
            ))),
            PoolCall::Create(pool) => allocator.create_pool(pool),
            PoolCall::Begin(pool, stream) => {
                let filter = stream.map_or(PoolFilter::AllStreams, |s| PoolFilter::Stream(stream_of(s)));
                allocator.begin_allocate_to_pool(pool, filter)
            }
            PoolCall::End(pool) => allocator.end_allocate_to_pool(pool),
            PoolCall::Release(pool) => allocator.release_pool(pool),
            PoolCall::EmptyCache(pool) => allocator.empty_pool_cache(pool),
        }
    }

    /// [`PoolCall::perform`], keeping checkpoints in `checkpoints` and restoring them from there:
    /// a restore returns what it changed for the caller.
    pub fn perform_with<B: Backend>(
        self,
        allocator: &mut CachingAllocator<B>,
        stream_of: impl Fn(StreamId) -> StreamId,
        checkpoints: &mut PoolCheckpoints,
    ) -> Result<Option<RestoreDelta>, AllocatorError> {
        match self {
            PoolCall::Checkpoint(pool, n) => {
                let checkpoint = allocator.checkpoint_pool(pool)?;
                checkpoints.0.insert(n, checkpoint);
                Ok(None)
            }
            PoolCall::Restore(pool, n) => {
                let checkpoint = checkpoints.0.get(&n).filter(|c| c.pool == pool).ok_or_else(|| {
                    AllocatorError::Unsupported(format!(
                        "setCheckpointPoolState of pool {pool} with checkpoint {n}, which no checkpoint_pool of that \
                         pool took before"
                    ))
                })?;
                allocator.restore_pool(checkpoint).map(Some)
            }
            other => other.perform(allocator, stream_of).map(|()| None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_calls_parse_and_bad_ones_name_the_field() {
        let parse = |json: &str| {
            let value: serde_json::Value = serde_json::from_str(json).unwrap();
            let name = value["call"].as_str().unwrap().to_owned();
            PoolCall::parse(&name, &value, 3)
        };
        assert_eq!(parse(r#"{"call": "create_pool", "pool": [0, 1]}"#), Ok(Some(PoolCall::Create(PoolId(0, 1)))));
        assert_eq!(
            parse(r#"{"call": "begin_allocate_to_pool", "pool": [1, 0], "stream": 77}"#),
            Ok(Some(PoolCall::Begin(PoolId(1, 0), Some(StreamId(77)))))
        );
        assert_eq!(parse(r#"{"call": "empty_cache", "pool": [0, 2]}"#), Ok(Some(PoolCall::EmptyCache(PoolId(0, 2)))));
        assert_eq!(parse(r#"{"call": "empty_cache"}"#), Ok(None));
        assert_eq!(
            parse(r#"{"call": "checkpoint_pool", "pool": [1, 0], "checkpoint": 4}"#),
            Ok(Some(PoolCall::Checkpoint(PoolId(1, 0), 4)))
        );
        assert_eq!(
            parse(r#"{"call": "set_checkpoint_pool_state", "pool": [1, 0], "checkpoint": 4}"#),
            Ok(Some(PoolCall::Restore(PoolId(1, 0), 4)))
        );
        for bad in [
            r#"{"call": "checkpoint_pool", "pool": [1, 0]}"#,
            r#"{"call": "set_checkpoint_pool_state", "pool": [1, 0], "checkpoint": -4}"#,
        ] {
            assert!(parse(bad).unwrap_err().starts_with("calls[3].checkpoint"), "{bad}");
        }
        assert_eq!(parse(r#"{"call": "gc"}"#), Ok(None));
        for bad in [
            r#"{"call": "release_pool"}"#,
            r#"{"call": "release_pool", "pool": [0, 0]}"#,
            r#"{"call": "release_pool", "pool": [-1, 2]}"#,
            r#"{"call": "release_pool", "pool": [1]}"#,
        ] {
            assert!(parse(bad).unwrap_err().starts_with("calls[3].pool"), "{bad}");
        }
        let bad_stream = parse(r#"{"call": "begin_allocate_to_pool", "pool": [1, 0], "stream": "s"}"#);
        assert!(bad_stream.unwrap_err().starts_with("calls[3].stream"));
    }
}
