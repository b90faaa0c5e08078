//! Ctrl-C while `cachalot run` runs an experiment: the first one asks the experiment to stop at
//! its next operation, so the command can still say what was done and keep the partial snapshot;
//! a second one ends the process at once, as Ctrl-C does anywhere else.
//!
//! On other systems than Unix, Ctrl-C ends the process as it always did.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// From now on, the first Ctrl-C (SIGINT) is caught and recorded instead of ending the process.
pub fn catch_first() {
    #[cfg(unix)]
    // SAFETY: the handler only stores to an atomic and calls write(2), both async-signal-safe;
    // the action is a zeroed `sigaction` with its handler, flags and (empty) mask set.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SA_RESETHAND: the handler runs once, and the next Ctrl-C has the default effect.
        action.sa_flags = libc::SA_RESETHAND | libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut());
    }
}

/// Whether Ctrl-C was pressed since [`catch_first`].
pub fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}

#[cfg(unix)]
extern "C" fn on_interrupt(_signal: libc::c_int) {
    REQUESTED.store(true, Ordering::Relaxed);
    let message =
        b"\ncachalot: interrupted: stopping at the experiment's next operation (Ctrl-C again quits at once)\n";
    // SAFETY: write(2) on standard error with a valid buffer; async-signal-safe.
    unsafe {
        libc::write(libc::STDERR_FILENO, message.as_ptr().cast(), message.len());
    }
}
