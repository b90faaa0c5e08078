//! `CachingAllocator`: one owner of all state for one device, with PyTorch 2.11's policy.
//!
//! The policy is split by concept: `malloc` (best fit, splitting, new segments), `chain` (the
//! out-of-memory retry chain written once: applied by the malloc, and walked over a model of
//! the device for the replay's questions about a malloc), `free` (two-step frees, merging,
//! cross-stream events), `release` (empty_cache, oversize release, garbage collection),
//! `expandable` (VA reservations and page mapping), `private` (`MemPool` and CUDA-graph pools),
//! `checkpoint` (a private pool's checkpoint and its restore, for CUDA-graph trees), `policy`
//! (the decisions a placement policy makes, PyTorch's and `policy:cachalot`'s, behind one
//! trait) and `inspect` (snapshots and the consistency check); `object` is the
//! [`Allocator`] trait that code not generic over the backend holds as `&dyn Allocator`;
//! `devices` keeps one allocator per device. Every state change goes through these paths,
//! which update the stats and record the trace entry PyTorch would record.

mod chain;
mod checkpoint;
mod devices;
mod expandable;
mod free;
mod inspect;
mod malloc;
mod object;
mod observer;
mod policy;
mod private;
mod release;

use std::collections::{BTreeMap, VecDeque};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::backend::{Backend, DeviceFacts, StreamId};
use crate::block::{Block, Blocks, Location, NIL, Segment, Slab};
use crate::config::{AllocatorBackendKind, AllocatorConfig};
use crate::error::{AllocatorError, HandleError};
use crate::size::PoolKind;
use crate::stats::{Counters, MemoryStats};
use crate::trace::{AnnotationId, ContextId, ContextTable, Frame, Mark, TraceAction, TraceEntry, TraceRecorder};
use crate::tree::{BlockTree, FreeIndex};

use crate::pool::{PoolFilter, PoolId};
pub use checkpoint::{BlockCheckpoint, PoolCheckpoint, RestoreDelta, SegmentCheckpoint};
pub use devices::DeviceAllocators;
pub use inspect::{BlockSnapshot, BlockState, SegmentSnapshot};
pub use object::Allocator;
use observer::OomObservers;
pub use observer::{DynOomObserver, OomEvent, OomObserver};
use private::{PoolSlot, PrivatePool};

/// Gives every allocator an id, so a handle from another allocator is recognised.
static NEXT_ALLOCATOR_ID: AtomicU32 = AtomicU32::new(1);

/// A live allocation: a small `Copy` handle (block index and generation) plus what the caller
/// needs to use the memory. Freeing it twice, or freeing it on another allocator, is an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Allocation {
    /// Non-zero, so that `Option<Allocation>` (a handle table's slot) is no larger than the
    /// handle itself.
    allocator: NonZeroU32,
    block: u32,
    generation: u32,
    stream: StreamId,
    address: u64,
    size: u64,
    requested: u64,
}

const _: () = assert!(
    std::mem::size_of::<Option<Allocation>>() == std::mem::size_of::<Allocation>(),
    "an empty handle slot costs nothing extra"
);

impl Allocation {
    /// The device address of the block (for the wgpu backend, an address in its own space).
    pub fn address(&self) -> u64 {
        self.address
    }

    /// The block size: the request rounded up, plus any unsplit slack.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The size the caller asked for.
    pub fn requested_size(&self) -> u64 {
        self.requested
    }

    /// The stream the block was allocated on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Whether this is the handle of a zero-byte request (no block, nothing to free).
    pub fn is_empty(&self) -> bool {
        self.block == NIL
    }
}

/// One pool: its free blocks ordered for best fit, its unmapped VA ordered by address, and the
/// garbage collector's clock.
#[derive(Clone, Debug)]
pub(crate) struct BlockPool {
    pub free: FreeIndex,
    pub unmapped: BlockTree,
    pub free_blocks_call_count: i64,
}

impl BlockPool {
    pub(crate) fn new() -> Self {
        BlockPool { free: FreeIndex::default(), unmapped: BlockTree::new(), free_blocks_call_count: 0 }
    }
}

