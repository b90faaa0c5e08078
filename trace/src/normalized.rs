//! Allocator event sequences made comparable across devices: addresses become (segment index,
//! offset), and [`first_difference`] says where two sequences part.
//!
//! Each backend places segments at addresses of its own (CUDA's driver, the simulator's and
//! the wgpu backend's address spaces), so equal allocator behaviour gives different raw
//! addresses. Numbering segments in the order they were created and giving each block's offset
//! in its segment removes that and nothing else: two runs whose normalised traces are equal
//! made the same decisions, block for block.
//!
//! One more thing depends on addresses alone: the order in which one `empty_cache` releases
//! segments (PyTorch walks the free blocks in address order). Within each run of consecutive
//! `segment_free` entries the entries are put in segment order, so a driver that hands out
//! decreasing addresses (CUDA's often does) and one that hands out increasing ones compare
//! equal.

use std::collections::BTreeMap;

use cachalot_core::{TraceAction, TraceEntry};

/// A trace entry with its address as (segment index, offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormalizedEntry {
    /// What happened.
    pub action: TraceAction,
    /// Bytes.
    pub size: u64,
    /// The stream.
    pub stream: u64,
    /// Index of the segment (in creation order) the address lies in; `None` when it lies in
    /// none (an out-of-memory entry, whose address field holds free bytes).
    pub segment: Option<usize>,
    /// Offset of the address in that segment.
    pub offset: u64,
}

impl std::fmt::Display for NormalizedEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.segment {
            Some(s) => write!(f, "{} {} B at segment {s} + {:#x}", self.action.name(), self.size, self.offset),
            None => write!(f, "{} {} B", self.action.name(), self.size),
        }
    }
}

/// Normalises a trace (see the module docs).
pub fn normalize(trace: &[TraceEntry]) -> Vec<NormalizedEntry> {
    // Live segments (and mapped ranges) by base: (size, index). Ordered by address, so that
    // the segment holding an address is found in log time whatever the number of segments
    // (a trace of thousands of streams has a segment per stream).
    let mut live: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    let mut next = 0usize;
    let mut out = Vec::with_capacity(trace.len());
    for e in trace {
        let find = |live: &BTreeMap<u64, (u64, usize)>| {
            live.range(..=e.addr)
                .next_back()
                .filter(|&(&base, &(size, _))| e.addr < base.saturating_add(size.max(1)))
                .map(|(&base, &(_, index))| (base, index))
        };
        let (segment, offset) = match e.action {
            TraceAction::SegmentAlloc | TraceAction::SegmentMap if find(&live).is_none() => {
                live.insert(e.addr, (e.size, next));
                next += 1;
                (Some(next - 1), 0)
            }
            TraceAction::Oom | TraceAction::Snapshot => (None, 0),
            _ => match find(&live) {
                Some((base, index)) => {
                    if e.action == TraceAction::SegmentFree {
                        live.remove(&base);
                    }
                    (Some(index), e.addr - base)
                }
                None => (None, e.addr),
            },
        };
        out.push(NormalizedEntry { action: e.action, size: e.size, stream: e.stream.0, segment, offset });
    }
    let mut start = 0;
    while start < out.len() {
        let end = start + out[start..].iter().take_while(|e| e.action == TraceAction::SegmentFree).count();
        out[start..end].sort_by_key(|e| (e.segment, e.size));
        start = end.max(start + 1);
    }
    out
}

/// Where two normalised event sequences part, if they do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventDiff {
    /// Entry for entry the same.
    Identical {
        /// Entries.
        entries: usize,
    },
    /// The same once `free_completed` entries are left out: the runs made the same decisions
    /// but completed frees at different points (a queue-stream device completes them at the
    /// next allocator call).
    FreeCompletionOnly {
        /// Entries compared without `free_completed`.
        entries: usize,
        /// `free_completed` entries at a different position.
        moved: usize,
    },
    /// They differ from entry `index` on.
    Differ {
        /// First differing entry.
        index: usize,
        /// The first sequence's entry there (`None`: it has ended).
        a: Option<NormalizedEntry>,
        /// The second sequence's entry there (`None`: it has ended).
        b: Option<NormalizedEntry>,
    },
}

