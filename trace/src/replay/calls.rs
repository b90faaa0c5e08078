//! The allocator calls a replay makes, pushed as it makes them to a [`CallSink`] (as ripgrep's
//! searcher pushes matches to its `Sink`): a `Vec<ReplayCall>` records them, to be made again on
//! a device (`cachalot replay --backend wgpu`); [`NoCalls`] drops them, so that a replay that
//! only checks or tunes pays nothing for them; a test's sink may check them as they come.

use cachalot_core::backend::StreamId;

use crate::pool_calls::PoolCall;

/// One call the replay made to the allocator: what the recorded program did, without the
/// simulator's help (planned addresses, the driver's free memory at a recorded OOM), so that
/// another backend can make the same calls. Allocations are named by the index of the trace
/// entry that made them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayCall {
    /// `malloc(size, stream)` for trace entry `index` (an `alloc`, or an `oom` entry: PyTorch's
    /// request failed there, which a larger device may serve).
    Malloc {
        /// The trace entry.
        index: usize,
        /// Bytes requested.
        size: u64,
        /// The stream of the request.
        stream: StreamId,
        /// Whether PyTorch ran out of memory here (an `oom` entry).
        recorded_oom: bool,
    },
    /// `free` of the allocation made at trace entry `malloc`, requested at trace entry `index`;
    /// `deferred` when the block was used on another stream (`record_stream`), so that the free
    /// completed later (at a `free_completed` entry) or never.
    Free {
        /// The `free_requested` entry.
        index: usize,
        /// The entry whose `Malloc` made the allocation.
        malloc: usize,
        /// Whether the free waits for another stream.
        deferred: bool,
    },
    /// The other stream's work on the block of the deferred free requested at trace entry
    /// `free` ended here (trace entry `index`, its `free_completed`): the free completes at the
    /// allocator's next call. Always before the [`ReplayCall::EmptyCache`] whose synchronization
    /// completed it. A deferred free without one never completed in the recording.
    FreeCompleted {
        /// The `free_completed` entry.
        index: usize,
        /// The `free_requested` entry of the free.
        free: usize,
    },
    /// `empty_cache()`, before trace entry `index`.
    EmptyCache {
        /// The trace entry it precedes.
        index: usize,
    },
    /// A private-pool call, before trace entry `index` ([`PoolCall::perform`] makes it).
    Pool {
        /// The trace entry it precedes.
        index: usize,
        /// The call.
        call: PoolCall,
    },
}

/// What a replay pushes its [`ReplayCall`]s to, in the order it makes them
/// ([`super::replay_with_sink`]).
pub trait CallSink {
    /// The replay made `call`.
    fn call(&mut self, call: ReplayCall);
}

/// Records every call.
impl CallSink for Vec<ReplayCall> {
    fn call(&mut self, call: ReplayCall) {
        self.push(call);
    }
}

impl<S: CallSink + ?Sized> CallSink for &mut S {
    fn call(&mut self, call: ReplayCall) {
        (**self).call(call);
    }
}

/// A sink that drops every call: a replay for its end state, its check or its peaks.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCalls;

impl CallSink for NoCalls {
    fn call(&mut self, _call: ReplayCall) {}
}
