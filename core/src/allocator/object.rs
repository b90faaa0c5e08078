//! [`Allocator`]: the caching allocator as a trait object.
//!
//! `CachingAllocator<B>` is generic over its backend so that the hot path is monomorphised.
//! Code that must not be generic over the backend — the runtime holds one device chosen at run
//! time, snapshot capture serves every backend — holds a `&dyn Allocator` (or `&mut`) instead.
//! The trait forwards to the inherent methods, which stay the fast path: a caller that knows
//! `B` calls `CachingAllocator::malloc` directly, with no dynamic dispatch.

use crate::backend::{Backend, DeviceFacts, StreamId};
use crate::error::AllocatorError;
use crate::stats::MemoryStats;
use crate::trace::{ContextId, ContextTable, Frame, Mark, TraceAction, TraceEntry};

use super::{Allocation, CachingAllocator, SegmentSnapshot};

/// The calls of [`CachingAllocator`] that code not generic over the backend needs, object
/// safe, implemented for every `CachingAllocator<B>` (see the module docs). Each method is the
/// inherent method of the same name.
pub trait Allocator {
    /// [`CachingAllocator::malloc`].
    fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Allocation, AllocatorError>;
    /// [`CachingAllocator::free`].
    fn free(&mut self, allocation: Allocation) -> Result<(), AllocatorError>;
    /// [`CachingAllocator::record_stream`].
    fn record_stream(&mut self, allocation: &Allocation, stream: StreamId) -> Result<(), AllocatorError>;
    /// [`CachingAllocator::empty_cache`].
    fn empty_cache(&mut self) -> Result<(), AllocatorError>;
    /// [`CachingAllocator::process_events`].
    fn process_events(&mut self) -> Result<(), AllocatorError>;
    /// [`CachingAllocator::memory_allocated`].
    fn memory_allocated(&self) -> u64;
    /// [`CachingAllocator::memory_reserved`].
    fn memory_reserved(&self) -> u64;
    /// [`CachingAllocator::stats`].
    fn stats(&self) -> MemoryStats;
    /// [`CachingAllocator::memory_summary`].
    fn memory_summary(&self, abbreviated: bool) -> String;
    /// [`CachingAllocator::device`].
    fn device(&self) -> &DeviceFacts;
    /// The configuration string in force (`AllocatorConfig::settings`).
    fn settings(&self) -> &str;
    /// [`CachingAllocator::memory_fraction`].
    fn memory_fraction(&self) -> f64;
    /// [`CachingAllocator::snapshot`]: the segments and their blocks.
    fn snapshot(&self) -> Vec<SegmentSnapshot>;
    /// [`CachingAllocator::record_history`].
    fn record_history(&mut self, enabled: bool, max_entries: usize, skip: &[TraceAction], clear: bool);
    /// [`CachingAllocator::is_recording_history`].
    fn is_recording_history(&self) -> bool;
    /// [`CachingAllocator::trace`].
    fn trace(&self) -> Vec<TraceEntry>;
    /// [`CachingAllocator::trace_len_total`].
    fn trace_len_total(&self) -> u64;
    /// [`CachingAllocator::trace_since`].
    fn trace_since(&self, from: u64) -> Vec<TraceEntry>;
    /// [`CachingAllocator::contexts`].
    fn contexts(&self) -> &ContextTable;
    /// [`CachingAllocator::intern_context`].
    fn intern_context(&mut self, frames: &[Frame]) -> ContextId;
    /// [`CachingAllocator::set_context`].
    fn set_context(&mut self, context: Option<ContextId>);
    /// [`CachingAllocator::mark`].
    fn mark(&mut self, label: String);
    /// [`CachingAllocator::marks`].
    fn marks(&self) -> &[Mark];
    /// [`CachingAllocator::check_consistency`].
    fn check_consistency(&self) -> Result<(), String>;
}

