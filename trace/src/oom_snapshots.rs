//! Snapshots written at out-of-memory errors, through an OOM observer
//! ([`cachalot_core::Allocator::attach_dyn_oom_observer`]), as PyTorch users do with
//! `torch._C._cuda_attach_out_of_memory_observer` + `_dump_snapshot`: `cachalot run
//! --oom-snapshot DIR` and `cachalot replay --oom-snapshot DIR` write `DIR/NAME.oom-N.json` at
//! the N-th error, the allocator as that error left it (segments, blocks, trace, stats).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cachalot_core::DynOomObserver;

use crate::Snapshot;

/// The snapshots written so far, and the first write that failed (an observer cannot return
/// an error: the caller asks afterwards, [`OomSnapshots::first_error`]). Each is written whole
/// or not at all ([`cachalot_trace::output`]); after a failed write the series stops, so a
/// full disk costs one error, not an empty file per later out-of-memory error.
#[derive(Clone, Debug)]
pub struct OomSnapshots {
    dir: PathBuf,
    name: String,
    what: String,
    written: Arc<AtomicUsize>,
    first_error: Arc<Mutex<Option<String>>>,
}

impl OomSnapshots {
    /// Snapshots `dir/NAME.oom-N.json` of `what` (e.g. "run of seeds", for the snapshot's
    /// label); `dir` must be an existing directory.
    pub fn new(dir: &Path, name: &str, what: &str) -> Result<Self, String> {
        if !dir.is_dir() {
            return Err(format!("--oom-snapshot {}: not an existing directory", dir.display()));
        }
        Ok(OomSnapshots {
            dir: dir.to_path_buf(),
            name: name.to_owned(),
            what: what.to_owned(),
            written: Arc::default(),
            first_error: Arc::default(),
        })
    }

    /// The observer that writes them.
    pub fn observer(&self) -> DynOomObserver {
        let snapshots = self.clone();
        Arc::new(move |event, allocator| {
            let mut first = snapshots.first_error.lock().unwrap_or_else(|p| p.into_inner());
            if first.is_some() {
                return;
            }
            let n = snapshots.written.load(Ordering::Relaxed) + 1;
            let target = snapshots.dir.join(format!("{}.oom-{n}.json", snapshots.name));
            let label = format!(
                "{} at out-of-memory error {n} ({} B requested, {} B free of {})",
                snapshots.what, event.requested, event.device_free, event.device_total
            );
            match crate::output::write_atomic(&target, &Snapshot::capture(allocator, label).to_json()) {
                Ok(()) => {
                    snapshots.written.store(n, Ordering::Relaxed);
                }
                Err(e) => {
                    *first = Some(format!("{e} (the out-of-memory snapshots stopped there, {} written)", n - 1));
                }
            }
        })
    }

    /// How many were written.
    pub fn written(&self) -> usize {
        self.written.load(Ordering::Relaxed)
    }

    /// The write that failed and stopped the series, if one did.
    pub fn first_error(&self) -> Option<String> {
        self.first_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
