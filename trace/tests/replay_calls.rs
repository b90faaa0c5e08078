//! The allocator calls a replay pushes to its sink, checked as they come by a sink that knows
//! what a program can do (a malloc once per entry, a free only of a live allocation, the
//! completion of a deferred free once and after its request, an `empty_cache` or pool call
//! before the entries of calls after it), on every trace of `testdata`; and the calls a sink
//! sees are those [`ReplayOptions::record_calls`] keeps.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use cachalot_core::backend::StreamId;
use cachalot_core::trace::TraceAction;
use cachalot_trace::replay::{CallSink, ReplayCall, ReplayOptions, replay_observed, replay_with_sink};

mod common;

/// A sink that checks each call against those before it and keeps the first violation.
#[derive(Default)]
struct CallChecker {
    calls: Vec<ReplayCall>,
    /// The entry of the last `Malloc` or `Free`: calls of the program come in trace order.
    last_entry: Option<usize>,
    /// Allocations made and not freed, by the entry of their `Malloc`.
    live: BTreeSet<usize>,
    /// Deferred frees not completed yet, by the entry of their `Free`.
    outstanding: BTreeSet<usize>,
    violation: Option<String>,
}

impl CallChecker {
    fn in_order(&mut self, index: usize) -> Result<(), String> {
        if self.last_entry.is_some_and(|last| index <= last) {
            return Err(format!("a call at entry {index} after one at entry {:?}", self.last_entry));
        }
        self.last_entry = Some(index);
        Ok(())
    }

    fn check(&mut self, call: ReplayCall) -> Result<(), String> {
        match call {
            ReplayCall::Malloc { index, .. } => {
                self.in_order(index)?;
                self.live.insert(index);
            }
            ReplayCall::Free { index, malloc, deferred } => {
                self.in_order(index)?;
                if !self.live.remove(&malloc) {
                    return Err(format!("free at entry {index} of entry {malloc}'s allocation, which is not live"));
                }
                if deferred {
                    self.outstanding.insert(index);
                }
            }
            ReplayCall::FreeCompleted { index, free } => {
                if index <= free || !self.outstanding.remove(&free) {
                    return Err(format!(
                        "completion at entry {index} of entry {free}'s free, which is not outstanding"
                    ));
                }
            }
            ReplayCall::EmptyCache { index } | ReplayCall::Pool { index, .. } => {
                if self.last_entry.is_some_and(|last| index <= last) {
                    return Err(format!("a call before entry {index} after one at entry {:?}", self.last_entry));
                }
            }
        }
        Ok(())
    }
}

impl CallSink for CallChecker {
    fn call(&mut self, call: ReplayCall) {
        if self.violation.is_none()
            && let Err(violation) = self.check(call)
        {
            self.violation = Some(format!("call {}: {violation}", self.calls.len()));
        }
        self.calls.push(call);
    }
}

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata")
}

/// Every trace of `testdata` with its recorded runs, by device.
fn traces() -> Vec<(PathBuf, usize)> {
    let conformance = testdata().join("conformance");
    let mut traces = Vec::new();
    for dir in [common::vendored(), conformance.clone(), conformance.join("pools"), conformance.join("devices")] {
        for path in common::pickles_in(&dir) {
            let devices = if dir.ends_with("devices") { 2 } else { 1 };
            traces.extend((0..devices).map(|device| (path.clone(), device)));
        }
    }
    traces
}

fn options(path: &Path, device: usize) -> (cachalot_trace::snapshot::torch::TorchSnapshot, ReplayOptions) {
    let (snapshot, expected) = common::load(path);
    let recorded = cachalot_trace::replay::ExpectedRun::beside_device(path, device).unwrap();
    let options =
        ReplayOptions::for_snapshot(&snapshot, Some(&expected)).unwrap().for_device(device, recorded.as_ref());
    (snapshot, options)
}

#[test]
fn every_replay_pushes_calls_a_program_could_make() {
    let traces = traces();
    assert!(traces.len() >= 9 + 9 + 8 + 8, "the reference, conformance, pool and device traces");
    let mut kinds = BTreeMap::new();
    for (path, device) in traces {
        let (snapshot, options) = options(&path, device);
        let mut checker = CallChecker::default();
        let outcome = replay_with_sink(&snapshot, &options, &[], &mut checker, |_, _| {}).unwrap();
        let name = format!("{} device {device}", path.display());
        assert_eq!(checker.violation, None, "{name}");
        assert!(outcome.calls.is_empty(), "{name}: the calls went to the sink");
        let malloc_entries = snapshot.device_traces[device]
            .iter()
            .filter(|e| matches!(e.action, TraceAction::Alloc | TraceAction::Oom))
            .count();
        let mallocs = checker.calls.iter().filter(|c| matches!(c, ReplayCall::Malloc { .. })).count();
        assert_eq!(mallocs, malloc_entries, "{name}: a malloc per alloc and oom entry");
        for call in &checker.calls {
            let kind = match call {
                ReplayCall::Malloc { .. } => "malloc",
                ReplayCall::Free { .. } => "free",
                ReplayCall::FreeCompleted { .. } => "free_completed",
                ReplayCall::EmptyCache { .. } => "empty_cache",
                ReplayCall::Pool { .. } => "pool",
            };
            *kinds.entry(kind).or_insert(0) += 1;
        }
        // The same calls, in the same order, as a replay that records them keeps.
        let recorded = ReplayOptions { record_calls: true, ..options };
        let outcome = replay_observed(&snapshot, &recorded, &[], |_, _| {}).unwrap();
        assert_eq!(outcome.calls, checker.calls, "{name}");
    }
    // Every kind of call was checked somewhere.
    for kind in ["malloc", "free", "free_completed", "empty_cache", "pool"] {
        assert!(kinds.get(kind).is_some_and(|&n| n > 0), "no {kind} call in testdata: {kinds:?}");
    }
}

/// The checker is not a sink that accepts anything: a free of an allocation never made, and a
/// completion of a free that did not wait, are caught.
#[test]
fn the_checker_catches_calls_no_program_makes() {
    let mut checker = CallChecker::default();
    checker.call(ReplayCall::Malloc { index: 0, size: 512, stream: StreamId::DEFAULT, recorded_oom: false });
    checker.call(ReplayCall::Free { index: 1, malloc: 0, deferred: false });
    assert_eq!(checker.violation, None);
    checker.call(ReplayCall::FreeCompleted { index: 2, free: 1 });
    assert!(checker.violation.unwrap().contains("not outstanding"));
    let mut checker = CallChecker::default();
    checker.call(ReplayCall::Free { index: 1, malloc: 0, deferred: false });
    assert!(checker.violation.unwrap().contains("not live"));
}