/// PyTorch's CUDA caching allocator for one device, over any [`Backend`].
///
/// ```
/// use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
/// let mut allocator = CachingAllocator::new(SimBackend::new(80 << 30), AllocatorConfig::default())?;
/// let x = allocator.malloc(4, StreamId::DEFAULT)?;
/// assert_eq!(allocator.memory_allocated(), 512);
/// assert_eq!(allocator.memory_reserved(), 2 << 20);
/// allocator.free(x)?;
/// allocator.empty_cache()?;
/// assert_eq!(allocator.memory_reserved(), 0);
/// # Ok::<(), cachalot_core::AllocatorError>(())
/// ```
pub struct CachingAllocator<B: Backend> {
    id: NonZeroU32,
    backend: B,
    config: AllocatorConfig,
    blocks: Blocks,
    segments: Slab<Segment>,
    small: BlockPool,
    large: BlockPool,
    /// Private pools (`private.rs`), by slot; a segment names its pool's slot.
    private: Slab<PrivatePool>,
    /// The slot of each private pool, by id (ordered: freeable pools are released in id order).
    private_ids: BTreeMap<PoolId, PoolSlot>,
    /// Pools allocations are routed to now, oldest first (PyTorch's `captures_underway`).
    routing: Vec<(PoolId, PoolSlot, PoolFilter)>,
    /// The pool a [`PoolFilter::Caller`] filter accepts the next requests for, as the caller
    /// said (`set_caller_route`).
    caller_route: Option<PoolId>,
    /// Blocks freed with uses on other streams while allocations were routed to a pool: their
    /// events are recorded once no pool is routed to (PyTorch's
    /// `needs_events_deferred_until_no_capture`: an event recorded during a graph capture must
    /// not be queried).
    deferred_frees: Vec<u32>,
    /// Outstanding cross-stream events, one FIFO per stream (PyTorch's `cuda_events`).
    events: BTreeMap<StreamId, VecDeque<(B::Event, u32)>>,
    stats: Counters,
    /// Bytes obtained from the device (segments and mapped pages), all pools.
    total_allocated_memory: u64,
    /// The memory-fraction allowance, when a fraction below 1 is set.
    allowed_memory_maximum: Option<u64>,
    recorder: TraceRecorder,
    contexts: ContextTable,
    marks: Vec<Mark>,
    current_context: Option<ContextId>,
    current_annotation: Option<AnnotationId>,
    /// The device limit named by the last refused device allocation, for the OOM message.
    last_device_limit: Option<String>,
    /// Whether a stack was ever set: until then blocks carry none and nothing is written.
    contexts_used: bool,
    /// Whether the garbage collector's clock ever ticked: until then every block's insertion
    /// time is 0, which the cold parts already hold.
    gc_clock_started: bool,
    /// Callbacks called at out-of-memory errors (`observer.rs`).
    oom_observers: OomObservers<B>,
    /// The vectors a policy's give-backs before a miss fill (`policy:cachalot`'s rule 4, at
    /// each miss at the peak), kept between misses so that it allocates nothing once warm.
    give_back_scratch: policy::GiveBacks,
    /// What `policy:cachalot`'s rule 7 knows of the job: whether a miss met rule 4's peak, and
    /// what later misses still gave back (`policy/cachalot.rs`). Kept under every policy, read
    /// only by rule 7.
    settling: policy::Settling,
}

impl<B: Backend> CachingAllocator<B> {
    /// An empty allocator over `backend`.
    ///
    /// Fails if the configuration selects `backend:cudaMallocAsync` (a different allocator) or
    /// expandable segments on a backend that cannot map pages.
    pub fn new(backend: B, config: AllocatorConfig) -> Result<Self, AllocatorError> {
        Self::check_config(&backend, &config)?;
        let max_split_size = config.max_split_size().map_or(-1, |s| s as i64);
        let mut allocator = CachingAllocator {
            // Ids start at 1; were the counter ever to wrap, 0 is skipped.
            id: NonZeroU32::new(NEXT_ALLOCATOR_ID.fetch_add(1, Ordering::Relaxed)).unwrap_or(NonZeroU32::MIN),
            backend,
            blocks: Blocks::default(),
            segments: Slab::default(),
            small: BlockPool::new(),
            large: BlockPool::new(),
            private: Slab::default(),
            private_ids: BTreeMap::new(),
            routing: Vec::new(),
            caller_route: None,
            deferred_frees: Vec::new(),
            events: BTreeMap::new(),
            stats: Counters::new(max_split_size),
            total_allocated_memory: 0,
            allowed_memory_maximum: None,
            recorder: TraceRecorder::default(),
            contexts: ContextTable::default(),
            marks: Vec::new(),
            current_context: None,
            current_annotation: None,
            last_device_limit: None,
            contexts_used: false,
            gc_clock_started: false,
            oom_observers: OomObservers::default(),
            give_back_scratch: policy::GiveBacks::default(),
            settling: policy::Settling::default(),
            config,
        };
        allocator.set_memory_fraction(allocator.config.per_process_memory_fraction())?;
        Ok(allocator)
    }

