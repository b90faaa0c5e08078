//! # cachalot-trace
//!
//! Everything file-shaped around cachalot's allocator: what it writes, what it reads, and the
//! replay of what another allocator recorded. The allocator itself (`cachalot-core`) depends on
//! no parser; a program that embeds it compiles none of this.
//!
//! - [`snapshot`]: cachalot's JSON snapshot ([`Snapshot`]), PyTorch's snapshot typed
//!   ([`snapshot::torch`]) and its pickles ([`snapshot::pickle`]: a guarded reader that never
//!   builds objects, and a writer PyTorch's `_memory_viz` opens), and [`snapshot::FileFormat`],
//!   which tells them apart;
//! - [`ops`]: op files (`a ID SIZE [STREAM]`, `f ID`), the common input of the allocator
//!   benchmarks, and the timing method of PyTorch's reference harness;
//! - [`replay`]: a recorded PyTorch trace replayed through the allocator on the simulator, and
//!   its verification against the recording ([`replay::verify_against_recording`]: `cachalot
//!   replay --check`);
//! - [`normalized`]: allocator event sequences with addresses as segment index + offset, so runs
//!   on different devices compare event for event ([`normalized::first_difference`]).
//! - [`rebuild`]: the segments, blocks and `memory_stats()` a recorded trace describes, rebuilt
//!   entry by entry (and backwards from the end state where the trace lost its start) without
//!   running the allocator: what the viewer shows at every point of a recording.
//! - [`oom_snapshots`]: a snapshot written at each out-of-memory error, through the
//!   allocator's OOM observer (`--oom-snapshot DIR` of `cachalot run` and `cachalot replay`).
//! - [`input`]: an input file read whole within the size limit every reader applies
//!   (`CACHALOT_MAX_INPUT_BYTES`).
//! - [`explain`]: why a request of a recorded job ran out of memory, read off the replayed
//!   allocator at that request, and the smallest change that lets the job through, proven by
//!   replays (`cachalot explain`).
//! - [`output`]: an output file written whole or not at all (a temporary file beside it,
//!   renamed into place), so a failed write never leaves a truncated file.
//! - [`tune`]: which `PYTORCH_CUDA_ALLOC_CONF` a recorded job needs, found by replaying its
//!   trace under candidate settings in parallel (`cachalot tune`), and the same job under
//!   cachalot's own policy beside them.
//!
//! ```
//! use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
//! use cachalot_trace::Snapshot;
//!
//! let mut allocator = CachingAllocator::new(SimBackend::new(80 << 30), AllocatorConfig::default())?;
//! allocator.record_history(true, usize::MAX, &[], false);
//! let x = allocator.malloc(3 << 20, StreamId::DEFAULT)?;
//! allocator.free(x)?;
//! let snapshot = Snapshot::capture(&allocator, "example");
//! assert_eq!(Snapshot::from_json(&snapshot.to_json())?, snapshot);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

pub mod explain;
pub mod input;
pub mod normalized;
pub mod oom_snapshots;
pub mod ops;
pub mod output;
pub mod pool_calls;
pub mod rebuild;
pub mod replay;
pub mod snapshot;
pub mod tune;

pub use snapshot::Snapshot;
