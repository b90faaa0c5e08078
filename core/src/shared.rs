//! `SharedAllocator`: the allocator behind a mutex, for use from several threads (PyTorch takes
//! one lock per device around every allocator call, which is what this does).

use std::sync::{Arc, Mutex, MutexGuard};

use crate::allocator::{Allocation, CachingAllocator};
use crate::backend::{Backend, StreamId};
use crate::error::AllocatorError;

/// A cloneable, thread-safe handle to one [`CachingAllocator`].
///
/// ```
/// use cachalot_core::{AllocatorConfig, CachingAllocator, SharedAllocator, SimBackend, StreamId};
/// let shared = SharedAllocator::new(CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default())?);
/// let worker = shared.clone();
/// std::thread::spawn(move || {
///     let a = worker.malloc(1 << 20, StreamId::DEFAULT).unwrap();
///     worker.free(a).unwrap();
/// })
/// .join()
/// .unwrap();
/// assert_eq!(shared.lock().memory_reserved(), 2 << 20);
/// # Ok::<(), cachalot_core::AllocatorError>(())
/// ```
pub struct SharedAllocator<B: Backend> {
    inner: Arc<Mutex<CachingAllocator<B>>>,
}

impl<B: Backend> Clone for SharedAllocator<B> {
    fn clone(&self) -> Self {
        SharedAllocator { inner: Arc::clone(&self.inner) }
    }
}

impl<B: Backend> SharedAllocator<B> {
    /// Wraps an allocator.
    pub fn new(allocator: CachingAllocator<B>) -> Self {
        SharedAllocator { inner: Arc::new(Mutex::new(allocator)) }
    }

    /// Locks the allocator for several calls in a row. A panic in another thread while it held
    /// the lock does not poison it for good: every allocator call leaves the state consistent.
    pub fn lock(&self) -> MutexGuard<'_, CachingAllocator<B>> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// [`CachingAllocator::malloc`] under the lock.
    pub fn malloc(&self, size: u64, stream: StreamId) -> Result<Allocation, AllocatorError> {
        self.lock().malloc(size, stream)
    }

    /// [`CachingAllocator::free`] under the lock.
    pub fn free(&self, allocation: Allocation) -> Result<(), AllocatorError> {
        self.lock().free(allocation)
    }

    /// [`CachingAllocator::record_stream`] under the lock.
    pub fn record_stream(&self, allocation: &Allocation, stream: StreamId) -> Result<(), AllocatorError> {
        self.lock().record_stream(allocation, stream)
    }

    /// [`CachingAllocator::empty_cache`] under the lock.
    pub fn empty_cache(&self) -> Result<(), AllocatorError> {
        self.lock().empty_cache()
    }
}
