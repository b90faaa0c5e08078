//! `replay --all-devices`: every device trace of a snapshot replayed on an allocator of its
//! own, on as many threads as the machine has cores (not one per device: a 4 KB pickle can
//! name thousands of devices).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use cachalot_trace::replay::{ExpectedRun, ReplayError, ReplayOptions, ReplayOutcome, replay};
use cachalot_trace::snapshot::torch::TorchSnapshot;

/// Replays every device trace of `snapshot`, each device taking `options` with its own program
/// calls from `recorded` ([`ReplayOptions::for_device`]); the outcomes are by device index. The
/// first error (by device index) is the result's.
pub fn replay_devices(
    snapshot: &TorchSnapshot,
    options: &ReplayOptions,
    recorded: &[Option<ExpectedRun>],
) -> Result<Vec<ReplayOutcome>, ReplayError> {
    let devices = snapshot.device_traces.len();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, devices.max(1));
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<ReplayOutcome, ReplayError>>>> =
        (0..devices).map(|_| Mutex::new(None)).collect();
    let work = || {
        loop {
            let device = next.fetch_add(1, Ordering::Relaxed);
            let Some(slot) = results.get(device) else { return };
            let options = options.for_device(device, recorded.get(device).and_then(Option::as_ref));
            let outcome = replay(snapshot, &options, |_, _| {});
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        }
    };
    std::thread::scope(|scope| {
        // This thread is one of the workers; a thread that cannot be started leaves its share
        // to the others.
        for _ in 1..threads {
            if std::thread::Builder::new().spawn_scoped(scope, work).is_err() {
                break;
            }
        }
        work();
    });
    results
        .into_iter()
        .map(|slot| match slot.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(outcome) => outcome,
            // Every slot is filled: the workers take indices until none is left, and this
            // thread is one of them.
            None => unreachable!("every device is replayed"),
        })
        .collect()
}
