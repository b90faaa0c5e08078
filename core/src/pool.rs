//! The names of private pools (`torch.cuda.MemPool`, CUDA-graph pools) and which requests a pool
//! serves while allocations are routed to it; the pools themselves are the allocator's
//! (`allocator/private.rs`).

use crate::backend::StreamId;

/// The id of a private pool, PyTorch's `MempoolId_t`: `(0, n)` for the n-th `MemPool`, `(n, 0)`
/// for a graph's pool (`graph_pool_handle()`); `(0, 0)` names the default pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PoolId(pub u64, pub u64);

impl PoolId {
    /// `(0, 0)`: the default small and large pools.
    pub const DEFAULT: PoolId = PoolId(0, 0);

    /// Whether this names the default pools.
    pub fn is_default(self) -> bool {
        self == PoolId::DEFAULT
    }

    /// [`PoolId::is_default`] by reference (for serde's `skip_serializing_if`).
    pub fn is_default_ref(&self) -> bool {
        self.is_default()
    }
}

impl std::fmt::Display for PoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({}, {})", self.0, self.1)
    }
}

/// Which requests a pool serves while allocations are routed to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolFilter {
    /// Every request (`use_mem_pool`, whose filter is the calling thread: one allocator is
    /// driven by one thread at a time).
    AllStreams,
    /// Requests on one stream (a CUDA graph capture on that stream).
    Stream(StreamId),
    /// The requests its caller says the pool accepts, naming the pool before each request with
    /// `CachingAllocator::set_caller_route`: for filters only the caller can evaluate, such as
    /// PyTorch's own through the plug-in (the thread inside `use_mem_pool`, the streams of one
    /// graph capture, side streams joined to it included).
    Caller,
}

impl PoolFilter {
    pub(crate) fn accepts(self, stream: StreamId) -> bool {
        match self {
            PoolFilter::AllStreams => true,
            PoolFilter::Stream(s) => s == stream,
            PoolFilter::Caller => false,
        }
    }
}
