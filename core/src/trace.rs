//! The trace: PyTorch's `TraceEntry` actions for every state change, stack frames, and
//! labelled marks (`docs/allocator-rules.md` §18).

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::StreamId;

/// What happened (PyTorch's `TraceEntry::Action`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum TraceAction {
    /// A block was handed out; `size` is the requested size.
    Alloc,
    /// The user freed a block; `size` is its requested size.
    FreeRequested,
    /// The block went back to the cache (after its cross-stream events, if any).
    FreeCompleted,
    /// A device allocation (`cudaMalloc`).
    SegmentAlloc,
    /// A device free (`cudaFree`).
    SegmentFree,
    /// Pages of an expandable segment were mapped.
    SegmentMap,
    /// Pages of an expandable segment were unmapped.
    SegmentUnmap,
    /// A snapshot was taken; `size` is the total active bytes.
    Snapshot,
    /// An out-of-memory error; `addr` holds the device's free bytes, `size` the rounded request.
    Oom,
}

impl TraceAction {
    /// Every action, in PyTorch's enum order.
    pub const ALL: [TraceAction; 9] = [
        TraceAction::Alloc,
        TraceAction::FreeRequested,
        TraceAction::FreeCompleted,
        TraceAction::SegmentAlloc,
        TraceAction::SegmentFree,
        TraceAction::SegmentMap,
        TraceAction::SegmentUnmap,
        TraceAction::Snapshot,
        TraceAction::Oom,
    ];

    /// The name PyTorch writes in `device_traces`.
    pub fn name(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Snapshot => "snapshot",
            TraceAction::Oom => "oom",
        }
    }

    /// Parses PyTorch's name of an action.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether the action changes reserved memory.
    pub fn is_segment_event(self) -> bool {
        matches!(
            self,
            TraceAction::SegmentAlloc | TraceAction::SegmentFree | TraceAction::SegmentMap | TraceAction::SegmentUnmap
        )
    }
}

/// One Python (or C++) stack frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Frame {
    /// Source file.
    pub filename: Arc<str>,
    /// Line number.
    pub line: i64,
    /// Function name.
    pub name: Arc<str>,
}

/// An interned stack (a list of frames, innermost first), shared by every entry recorded with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct ContextId(pub u32);

/// Interned annotation strings of an entry: PyTorch's `compile_context` and `user_metadata`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Annotation {
    /// `compile_context` ("N/A" when not recording compile contexts).
    pub compile_context: String,
    /// `user_metadata` ("" unless set).
    pub user_metadata: String,
}

/// Index of an interned [`Annotation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct AnnotationId(pub u32);

/// One recorded state change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// Address (for [`TraceAction::Oom`]: the device's free bytes).
    pub addr: u64,
    /// Bytes (see [`TraceAction`] for which size each action carries).
    pub size: u64,
    /// Stream of the block or segment.
    pub stream: StreamId,
    /// Wall-clock microseconds.
    pub time_us: i64,
    /// The stack the change was made from, if recorded.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub context: Option<ContextId>,
    /// Compile context and user metadata, if not the defaults.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub annotation: Option<AnnotationId>,
}

/// A labelled point in a run, with the two numbers users read there.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Mark {
    /// The label.
    pub label: String,
    /// Number of trace entries recorded before the mark.
    pub trace_index: u64,
    /// `memory_allocated()` at the mark.
    pub allocated: u64,
    /// `memory_reserved()` at the mark.
    pub reserved: u64,
    /// Wall-clock microseconds.
    pub time_us: i64,
}

/// Interned stacks and annotations.
#[derive(Clone, Debug, Default)]
pub struct ContextTable {
    stacks: Vec<Arc<[Frame]>>,
    stack_ids: HashMap<Arc<[Frame]>, ContextId>,
    annotations: Vec<Annotation>,
    annotation_ids: HashMap<Annotation, AnnotationId>,
}

impl ContextTable {
    /// Interns a stack; equal stacks get the same id.
    pub fn intern(&mut self, frames: &[Frame]) -> ContextId {
        if let Some(&id) = self.stack_ids.get(frames) {
            return id;
        }
        let stack: Arc<[Frame]> = frames.into();
        let id = ContextId(self.stacks.len() as u32);
        self.stacks.push(stack.clone());
        self.stack_ids.insert(stack, id);
        id
    }

    /// Interns an annotation; the defaults ("N/A", "") are `None`.
    pub fn intern_annotation(&mut self, compile_context: &str, user_metadata: &str) -> Option<AnnotationId> {
        if compile_context == "N/A" && user_metadata.is_empty() {
            return None;
        }
        let annotation =
            Annotation { compile_context: compile_context.to_owned(), user_metadata: user_metadata.to_owned() };
        if let Some(&id) = self.annotation_ids.get(&annotation) {
            return Some(id);
        }
        let id = AnnotationId(self.annotations.len() as u32);
        self.annotations.push(annotation.clone());
        self.annotation_ids.insert(annotation, id);
        Some(id)
    }

    /// The frames of a stack (empty for an unknown id).
    pub fn frames(&self, id: ContextId) -> &[Frame] {
        self.stacks.get(id.0 as usize).map(|s| &s[..]).unwrap_or(&[])
    }

    /// The annotation behind an id.
    pub fn annotation(&self, id: AnnotationId) -> Option<&Annotation> {
        self.annotations.get(id.0 as usize)
    }

    /// All stacks, indexed by [`ContextId`].
    pub fn stacks(&self) -> &[Arc<[Frame]>] {
        &self.stacks
    }

