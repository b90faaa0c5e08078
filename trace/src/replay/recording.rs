//! What the replay reads off the whole trace before replaying it: the facts the device decided
//! (the addresses of new segments and VA reservations) and the shape of the frees that waited
//! for another stream, so that each entry is then replayed in constant time with respect to the
//! trace's length.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use cachalot_core::backend::StreamId;
use cachalot_core::size::{SMALL_BUFFER, SMALL_SIZE};
use cachalot_core::trace::{TraceAction, TraceEntry};

use super::ReplayOptions;

/// Streams the replay invents for frees that completed later than requested: one per such
/// free, ordered like their completions so simultaneous completions come out in trace order.
const SYNTHETIC_STREAMS: u64 = 1 << 62;

/// The frees that did not complete at once (their block was used on another stream). Frees that
/// completed at once, nearly all of them, are in neither map.
#[derive(Default)]
pub(super) struct DeferredFrees {
    /// By the index of their `free_requested` entry: the index of their `free_completed`, or
    /// `None` for never.
    requested: FxHashMap<usize, Option<usize>>,
    /// By the index of their `free_completed` entry: the index of their `free_requested`.
    completed: FxHashMap<usize, usize>,
}

impl DeferredFrees {
    /// Finds the frees of `trace` that completed later than requested, and when.
    pub(super) fn of(trace: &[TraceEntry]) -> Self {
        let mut deferred = DeferredFrees::default();
        let mut open: FxHashMap<u64, usize> = FxHashMap::default();
        for (i, e) in trace.iter().enumerate() {
            match e.action {
                TraceAction::FreeRequested => {
                    let immediate =
                        trace.get(i + 1).is_some_and(|n| n.action == TraceAction::FreeCompleted && n.addr == e.addr);
                    if !immediate {
                        deferred.requested.insert(i, None);
                        open.insert(e.addr, i);
                    }
                }
                TraceAction::FreeCompleted => {
                    if let Some(request) = open.remove(&e.addr) {
                        deferred.requested.insert(request, Some(i));
                        deferred.completed.insert(i, request);
                    }
                }
                _ => {}
            }
        }
        deferred
    }

    /// Whether the free requested at entry `request` completed later, if at all: `Some` with
    /// the stream whose work it waits for (one that never ends for a free never completed).
    #[inline]
    pub(super) fn stream_of_request(&self, request: usize) -> Option<StreamId> {
        self.requested.get(&request).map(|completion| completion.map_or(StreamId(u64::MAX), synthetic_stream))
    }

    /// For the `free_completed` entry `completion` of a deferred free: the index of its
    /// `free_requested` entry and the stream whose work it waited for; `None` for a free that
    /// completed at once.
    #[inline]
    pub(super) fn completion(&self, completion: usize) -> Option<(usize, StreamId)> {
        self.completed.get(&completion).map(|&request| (request, synthetic_stream(completion)))
    }
}

/// The `free_completed` entries right after the `snapshot` entry `trace[at]` of a call that
/// synchronizes (`empty_cache`): the deferred frees its synchronization completed.
pub(super) fn synchronized_completions(trace: &[TraceEntry], at: usize) -> std::ops::Range<usize> {
    let completed = trace[at + 1..].iter().take_while(|n| n.action == TraceAction::FreeCompleted).count();
    at + 1..at + 1 + completed
}

/// The trace's VA reservations, indexed for the question asked at every out-of-memory entry
/// (which of them the failing request made; `inference::oom_reservation_addresses`): by the
/// stream and pool of the request that started them, and when each one's range was last taken
/// by an earlier one.
pub(super) struct ShownReservations {
    all: Vec<TraceReservation>,
    /// Indices into `all` by (stream of the first `segment_map`, small pool), in trace order.
    by_owner: FxHashMap<(StreamId, bool), Vec<usize>>,
    /// For each reservation, the last entry at which a reservation started before it and
    /// overlapping its range was still live (0 if none): its range was free of others from
    /// every later entry on until it started.
    blocked_until: Vec<usize>,
}

impl ShownReservations {
    fn new(trace: &[TraceEntry], all: Vec<TraceReservation>) -> Self {
        let mut by_owner: FxHashMap<(StreamId, bool), Vec<usize>> = FxHashMap::default();
        for (n, r) in all.iter().enumerate() {
            by_owner.entry((trace[r.from].stream, r.small)).or_default().push(n);
        }
        // Earlier reservations by base and pool (which fixes their extent): the latest end.
        let longest = all.iter().map(|r| r.end - r.base).max().unwrap_or(0);
        let mut earlier: BTreeMap<(u64, bool), (u64, usize)> = BTreeMap::new();
        let mut blocked_until = Vec::with_capacity(all.len());
        for r in &all {
            let mut blocked = 0;
            for (&(base, _), &(end, until)) in earlier.range(..(r.end, false)).rev() {
                if base.saturating_add(longest) <= r.base {
                    break;
                }
                if end > r.base {
                    blocked = blocked.max(until);
                }
            }
            blocked_until.push(blocked);
            let slot = earlier.entry((r.base, r.small)).or_insert((r.end, 0));
            slot.1 = slot.1.max(r.until);
        }
        ShownReservations { all, by_owner, blocked_until }
    }

