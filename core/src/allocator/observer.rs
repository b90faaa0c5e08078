//! Out-of-memory observers: callbacks the allocator calls when a request fails for want of
//! memory, before the error is returned, as PyTorch's
//! `torch._C._cuda_attach_out_of_memory_observer` does (`docs/allocator-rules.md`).

use std::sync::Arc;

use super::CachingAllocator;
use crate::backend::Backend;

/// What an out-of-memory observer is told (PyTorch passes the same four numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomEvent {
    /// The device's index.
    pub device: u32,
    /// Bytes the failing request asked the device for (PyTorch's `alloc_size`: the rounded
    /// request, or the whole segment it needed).
    pub requested: u64,
    /// Free memory the device reported.
    pub device_free: u64,
    /// The device's total memory.
    pub device_total: u64,
    /// The memory-fraction allowance, where a fraction below 1 is set (PyTorch passes it in
    /// place of the device total then).
    pub allowed: Option<u64>,
}

/// An out-of-memory observer: called with the event and the allocator as the error left it
/// (its snapshot, trace and stats show the state that ran out), before the error returns.
pub type OomObserver<B> = Arc<dyn Fn(&OomEvent, &CachingAllocator<B>) + Send + Sync>;

/// An out-of-memory observer for code that does not know the backend
/// ([`CachingAllocator::attach_dyn_oom_observer`]): it sees the allocator as a trait object.
pub type DynOomObserver = Arc<dyn Fn(&OomEvent, &dyn super::Allocator) + Send + Sync>;

/// The observers of one allocator, in the order they were attached.
pub(crate) struct OomObservers<B: Backend>(Vec<OomObserver<B>>);

impl<B: Backend> Default for OomObservers<B> {
    fn default() -> Self {
        OomObservers(Vec::new())
    }
}

impl<B: Backend> Clone for OomObservers<B> {
    fn clone(&self) -> Self {
        OomObservers(self.0.clone())
    }
}

impl<B: Backend> CachingAllocator<B> {
    /// Attaches `observer`, called at every out-of-memory error from now on, after the
    /// allocator has recorded the `oom` trace entry and counted it and before the error is
    /// returned. A copy of the allocator (`Clone`) keeps the observers.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
    ///
    /// let mut allocator = CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default())?;
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = Arc::clone(&seen);
    /// allocator.attach_oom_observer(Arc::new(move |event, allocator| {
    ///     log.lock().unwrap().push((event.requested, event.device_free, allocator.memory_reserved()));
    /// }));
    /// assert!(allocator.malloc(2 << 30, StreamId::DEFAULT).is_err());
    /// assert_eq!(*seen.lock().unwrap(), vec![(2 << 30, 1 << 30, 0)]);
    /// # Ok::<(), cachalot_core::AllocatorError>(())
    /// ```
    pub fn attach_oom_observer(&mut self, observer: OomObserver<B>) {
        self.oom_observers.0.push(observer);
    }

    /// [`CachingAllocator::attach_oom_observer`] for code that does not know the backend: the
    /// observer sees the allocator as a trait object ([`super::Allocator`]).
    pub fn attach_dyn_oom_observer(&mut self, observer: DynOomObserver)
    where
        B: 'static,
    {
        self.attach_oom_observer(Arc::new(move |event, allocator: &CachingAllocator<B>| observer(event, allocator)));
    }

    /// Detaches every observer (a copy made to try something out should not report).
    pub fn detach_oom_observers(&mut self) {
        self.oom_observers.0.clear();
    }

    /// Calls every observer with `event`.
    pub(super) fn notify_oom_observers(&self, event: &OomEvent) {
        // A copy of the list: an observer holds the allocator only to read it.
        for observer in self.oom_observers.0.clone() {
            observer(event, self);
        }
    }
}