    /// All annotations, indexed by [`AnnotationId`].
    pub fn annotations(&self) -> &[Annotation] {
        &self.annotations
    }
}

/// The history buffer: PyTorch's ring buffer of trace entries (`max_entries`, oldest
/// overwritten first), off until [`crate::CachingAllocator::record_history`] turns it on.
#[derive(Clone, Debug)]
pub(crate) struct TraceRecorder {
    pub enabled: bool,
    max_entries: usize,
    entries: Vec<TraceEntry>,
    /// Where the next entry goes once the buffer is full.
    next: usize,
    skip: u16,
    /// Entries recorded since the start (including overwritten ones).
    pub recorded: u64,
}

impl Default for TraceRecorder {
    fn default() -> Self {
        TraceRecorder { enabled: false, max_entries: usize::MAX, entries: Vec::new(), next: 0, skip: 0, recorded: 0 }
    }
}

impl TraceRecorder {
    pub(crate) fn configure(&mut self, enabled: bool, max_entries: usize, skip: &[TraceAction], clear: bool) {
        self.enabled = enabled;
        self.max_entries = max_entries.max(1);
        self.skip = skip.iter().fold(0, |mask, a| mask | (1 << *a as u16));
        if !enabled || clear {
            self.entries = Vec::new();
            self.next = 0;
        }
    }

    #[inline]
    pub(crate) fn record(&mut self, entry: TraceEntry) {
        if !self.enabled || self.skip & (1 << entry.action as u16) != 0 {
            return;
        }
        self.recorded += 1;
        if self.entries.len() < self.max_entries {
            self.entries.push(entry);
        } else {
            self.entries[self.next] = entry;
            self.next = (self.next + 1) % self.max_entries;
        }
    }

    /// Entries oldest first.
    pub(crate) fn entries(&self) -> Vec<TraceEntry> {
        let mut out = Vec::with_capacity(self.entries.len());
        out.extend_from_slice(&self.entries[self.next..]);
        out.extend_from_slice(&self.entries[..self.next]);
        out
    }

    /// Entries recorded at or after `from` (counted like `recorded`, from the start) that the
    /// buffer still holds, oldest first: what a watcher that has seen `from` entries lacks,
    /// copied without copying the rest of the buffer.
    pub(crate) fn entries_since(&self, from: u64) -> Vec<TraceEntry> {
        let held = self.entries.len() as u64;
        let oldest = self.recorded - held;
        // Entries the ring overwrote are gone; the watcher gets what is left.
        let skip = from.saturating_sub(oldest).min(held) as usize;
        let (newer, older) = self.entries.split_at(self.next);
        let mut out = Vec::with_capacity(self.entries.len() - skip);
        if skip < older.len() {
            out.extend_from_slice(&older[skip..]);
            out.extend_from_slice(newer);
        } else {
            out.extend_from_slice(&newer[skip - older.len()..]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(addr: u64) -> TraceEntry {
        TraceEntry {
            action: TraceAction::Alloc,
            addr,
            size: 1,
            stream: StreamId::DEFAULT,
            time_us: 0,
            context: None,
            annotation: None,
        }
    }

    #[test]
    fn ring_buffer_keeps_the_newest_entries_in_order() {
        let mut r = TraceRecorder::default();
        r.configure(true, 3, &[], false);
        for a in 0..5 {
            r.record(entry(a));
        }
        let addrs: Vec<u64> = r.entries().iter().map(|e| e.addr).collect();
        assert_eq!(addrs, [2, 3, 4]);
        assert_eq!(r.recorded, 5);
    }

    #[test]
    fn entries_since_returns_what_a_watcher_lacks_even_after_the_ring_wrapped() {
        let mut r = TraceRecorder::default();
        r.configure(true, 4, &[], false);
        for a in 0..3 {
            r.record(entry(a));
        }
        let addrs = |v: Vec<TraceEntry>| v.iter().map(|e| e.addr).collect::<Vec<_>>();
        assert_eq!(addrs(r.entries_since(1)), [1, 2]);
        assert_eq!(addrs(r.entries_since(3)), Vec::<u64>::new());
        for a in 3..7 {
            r.record(entry(a));
        }
        // The buffer holds 3..7 in ring order (next = 3).
        assert_eq!(addrs(r.entries_since(5)), [5, 6]);
        assert_eq!(addrs(r.entries_since(4)), [4, 5, 6]);
        assert_eq!(addrs(r.entries_since(0)), [3, 4, 5, 6], "overwritten entries are gone");
        assert_eq!(addrs(r.entries_since(7)), Vec::<u64>::new());
    }

    #[test]
    fn skipped_actions_and_disabled_recorder_record_nothing() {
        let mut r = TraceRecorder::default();
        r.record(entry(1));
        assert!(r.entries().is_empty());
        r.configure(true, usize::MAX, &[TraceAction::Alloc], false);
        r.record(entry(1));
        assert!(r.entries().is_empty());
    }

    #[test]
    fn action_names_round_trip() {
        for a in TraceAction::ALL {
            assert_eq!(TraceAction::from_name(a.name()), Some(a));
        }
        assert_eq!(TraceAction::from_name("bogus"), None);
    }

    #[test]
    fn contexts_are_interned() {
        let mut t = ContextTable::default();
        let f = Frame { filename: "a.py".into(), line: 3, name: "f".into() };
        let a = t.intern(std::slice::from_ref(&f));
        let b = t.intern(std::slice::from_ref(&f));
        assert_eq!(a, b);
        assert_eq!(t.frames(a), &[f]);
        assert_eq!(t.intern_annotation("N/A", ""), None);
        assert!(t.intern_annotation("N/A", "step 3").is_some());
    }
}