impl<B: Backend> Allocator for CachingAllocator<B> {
    fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Allocation, AllocatorError> {
        CachingAllocator::malloc(self, size, stream)
    }
    fn free(&mut self, allocation: Allocation) -> Result<(), AllocatorError> {
        CachingAllocator::free(self, allocation)
    }
    fn record_stream(&mut self, allocation: &Allocation, stream: StreamId) -> Result<(), AllocatorError> {
        CachingAllocator::record_stream(self, allocation, stream)
    }
    fn empty_cache(&mut self) -> Result<(), AllocatorError> {
        CachingAllocator::empty_cache(self)
    }
    fn process_events(&mut self) -> Result<(), AllocatorError> {
        CachingAllocator::process_events(self)
    }
    fn memory_allocated(&self) -> u64 {
        CachingAllocator::memory_allocated(self)
    }
    fn memory_reserved(&self) -> u64 {
        CachingAllocator::memory_reserved(self)
    }
    fn stats(&self) -> MemoryStats {
        CachingAllocator::stats(self)
    }
    fn memory_summary(&self, abbreviated: bool) -> String {
        CachingAllocator::memory_summary(self, abbreviated)
    }
    fn device(&self) -> &DeviceFacts {
        CachingAllocator::device(self)
    }
    fn settings(&self) -> &str {
        self.config().settings()
    }
    fn memory_fraction(&self) -> f64 {
        CachingAllocator::memory_fraction(self)
    }
    fn snapshot(&self) -> Vec<SegmentSnapshot> {
        CachingAllocator::snapshot(self)
    }
    fn record_history(&mut self, enabled: bool, max_entries: usize, skip: &[TraceAction], clear: bool) {
        CachingAllocator::record_history(self, enabled, max_entries, skip, clear)
    }
    fn is_recording_history(&self) -> bool {
        CachingAllocator::is_recording_history(self)
    }
    fn trace(&self) -> Vec<TraceEntry> {
        CachingAllocator::trace(self)
    }
    fn trace_len_total(&self) -> u64 {
        CachingAllocator::trace_len_total(self)
    }
    fn trace_since(&self, from: u64) -> Vec<TraceEntry> {
        CachingAllocator::trace_since(self, from)
    }
    fn contexts(&self) -> &ContextTable {
        CachingAllocator::contexts(self)
    }
    fn intern_context(&mut self, frames: &[Frame]) -> ContextId {
        CachingAllocator::intern_context(self, frames)
    }
    fn set_context(&mut self, context: Option<ContextId>) {
        CachingAllocator::set_context(self, context)
    }
    fn mark(&mut self, label: String) {
        CachingAllocator::mark(self, label)
    }
    fn marks(&self) -> &[Mark] {
        CachingAllocator::marks(self)
    }
    fn check_consistency(&self) -> Result<(), String> {
        CachingAllocator::check_consistency(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AllocatorConfig, SimBackend};

    /// The runtime's use: an allocator of a backend chosen at run time, behind `&mut dyn`.
    #[test]
    fn a_dyn_allocator_is_the_allocator_it_wraps() {
        let mut concrete = CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default()).unwrap();
        let allocator: &mut dyn Allocator = &mut concrete;
        allocator.record_history(true, usize::MAX, &[], false);
        let stack = allocator.intern_context(&[Frame { filename: "t.py".into(), line: 1, name: "f".into() }]);
        allocator.set_context(Some(stack));
        let x = allocator.malloc(3 << 20, StreamId::DEFAULT).unwrap();
        allocator.mark("after x".into());
        assert_eq!(allocator.memory_allocated(), 3 << 20);
        assert_eq!(allocator.marks()[0].allocated, 3 << 20);
        allocator.free(x).unwrap();
        allocator.process_events().unwrap();
        allocator.empty_cache().unwrap();
        assert_eq!(allocator.memory_reserved(), 0);
        assert_eq!(allocator.trace().len() as u64, allocator.trace_len_total());
        assert!(allocator.is_recording_history());
        assert_eq!(allocator.contexts().stacks().len(), 1);
        assert!(allocator.snapshot().is_empty());
        assert_eq!(allocator.memory_fraction(), 1.0);
        allocator.check_consistency().unwrap();
        let settings = allocator.settings().to_owned();
        assert_eq!(settings, concrete.config().settings());
    }
}
