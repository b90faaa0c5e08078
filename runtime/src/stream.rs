//! Watching a run as it happens: a [`TraceSink`] attached to a [`crate::Runtime`] receives the
//! allocator's new stacks, trace entries and marks in batches while the experiment runs (the
//! viewer's live runs are one such sink), and can ask the run to stop.
//!
//! The runtime delivers at the start of an operation, when [`STREAM_BATCH`] entries are
//! waiting or [`STREAM_INTERVAL`] has passed since the last delivery, after every mark, and at
//! the end. Entries are read from the allocator's history with
//! [`cachalot_core::Allocator::trace_since`], so the history stays whole (the run's snapshot is
//! the same as an unwatched run's) and each entry is copied once. Batching keeps the cost of
//! being watched small: one delivery per few thousand entries, and the clock is read only
//! every [`CLOCK_EVERY`] operations.
//!
//! A stop request ends the run at its next operation with [`RuntimeError::Stopped`]; the run's
//! result then shows how far it got, as any failed run does.

use std::time::{Duration, Instant};

use cachalot_core::{Allocator, ContextId, DeviceFacts, Frame, Mark, TraceEntry};

use crate::error::RuntimeError;

/// Entries that make a delivery due.
pub const STREAM_BATCH: u64 = 8192;
/// Time after which waiting entries are delivered anyway (so a slow run is seen promptly).
pub const STREAM_INTERVAL: Duration = Duration::from_millis(8);
/// Operations between two readings of the clock.
const CLOCK_EVERY: u32 = 32;

/// What the allocator recorded since the last delivery, in the order a reader needs it: new
/// stacks first (entries refer to them), then entries, then marks (which count entries).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceBatch {
    /// Stacks interned since the last batch, with their ids (dense, continuing).
    pub stacks: Vec<(ContextId, Vec<Frame>)>,
    /// Trace entries, oldest first.
    pub entries: Vec<TraceEntry>,
    /// Marks recorded since the last batch.
    pub marks: Vec<Mark>,
}

impl TraceBatch {
    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty() && self.entries.is_empty() && self.marks.is_empty()
    }
}

/// Something that watches a run: it is told the device first, then gets every batch.
pub trait TraceSink {
    /// The run starts on `device` with the allocator configured by `settings`
    /// (`PYTORCH_CUDA_ALLOC_CONF` syntax).
    fn begin(&mut self, device: &DeviceFacts, settings: &str);
    /// What was recorded since the last batch (never empty).
    fn deliver(&mut self, batch: TraceBatch);
    /// Whether the watcher asked the run to stop.
    fn stop_requested(&self) -> bool {
        false
    }
    /// Whether batches carry the trace entries and stacks; a watcher that reads only the marks
    /// (a command line printing them as they come) says no, and the run copies no entries for it.
    fn wants_trace(&self) -> bool {
        true
    }
}

/// A sink and how much of the allocator's history it has seen.
pub(crate) struct Watcher {
    sink: Box<dyn TraceSink>,
    stacks_sent: usize,
    entries_sent: u64,
    marks_sent: usize,
    last_delivery: Instant,
    ops_since_clock: u32,
}

impl Watcher {
    /// Attaches `sink` to `allocator`: tells it the device and hands it what was recorded so far.
    pub(crate) fn attach(mut sink: Box<dyn TraceSink>, allocator: &dyn Allocator) -> Self {
        sink.begin(allocator.device(), allocator.settings());
        let mut watcher = Watcher {
            sink,
            stacks_sent: 0,
            entries_sent: 0,
            marks_sent: 0,
            last_delivery: Instant::now(),
            ops_since_clock: 0,
        };
        watcher.deliver(allocator);
        watcher
    }

    /// Called at the start of every operation: delivers if a delivery is due, and refuses the
    /// operation if the watcher asked the run to stop.
    pub(crate) fn before_operation(&mut self, allocator: &dyn Allocator) -> Result<(), RuntimeError> {
        if self.sink.stop_requested() {
            self.deliver(allocator);
            return Err(RuntimeError::Stopped);
        }
        let waiting = allocator.trace_len_total().saturating_sub(self.entries_sent);
        self.ops_since_clock += 1;
        let late = self.ops_since_clock >= CLOCK_EVERY && {
            self.ops_since_clock = 0;
            self.last_delivery.elapsed() >= STREAM_INTERVAL
        };
        if waiting >= STREAM_BATCH || (late && waiting > 0) {
            self.deliver(allocator);
        }
        Ok(())
    }

