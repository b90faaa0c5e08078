//! Taking a live run's entries in within a time budget per frame, so that watching a run costs
//! it little.
//!
//! Rebuilding the allocator's state from an entry ([`crate::model::Run::extend`]: the pool
//! state, the byte series, a checkpoint now and then) costs about as much as the simulated
//! allocator took to make it. Rebuilding every entry the moment it arrives therefore took a
//! core's worth of time from a fast run on a two-core machine and slowed it 1.7–2.8 times
//! (docs/journal/benchmarks-2026-11.md §14). Instead, a tab keeps what arrived in a [`Backlog`]
//! (the batches as the runtime sent them: moved, not copied) and each frame rebuilds only as much
//! as [`RUNNING_BUDGET`] allows while the run goes, and [`CATCH_UP_BUDGET`] once it ended. At the
//! rates a window can show (the 200,000 events/s is about 3,000 entries a frame) the
//! backlog is empty after every frame and the views follow the newest event; a faster run is
//! shown a little behind while it runs, and the window catches up after it, still drawing
//! frames. Marks wait in the same queue as the entries, so a mark never points past the
//! entries the run holds.

use std::collections::VecDeque;
use std::time::Duration;

use cachalot_core::{Mark, TraceEntry};
use web_time::Instant;

use crate::model::Run;

/// Rebuild time per frame while the run goes: a quarter of a 60 frames/s frame, leaving the
/// rest of the core to drawing and the other core to the run.
pub const RUNNING_BUDGET: Duration = Duration::from_millis(4);
/// Rebuild time per frame once the run ended: the window keeps drawing about 40 frames/s while
/// it catches up.
pub const CATCH_UP_BUDGET: Duration = Duration::from_millis(20);
/// Entries rebuilt between two readings of the clock.
const CHUNK: usize = 1024;

/// What waits to be taken in, in the order it arrived.
#[derive(Debug)]
enum Pending {
    /// A batch of entries, of which the first `taken` are in the run already.
    Entries { entries: Vec<TraceEntry>, taken: usize },
    /// A mark, after the entries it counts.
    Mark(Mark),
}

/// A live run's entries and marks that arrived but are not in its [`Run`] yet.
#[derive(Debug, Default)]
pub struct Backlog {
    queue: VecDeque<Pending>,
    entries: usize,
}

impl Backlog {
    /// Queues a batch of entries.
    pub fn push_entries(&mut self, entries: Vec<TraceEntry>) {
        if !entries.is_empty() {
            self.entries += entries.len();
            self.queue.push_back(Pending::Entries { entries, taken: 0 });
        }
    }

    /// Queues a mark (it is added to the run after the entries queued before it).
    pub fn push_mark(&mut self, mark: Mark) {
        self.queue.push_back(Pending::Mark(mark));
    }

    /// Entries waiting.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Forgets everything (the run started over).
    pub fn clear(&mut self) {
        self.queue.clear();
        self.entries = 0;
    }

    /// Moves what waits into `run`, oldest first, until `budget` has passed (at least one chunk
    /// is taken, so a run always advances). Returns whether anything was taken.
    pub fn ingest(&mut self, run: &mut Run, budget: Duration) -> bool {
        let started = Instant::now();
        let mut took = false;
        while let Some(front) = self.queue.front_mut() {
            if took && started.elapsed() >= budget {
                break;
            }
            took = true;
            match front {
                Pending::Mark(_) => {
                    if let Some(Pending::Mark(mark)) = self.queue.pop_front() {
                        run.marks.push(mark);
                    }
                }
                Pending::Entries { entries, taken } => {
                    let end = (*taken + CHUNK).min(entries.len());
                    run.extend(entries[*taken..end].iter().copied());
                    self.entries -= end - *taken;
                    *taken = end;
                    if end == entries.len() {
                        self.queue.pop_front();
                    }
                }
            }
        }
        took
    }

    /// Moves everything into `run` at once.
    pub fn ingest_all(&mut self, run: &mut Run) {
        while !self.is_empty() {
            self.ingest(run, Duration::MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Rules, RunKind};
    use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};

    fn recorded() -> (Vec<TraceEntry>, Vec<Mark>) {
        let mut a = CachingAllocator::new(SimBackend::new(1 << 34), AllocatorConfig::default()).unwrap();
        a.record_history(true, usize::MAX, &[], false);
        let mut live = Vec::new();
        for i in 0..6000u64 {
            live.push(a.malloc(512 * (1 + i % 3000), StreamId::DEFAULT).unwrap());
            if i % 2 == 1 {
                a.free(live.swap_remove((i as usize * 7) % live.len())).unwrap();
            }
            if i % 1000 == 999 {
                a.mark(format!("op {i}"));
            }
        }
        (a.trace(), a.marks().to_vec())
    }

    #[test]
    fn a_backlog_taken_in_a_little_at_a_time_builds_the_run_a_whole_trace_builds() {
        let (trace, marks) = recorded();
        let mut whole = Run::new("whole", RunKind::Live, Rules::default());
        whole.extend(trace.iter().copied());
        whole.marks = marks.clone();
        whole.finish();

        let mut live = Run::new("live", RunKind::Live, Rules::default());
        live.live = true;
        let mut backlog = Backlog::default();
        let mut marks = marks.into_iter().peekable();
        for (i, batch) in trace.chunks(700).enumerate() {
            backlog.push_entries(batch.to_vec());
            let sent = (i * 700 + batch.len()) as u64;
            while let Some(mark) = marks.next_if(|m| m.trace_index <= sent) {
                backlog.push_mark(mark);
            }
            // No time at all: one chunk a call, so the backlog grows while entries arrive.
            backlog.ingest(&mut live, Duration::ZERO);
            assert!(live.marks.iter().all(|m| m.trace_index as usize <= live.trace.len()), "a mark ran ahead");
        }
        assert!(backlog.entries() > 0, "the test should leave a backlog behind");
        assert_eq!(backlog.entries() + live.trace.len(), trace.len());
        backlog.ingest_all(&mut live);
        assert!(backlog.is_empty());
        assert_eq!(backlog.entries(), 0);
        live.finish();
        assert_eq!(live.trace, whole.trace);
        assert_eq!(live.marks, whole.marks);
        assert_eq!(live.allocated.values(), whole.allocated.values());
        assert_eq!(live.reserved.values(), whole.reserved.values());
        assert_eq!(live.head(), whole.head());
    }
}