    fn check_config(backend: &B, config: &AllocatorConfig) -> Result<(), AllocatorError> {
        if config.backend() == AllocatorBackendKind::CudaMallocAsync {
            return Err(AllocatorError::Unsupported(
                "backend:cudaMallocAsync replaces the caching allocator with CUDA's stream-ordered \
                 allocator; cachalot models the native caching allocator only"
                    .into(),
            ));
        }
        if config.expandable_segments() && !backend.device().supports_expandable_segments {
            return Err(AllocatorError::Unsupported(format!(
                "expandable_segments:True needs virtual memory mapping, which the {} backend ({}) does not offer",
                backend.device().backend,
                backend.device().name
            )));
        }
        Ok(())
    }

    /// Replaces the configuration at run time (PyTorch's `_set_allocator_settings`).
    /// Existing blocks stay; `max_split_size` in the stats keeps its construction-time value.
    pub fn set_config(&mut self, config: AllocatorConfig) -> Result<(), AllocatorError> {
        Self::check_config(&self.backend, &config)?;
        self.config = config;
        Ok(())
    }

    /// The configuration in force.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably (e.g. to drive a simulator's streams).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Facts about the device.
    pub fn device(&self) -> &DeviceFacts {
        self.backend.device()
    }

    /// `set_per_process_memory_fraction(fraction)`: below 1, device allocations stop at
    /// `round(fraction × total memory)` bytes (checked before asking the device).
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), AllocatorError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(AllocatorError::Config(crate::config::ConfigError::InvalidValue {
                key: "per_process_memory_fraction".into(),
                value: fraction.to_string(),
                reason: "invalid fraction, please set within [0, 1]".into(),
            }));
        }
        let total = self.backend.device().total_memory;
        self.allowed_memory_maximum = (fraction < 1.0).then(|| (fraction * total as f64).round() as u64);
        Ok(())
    }

    /// The memory fraction in force (1.0 when unlimited).
    pub fn memory_fraction(&self) -> f64 {
        match self.allowed_memory_maximum {
            Some(allowed) => allowed as f64 / self.backend.device().total_memory as f64,
            None => 1.0,
        }
    }

    /// The bytes the memory fraction allows (PyTorch's `allowed_memory_maximum`), when a
    /// fraction below 1 is set: a new segment or mapping that would take the device's total
    /// past it is refused before the device is asked.
    pub fn allowed_memory_maximum(&self) -> Option<u64> {
        self.allowed_memory_maximum
    }

    /// All counters (`memory_stats()`), computed from the live counters: a value, not a view,
    /// so it stays as it was when taken.
    pub fn stats(&self) -> MemoryStats {
        self.stats.to_stats()
    }

    /// `memory_allocated()`.
    pub fn memory_allocated(&self) -> u64 {
        self.stats.memory_allocated()
    }

    /// `memory_reserved()`.
    pub fn memory_reserved(&self) -> u64 {
        self.stats.memory_reserved()
    }

    /// `reset_peak_memory_stats()`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    /// `reset_accumulated_memory_stats()`.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// `memory_summary(abbreviated=...)` for this device.
    pub fn memory_summary(&self, abbreviated: bool) -> String {
        crate::summary::memory_summary(&self.stats.to_stats(), self.backend.device().index, abbreviated)
    }

    /// Largest free cached block (PyTorch's `cacheInfo`), private pools included, 0 when the
    /// cache is empty.
    pub fn largest_free_block(&self) -> u64 {
        [&self.small, &self.large]
            .into_iter()
            .chain(self.private.iter().flat_map(|(_, p)| [&p.small, &p.large]))
            .flat_map(|pool| pool.free.to_vec())
            .map(|id| self.blocks[id].size)
            .max()
            .unwrap_or(0)
    }

    /// Turns the history (trace) on or off: `max_entries` bounds the ring buffer (oldest
    /// entries are overwritten), `skip` lists actions not to record, `clear` drops what was
    /// recorded. Turning it off also clears it, as in PyTorch.
    pub fn record_history(&mut self, enabled: bool, max_entries: usize, skip: &[TraceAction], clear: bool) {
        self.recorder.configure(enabled, max_entries, skip, clear);
    }

    /// Whether history is being recorded.
    pub fn is_recording_history(&self) -> bool {
        self.recorder.enabled
    }

    /// The recorded trace, oldest first.
    pub fn trace(&self) -> Vec<TraceEntry> {
        self.recorder.entries()
    }

    /// The recorded entries from number `from` on (counted as [`CachingAllocator::trace_len_total`]
    /// counts), oldest first: a watcher that has seen `from` entries asks for the rest without the
    /// whole history being copied. Entries the ring buffer overwrote are not returned.
    pub fn trace_since(&self, from: u64) -> Vec<TraceEntry> {
        self.recorder.entries_since(from)
    }

    /// Entries recorded since history was first enabled, including ones the ring overwrote.
    pub fn trace_len_total(&self) -> u64 {
        self.recorder.recorded
    }

    /// Interned stacks and annotations referenced by trace entries and blocks.
    pub fn contexts(&self) -> &ContextTable {
        &self.contexts
    }

    /// Interns a stack for use with [`CachingAllocator::set_context`].
    pub fn intern_context(&mut self, frames: &[Frame]) -> ContextId {
        self.contexts.intern(frames)
    }

    /// The stack that following calls are made from (recorded in trace entries and in blocks);
    /// `None` lets frees report the stack of the allocation instead, as PyTorch does.
    ///
    /// This is how a library user's own call sites reach the viewer (its Memory view groups
    /// live memory by these stacks) and PyTorch's tools (the pickle keeps them as frames): intern
    /// each stack once, innermost frame first, and set it around the calls it explains.
    ///
    /// ```
    /// use cachalot_core::{AllocatorConfig, CachingAllocator, Frame, SimBackend, StreamId};
    /// let mut allocator = CachingAllocator::new(SimBackend::new(80 << 30), AllocatorConfig::default())?;
    /// allocator.record_history(true, usize::MAX, &[], false);
    /// let frame = |name: &str, line| Frame { filename: "model.rs".into(), line, name: name.into() };
    /// let attention = allocator.intern_context(&[frame("attention", 42), frame("forward", 7)]);
    ///
    /// allocator.set_context(Some(attention));
    /// let scores = allocator.malloc(64 << 20, StreamId::DEFAULT)?;
    /// allocator.set_context(None);
    ///
    /// let alloc = allocator.trace()[1]; // after its segment_alloc
    /// let stack = allocator.contexts().frames(alloc.context.expect("recorded"));
    /// assert_eq!((&*stack[0].name, stack[0].line), ("attention", 42));
    /// allocator.free(scores)?; // the free reports the allocation's stack
    /// assert_eq!(allocator.trace()[2].context, Some(attention));
    /// # Ok::<(), cachalot_core::AllocatorError>(())
    /// ```
    pub fn set_context(&mut self, context: Option<ContextId>) {
        self.contexts_used |= context.is_some();
        self.current_context = context;
    }

    /// Replaces the table of stacks and annotations, e.g. with the one of a snapshot being
    /// replayed, so that its [`ContextId`]s can be used directly. Only allowed while the table is
    /// still empty; returns whether it was replaced.
    pub fn adopt_contexts(&mut self, table: ContextTable) -> bool {
        if !self.contexts.stacks().is_empty() || !self.contexts.annotations().is_empty() {
            return false;
        }
        self.contexts = table;
        self.contexts_used = true;
        true
    }

    /// Sets the annotation of following trace entries by id (see [`CachingAllocator::adopt_contexts`]).
    pub fn set_annotation_id(&mut self, annotation: Option<AnnotationId>) {
        self.current_annotation = annotation;
    }

    /// `compile_context` and `user_metadata` for following trace entries.
    pub fn set_annotation(&mut self, compile_context: &str, user_metadata: &str) {
        self.current_annotation = self.contexts.intern_annotation(compile_context, user_metadata);
    }

    /// Records a labelled mark with the current `memory_allocated()` / `memory_reserved()`.
    pub fn mark(&mut self, label: impl Into<String>) {
        let time_us = self.backend.now_us();
        self.marks.push(Mark {
            label: label.into(),
            trace_index: self.recorder.recorded,
            allocated: self.memory_allocated(),
            reserved: self.memory_reserved(),
            time_us,
        });
    }

    /// The marks recorded so far.
    pub fn marks(&self) -> &[Mark] {
        &self.marks
    }

    /// Validates a handle and returns its block, which is allocated.
    fn live_block(&self, allocation: &Allocation) -> Result<u32, HandleError> {
        let address = allocation.address;
        if allocation.allocator != self.id {
            return Err(HandleError::Foreign { address });
        }
        match self.blocks.get(allocation.block) {
            Some(b) if b.generation == allocation.generation && b.allocated => Ok(allocation.block),
            Some(b) if b.generation == allocation.generation => Err(HandleError::DoubleFree { address }),
            _ => Err(HandleError::Stale { address }),
        }
    }

    // ---- small shared helpers: pools, trace, stats ----

    #[inline]
    fn gc_enabled(&self) -> bool {
        self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold() > 0.0
    }

    /// The block pool of `kind` in the pool of `slot` (the default pools for [`NIL`]).
    #[inline]
    fn pool(&self, slot: PoolSlot, kind: PoolKind) -> &BlockPool {
        match (slot, kind) {
            (NIL, PoolKind::Small) => &self.small,
            (NIL, PoolKind::Large) => &self.large,
            (slot, kind) => self.private[slot].pool(kind),
        }
    }

    /// The slot of the pool block `id` belongs to: its segment's. Without private pools (the
    /// common case) the segment is not looked at.
    #[inline]
    fn slot_of(&self, id: u32) -> PoolSlot {
        if self.private.len() == 0 { NIL } else { self.segments[self.blocks[id].segment].private }
    }

    /// Puts a free mapped block into its pool's best-fit set (`insert_into_blocks`).
    ///
    /// Never inlined, and the free index's filing always inlined into it (`tree.rs`), as with
    /// `remove_free`: one call per update of the set. The compiler's own choice (this inlined
    /// into its callers, the filing called from it) moved with unrelated changes, and cost
    /// 1-3% more instructions per op on eight of the eleven op files under both policies;
    /// steady-1MiB, whose pairs never file a block, pays for the call instead (3.5% more), as
    /// do trace-multistream and trace-seeds (1-1.5%).
    #[inline(never)]
    fn insert_free(&mut self, id: u32) {
        let (slot, kind) = (self.slot_of(id), self.blocks[id].pool);
        let pool = pool_mut(&mut self.small, &mut self.large, &mut self.private, slot, kind);
        if self.gc_clock_started {
            self.blocks.cold_mut(id).gc_count_base = pool.free_blocks_call_count;
        }
        self.blocks[id].location = Location::Free;
        pool.free.insert(&self.blocks, id);
    }

    /// Takes a free mapped block out of its pool's best-fit set; never inlined, as
    /// `insert_free`.
    #[inline(never)]
    fn remove_free(&mut self, id: u32) {
        let (slot, kind) = (self.slot_of(id), self.blocks[id].pool);
        pool_mut(&mut self.small, &mut self.large, &mut self.private, slot, kind).free.remove(&self.blocks, id);
        self.blocks[id].location = Location::Detached;
    }

    fn insert_unmapped(&mut self, id: u32) {
        let (slot, kind) = (self.slot_of(id), self.blocks[id].pool);
        self.blocks[id].location = Location::Unmapped;
        pool_mut(&mut self.small, &mut self.large, &mut self.private, slot, kind).unmapped.insert(&mut self.blocks, id);
    }

    fn remove_unmapped(&mut self, id: u32) {
        let (slot, kind) = (self.slot_of(id), self.blocks[id].pool);
        pool_mut(&mut self.small, &mut self.large, &mut self.private, slot, kind).unmapped.remove(&mut self.blocks, id);
        self.blocks[id].location = Location::Detached;
    }

    /// Links `id` between `before` and `after` (PyTorch's `Block::splice`), keeping the
    /// segment's head current.
    #[inline]
    fn splice(&mut self, id: u32, before: u32, after: u32) {
        if before != NIL {
            self.blocks[before].next = id;
        } else {
            let segment = self.blocks[id].segment;
            self.segments[segment].head = id;
        }
        self.blocks[id].prev = before;
        if after != NIL {
            self.blocks[after].prev = id;
        }
        self.blocks[id].next = after;
    }

    /// A new block in the same segment and pool as `like`.
    fn sibling(&self, like: u32, ptr: u64, size: u64) -> Block {
        let b = &self.blocks[like];
        let mut block = Block::new(ptr, size, b.stream, b.pool, b.segment);
        block.expandable = b.expandable;
        block
    }

    #[inline]
    fn record(&mut self, action: TraceAction, addr: u64, size: u64, stream: StreamId, context: Option<ContextId>) {
        if !self.recorder.enabled {
            return;
        }
        let time_us = self.backend.now_us();
        self.recorder.record(TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us,
            context,
            annotation: self.current_annotation,
        });
    }

    #[inline]
    fn is_oversize(&self, size: u64) -> bool {
        size >= self.config.max_split_size_raw()
    }
}

