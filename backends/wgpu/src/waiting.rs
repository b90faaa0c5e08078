//! Waiting without blocking forever: a poison-tolerant lock, a future polled once, and an error
//! scope around a call. The context, the pipelines and the readbacks all use them, so they sit
//! below all three.

use std::future::Future;
use std::pin::pin;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// Locks a mutex, going on with the data if another thread panicked while holding it: every
/// critical section here leaves the data consistent.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Polls a future once with a waker that does nothing: ready values on native wgpu, `None`
/// where the answer needs an event loop.
pub(crate) fn poll_once<F: Future>(future: F) -> Option<F::Output> {
    let mut context = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut context) {
        Poll::Ready(value) => Some(value),
        Poll::Pending => None,
    }
}

/// Runs `f` inside an error scope of `device` with `filter`, and returns what it returned with
/// the error the scope caught, if any.
///
/// In the browser a scope answers only after the page returned to its event loop, and an
/// answer nobody awaits would be lost: there no scope is pushed, and an error goes to the
/// device's uncaptured-error handler, which keeps it for the page
/// ([`crate::WgpuContext::take_device_errors`]).
pub(crate) fn scoped<T>(
    device: &wgpu::Device,
    filter: wgpu::ErrorFilter,
    f: impl FnOnce() -> T,
) -> (T, Option<wgpu::Error>) {
    if cfg!(target_arch = "wasm32") {
        return (f(), None);
    }
    let scope = device.push_error_scope(filter);
    let value = f();
    let error = poll_once(scope.pop()).flatten();
    (value, error)
}