impl std::fmt::Display for EventDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |e: &Option<NormalizedEntry>| e.map_or("(end)".to_owned(), |e| e.to_string());
        match self {
            EventDiff::Identical { entries } => write!(f, "identical ({entries} events)"),
            EventDiff::FreeCompletionOnly { entries, moved } => {
                write!(f, "the same {entries} decisions, {moved} free_completed at another point")
            }
            EventDiff::Differ { index, a, b } => write!(f, "differ from event {index}: {} vs {}", show(a), show(b)),
        }
    }
}

/// Normalises two traces and finds where they first differ (see [`EventDiff`]).
pub fn first_difference(a: &[TraceEntry], b: &[TraceEntry]) -> EventDiff {
    let (na, nb) = (normalize(a), normalize(b));
    if na == nb {
        return EventDiff::Identical { entries: na.len() };
    }
    let decisions = |t: &[NormalizedEntry]| -> Vec<NormalizedEntry> {
        t.iter().filter(|e| e.action != TraceAction::FreeCompleted).copied().collect()
    };
    let (da, db) = (decisions(&na), decisions(&nb));
    let completions = |t: &[NormalizedEntry]| -> Vec<NormalizedEntry> {
        t.iter().filter(|e| e.action == TraceAction::FreeCompleted).copied().collect()
    };
    if da == db && completions(&na) == completions(&nb) {
        let moved = na.iter().zip(&nb).filter(|(x, y)| x != y && x.action == TraceAction::FreeCompleted).count();
        return EventDiff::FreeCompletionOnly { entries: da.len(), moved };
    }
    let index = na.iter().zip(&nb).position(|(x, y)| x != y).unwrap_or(na.len().min(nb.len()));
    EventDiff::Differ { index, a: na.get(index).copied(), b: nb.get(index).copied() }
}

#[cfg(test)]
mod tests {
    use cachalot_core::StreamId;

    use super::*;

    fn entry(action: TraceAction, addr: u64, size: u64) -> TraceEntry {
        TraceEntry { action, addr, size, stream: StreamId::DEFAULT, time_us: 0, context: None, annotation: None }
    }

    #[test]
    fn addresses_become_segment_and_offset() {
        use TraceAction::*;
        let run = |base: u64| {
            vec![
                entry(SegmentAlloc, base, 2 << 20),
                entry(Alloc, base + 512, 4),
                entry(SegmentAlloc, base + (8 << 20), 4 << 20),
                entry(Alloc, base + (8 << 20), 4 << 20),
                entry(FreeRequested, base + 512, 4),
                entry(FreeCompleted, base + 512, 4),
            ]
        };
        assert_eq!(first_difference(&run(0x7f00_0000_0000), &run(0x1_0000_0000)), EventDiff::Identical { entries: 6 });
        let n = normalize(&run(0x1000_0000));
        assert_eq!((n[3].segment, n[3].offset), (Some(1), 0));
        assert_eq!((n[1].segment, n[1].offset), (Some(0), 512));
        // The same decisions, the free completing one allocation later.
        let mut late = run(0);
        let completed = late.remove(5);
        late.push(entry(Alloc, 1 << 20, 4));
        late.push(completed);
        let mut early = run(0);
        early.push(entry(Alloc, 1 << 20, 4));
        assert_eq!(first_difference(&early, &late), EventDiff::FreeCompletionOnly { entries: 6, moved: 1 });
        assert_eq!(
            first_difference(&early, &late).to_string(),
            "the same 6 decisions, 1 free_completed at another point"
        );
        // One sequence ending early: the difference is at its end.
        let diff = first_difference(&early[..2], &early);
        assert_eq!(diff, EventDiff::Differ { index: 2, a: None, b: Some(normalize(&early)[2]) });
        assert_eq!(diff.to_string(), "differ from event 2: (end) vs segment_alloc 4194304 B at segment 1 + 0x0");
    }
}
