//! Snapshots: the one exchange format between the allocator, the command line and the viewer.
//!
//! - [`file`]: cachalot's own snapshot file (JSON).
//! - [`torch`]: PyTorch's snapshot (`torch.cuda.memory._snapshot()`), typed.
//! - [`pickle`]: reading and writing PyTorch's snapshot pickles.

pub mod file;
pub mod pickle;
pub mod torch;

pub use file::{Snapshot, SnapshotFileError, Timing};