    /// Hands the sink everything it has not seen yet.
    pub(crate) fn deliver(&mut self, allocator: &dyn Allocator) {
        let stacks = allocator.contexts().stacks();
        let marks = allocator.marks()[self.marks_sent.min(allocator.marks().len())..].to_vec();
        let batch = if self.sink.wants_trace() {
            TraceBatch {
                stacks: stacks[self.stacks_sent.min(stacks.len())..]
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (ContextId((self.stacks_sent + i) as u32), s.to_vec()))
                    .collect(),
                entries: allocator.trace_since(self.entries_sent),
                marks,
            }
        } else {
            TraceBatch { marks, ..TraceBatch::default() }
        };
        self.stacks_sent = stacks.len();
        self.entries_sent = allocator.trace_len_total();
        self.marks_sent = allocator.marks().len();
        self.last_delivery = Instant::now();
        if !batch.is_empty() {
            self.sink.deliver(batch);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;
    use crate::{BackendRequest, DeviceOptions, Experiment, MlpParams, execute, execute_watched, select};

    /// Collects what it is given.
    #[derive(Clone, Default)]
    struct Collect {
        batches: Rc<RefCell<Vec<TraceBatch>>>,
        began: Rc<RefCell<bool>>,
        stop_after: Option<usize>,
        marks_only: bool,
    }

    impl TraceSink for Collect {
        fn begin(&mut self, _device: &DeviceFacts, _settings: &str) {
            *self.began.borrow_mut() = true;
        }
        fn deliver(&mut self, batch: TraceBatch) {
            self.batches.borrow_mut().push(batch);
        }
        fn stop_requested(&self) -> bool {
            self.stop_after.is_some_and(|n| self.batches.borrow().len() >= n)
        }
        fn wants_trace(&self) -> bool {
            !self.marks_only
        }
    }

    fn sim() -> DeviceOptions {
        DeviceOptions { backend: BackendRequest::Sim, compute: false, ..Default::default() }
    }

    #[test]
    fn a_watched_run_delivers_its_whole_trace_stacks_and_marks_and_is_unchanged() {
        let experiment = Experiment::MlpTrain(MlpParams { steps: 4, ..MlpParams::default() });
        let unwatched = execute(&experiment, &sim()).unwrap();
        let sink = Collect::default();
        let (device, selection) = select::open(&sim()).unwrap();
        let watched = execute_watched(&experiment, device, selection, Box::new(sink.clone()));
        assert!(*sink.began.borrow());
        let batches = sink.batches.borrow();
        let entries: Vec<TraceEntry> = batches.iter().flat_map(|b| b.entries.iter().copied()).collect();
        let stacks: Vec<(ContextId, Vec<Frame>)> = batches.iter().flat_map(|b| b.stacks.iter().cloned()).collect();
        let marks: Vec<Mark> = batches.iter().flat_map(|b| b.marks.iter().cloned()).collect();
        assert_eq!(entries, watched.snapshot.trace);
        assert_eq!(stacks.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>(), watched.snapshot.stacks);
        assert!(stacks.iter().enumerate().all(|(i, (id, _))| id.0 as usize == i), "ids are dense");
        assert_eq!(marks, watched.snapshot.marks);
        // Being watched changes nothing the allocator did (only the wall-clock times differ).
        let untimed = |t: &[TraceEntry]| t.iter().map(|e| TraceEntry { time_us: 0, ..*e }).collect::<Vec<_>>();
        assert_eq!(untimed(&watched.snapshot.trace), untimed(&unwatched.snapshot.trace));
        assert_eq!(watched.snapshot.segments, unwatched.snapshot.segments);
        let numbers = |m: &[Mark]| m.iter().map(|m| (m.label.clone(), m.allocated, m.reserved)).collect::<Vec<_>>();
        assert_eq!(numbers(&watched.marks), numbers(&unwatched.marks));
        assert!(batches.iter().all(|b| !b.is_empty()));
    }

    #[test]
    fn a_stop_request_ends_the_run_at_its_next_operation_with_the_trace_so_far() {
        let experiment = Experiment::MlpTrain(MlpParams { steps: 50, ..MlpParams::default() });
        let sink = Collect { stop_after: Some(2), ..Default::default() };
        let (device, selection) = select::open(&sim()).unwrap();
        let result = execute_watched(&experiment, device, selection, Box::new(sink.clone()));
        assert_eq!(result.record.error.as_deref(), Some(RuntimeError::Stopped.to_string().as_str()));
        let delivered: usize = sink.batches.borrow().iter().map(|b| b.entries.len()).sum();
        assert_eq!(delivered, result.snapshot.trace.len(), "the frees of the unwound tensors arrive too");
        assert!(result.snapshot.marks.len() < 50, "it stopped early: {} marks", result.snapshot.marks.len());
    }

    #[test]
    fn a_watcher_of_marks_gets_every_mark_and_no_entries() {
        let experiment = Experiment::MlpTrain(MlpParams { steps: 4, ..MlpParams::default() });
        let sink = Collect { marks_only: true, ..Default::default() };
        let (device, selection) = select::open(&sim()).unwrap();
        let watched = execute_watched(&experiment, device, selection, Box::new(sink.clone()));
        let batches = sink.batches.borrow();
        let marks: Vec<Mark> = batches.iter().flat_map(|b| b.marks.iter().cloned()).collect();
        assert_eq!(marks, watched.snapshot.marks);
        assert!(!marks.is_empty());
        assert!(batches.iter().all(|b| b.entries.is_empty() && b.stacks.is_empty() && !b.marks.is_empty()));
        assert!(!watched.snapshot.trace.is_empty(), "the run's own history stays whole");
    }
}