    /// The base addresses of the reservations, in the order the trace starts them.
    pub(super) fn bases(&self) -> impl Iterator<Item = u64> + '_ {
        self.all.iter().map(|r| r.base)
    }

    /// The reservations of `stream` and the pool (small or not) that the trace starts after
    /// entry `at`, in order, each as its base address and the last entry at which an earlier
    /// reservation still held part of its range; `None` if there are none.
    pub(super) fn of_stream_and_pool(
        &self,
        stream: StreamId,
        small: bool,
        at: usize,
    ) -> Option<impl Iterator<Item = (u64, usize)> + '_> {
        let list = self.by_owner.get(&(stream, small))?;
        let first = list.partition_point(|&n| self.all[n].from <= at);
        (first < list.len()).then(|| list[first..].iter().map(|&n| (self.all[n].base, self.blocked_until[n])))
    }
}

/// Whether the deferred completion `trace[i]` follows a release of the same malloc (garbage
/// collection, or the one oversize block the retry chain frees first): then the stream's work
/// was still pending when the malloc searched its pool, and only the retry chain's
/// `release_cached_blocks`, which synchronizes first, completed it. Where the program's calls
/// are known, no `empty_cache` call explains such a release.
pub(super) fn completes_in_retry_chain(trace: &[TraceEntry], i: usize) -> bool {
    trace[..i]
        .iter()
        .rev()
        .find(|n| n.action != TraceAction::FreeCompleted)
        .is_some_and(|n| matches!(n.action, TraceAction::SegmentFree | TraceAction::SegmentUnmap))
}

fn synthetic_stream(completion: usize) -> StreamId {
    StreamId(SYNTHETIC_STREAMS + completion as u64)
}

/// After the deferred completions of a synchronization, these actions mean a malloc or a
/// release follows; anything else means the program called `empty_cache` and nothing was freed.
pub(super) fn ends_sync_run(action: TraceAction) -> bool {
    matches!(
        action,
        TraceAction::Alloc
            | TraceAction::SegmentAlloc
            | TraceAction::SegmentMap
            | TraceAction::Oom
            | TraceAction::SegmentFree
            | TraceAction::SegmentUnmap
    )
}

/// A VA reservation as the trace shows it: from the `segment_map` that started it to the
/// `segment_unmap` that left nothing mapped in it (when PyTorch released it).
#[derive(Clone, Copy, Debug)]
struct TraceReservation {
    /// Its base address.
    base: u64,
    /// The end of its extent.
    end: u64,
    /// Whether it serves the small pool (else the large one).
    small: bool,
    /// Index of its first `segment_map`.
    from: usize,
    /// Index of the `segment_unmap` that released it; the trace's length if it outlived it.
    until: usize,
}

/// The addresses the recording's device gave new segments, in order, and the VA reservations
/// it shows.
///
/// A `segment_map` inside a live reservation extends it; any other starts a new one. Like
/// PyTorch's `ExpandableSegment`, each reservation spans 1 1/8 of the device in pages of its
/// pool (2 MiB for the small pool, `large_segment_size` for the large one), so the extents of a
/// small and a large reservation differ, and the driver may place the next reservation closer
/// to a small one than a large one's extent: which pool a reservation serves is told by the
/// request that mapped its first page.
pub(super) fn planned_addresses(trace: &[TraceEntry], options: &ReplayOptions) -> (Vec<u64>, ShownReservations) {
    let total = options.device_total;
    let extent = |page: u64| (total + total / 8).div_ceil(page) * page;
    let (small_extent, large_extent) = (extent(SMALL_BUFFER), extent(options.config.large_segment_size()));
    let mut segments = Vec::new();
    let mut shown: Vec<TraceReservation> = Vec::new();
    // Live reservations: base -> (mapped bytes, index in `shown`). A reservation whose last
    // page is unmapped is released by PyTorch at once, so its VA may come back as a new one.
    let mut live: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            TraceAction::SegmentAlloc => segments.push(e.addr),
            TraceAction::SegmentMap => {
                let owner =
                    live.range(..=e.addr).next_back().filter(|(_, (_, n))| e.addr < shown[*n].end).map(|(b, _)| *b);
                let base = owner.unwrap_or_else(|| {
                    let request =
                        trace[i + 1..].iter().find(|n| matches!(n.action, TraceAction::Alloc | TraceAction::Oom));
                    let small = request.is_some_and(|r| r.size <= SMALL_SIZE);
                    let end = e.addr.saturating_add(if small { small_extent } else { large_extent });
                    shown.push(TraceReservation { base: e.addr, end, small, from: i, until: trace.len() });
                    live.insert(e.addr, (0, shown.len() - 1));
                    e.addr
                });
                if let Some((mapped, _)) = live.get_mut(&base) {
                    *mapped = mapped.saturating_add(e.size);
                }
            }
            TraceAction::SegmentUnmap => {
                let owner = live.range(..=e.addr).next_back().map(|(b, _)| *b);
                if let Some(base) = owner
                    && let Some((mapped, n)) = live.get_mut(&base)
                {
                    *mapped = mapped.saturating_sub(e.size);
                    if *mapped == 0 {
                        shown[*n].until = i;
                        live.remove(&base);
                    }
                }
            }
            _ => {}
        }
    }
    (segments, ShownReservations::new(trace, shown))
}
