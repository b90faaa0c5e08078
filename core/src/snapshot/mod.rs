//! Snapshots: the one exchange format between the allocator, the command line and the viewer.
//!
//! - [`torch`]: PyTorch's snapshot (`torch.cuda.memory._snapshot()`), typed.
//! - [`pickle`]: reading and writing PyTorch's snapshot pickles.

pub mod pickle;
pub mod torch;