/// The block pool of `kind` in the pool of `slot` (the default pools for [`NIL`]), from the
/// allocator's fields, so that its blocks can be borrowed beside it.
#[inline]
fn pool_mut<'a>(
    small: &'a mut BlockPool,
    large: &'a mut BlockPool,
    private: &'a mut Slab<PrivatePool>,
    slot: PoolSlot,
    kind: PoolKind,
) -> &'a mut BlockPool {
    match (slot, kind) {
        (NIL, PoolKind::Small) => small,
        (NIL, PoolKind::Large) => large,
        (slot, kind) => private[slot].pool_mut(kind),
    }
}

/// A copy of the whole state (used, for example, to try an operation without committing it).
/// The copy keeps the handle id, so allocations of one are accepted by the other.
impl<B: Backend + Clone> Clone for CachingAllocator<B>
where
    B::Event: Clone,
{
    fn clone(&self) -> Self {
        // The deciding state as a trial copies it, plus what grows with the run.
        let mut copy = self.trial_copy(self.backend.clone());
        copy.recorder = self.recorder.clone();
        copy.contexts = self.contexts.clone();
        copy.marks = self.marks.clone();
        copy.oom_observers = self.oom_observers.clone();
        copy
    }
}

impl<B: Backend> CachingAllocator<B>
where
    B::Event: Clone,
{
    /// A copy of the state that decides what the allocator does (blocks, segments, pools,
    /// events, stats, configuration) over `backend`, for trying an operation without
    /// committing it. Unlike [`Clone`], it leaves out what only grows with the run's length
    /// and decides nothing: the history (off in the copy), the stack table, the marks and the
    /// out-of-memory observers, so a trial costs the live state, not the whole run.
    pub fn trial_copy(&self, backend: B) -> Self {
        CachingAllocator {
            id: self.id,
            backend,
            config: self.config.clone(),
            blocks: self.blocks.clone(),
            segments: self.segments.clone(),
            small: self.small.clone(),
            large: self.large.clone(),
            private: self.private.clone(),
            private_ids: self.private_ids.clone(),
            routing: self.routing.clone(),
            caller_route: self.caller_route,
            deferred_frees: self.deferred_frees.clone(),
            events: self.events.clone(),
            stats: self.stats.clone(),
            total_allocated_memory: self.total_allocated_memory,
            allowed_memory_maximum: self.allowed_memory_maximum,
            recorder: TraceRecorder::default(),
            contexts: ContextTable::default(),
            marks: Vec::new(),
            current_context: self.current_context,
            current_annotation: self.current_annotation,
            last_device_limit: self.last_device_limit.clone(),
            contexts_used: self.contexts_used,
            gc_clock_started: self.gc_clock_started,
            oom_observers: OomObservers::default(),
            give_back_scratch: policy::GiveBacks::default(),
            settling: self.settling.clone(),
        }
    }
}

impl<B: Backend> std::fmt::Debug for CachingAllocator<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("device", &self.backend.device().name)
            .field("allocated", &self.memory_allocated())
            .field("reserved", &self.memory_reserved())
            .field("segments", &self.segments.len())
            .field("blocks", &self.blocks.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The allocator moves between threads (behind `SharedAllocator`, or owned by one thread
    /// at a time) whenever its backend can.
    #[test]
    fn allocator_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<CachingAllocator<crate::SimBackend>>();
        assert_send::<crate::SharedAllocator<crate::SimBackend>>();
        fn assert_sync<T: Sync>() {}
        assert_sync::<crate::SharedAllocator<crate::SimBackend>>();
    }
}
