//! Where a run peaks, and what holds the memory at any moment: the live bytes grouped by the
//! stack that allocated them (memory_viz's "memory by stack"), and the fragmentation — reserved
//! minus allocated bytes — split into the cached free blocks by size class and the segments that
//! hold them.
//!
//! Everything here is computed from the rebuilt state at one cursor position ([`PoolState`]),
//! so the numbers add up to that state's `memory_stats()`: the groups' bytes to
//! `allocated_bytes`, the free and pending-free blocks to `reserved_bytes − allocated_bytes`.

use std::collections::HashMap;

use cachalot_core::size::PoolKind;
use cachalot_core::{BlockState, ContextId, StreamId};

use super::{PoolState, Run};

/// The first cursor position of each kind of peak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peaks {
    /// Most allocated bytes.
    pub allocated: usize,
    /// Most reserved bytes.
    pub reserved: usize,
    /// Most reserved bytes not allocated (cached free and pending free).
    pub fragmentation: usize,
}

/// Which peak to jump to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeakKind {
    /// `memory_allocated()`.
    Allocated,
    /// `memory_reserved()`.
    Reserved,
    /// `memory_reserved() − memory_allocated()`.
    Fragmentation,
}

impl PeakKind {
    /// Every kind, in the order the buttons show them.
    pub const ALL: [PeakKind; 3] = [PeakKind::Allocated, PeakKind::Reserved, PeakKind::Fragmentation];

    /// The button's label.
    pub fn label(self) -> &'static str {
        match self {
            PeakKind::Allocated => "allocated",
            PeakKind::Reserved => "reserved",
            PeakKind::Fragmentation => "fragmentation",
        }
    }
}

impl Peaks {
    /// The peaks of `run` (one pass over its byte series).
    pub fn of(run: &Run) -> Self {
        let allocated = run.allocated.values();
        let reserved = run.reserved.values();
        let first_max = |values: &mut dyn Iterator<Item = u64>| {
            let mut best = (0, 0);
            for (i, v) in values.enumerate() {
                if v > best.1 {
                    best = (i, v);
                }
            }
            best.0
        };
        Peaks {
            allocated: first_max(&mut allocated.iter().copied()),
            reserved: first_max(&mut reserved.iter().copied()),
            fragmentation: first_max(&mut reserved.iter().zip(allocated).map(|(r, a)| r.saturating_sub(*a))),
        }
    }

    /// The position of one kind of peak.
    pub fn get(&self, kind: PeakKind) -> usize {
        match kind {
            PeakKind::Allocated => self.allocated,
            PeakKind::Reserved => self.reserved,
            PeakKind::Fragmentation => self.fragmentation,
        }
    }
}

/// The allocated blocks of one stack at a moment.
#[derive(Clone, Debug, PartialEq)]
pub struct StackGroup {
    /// The stack (`None`: allocations recorded without one).
    pub context: Option<ContextId>,
    /// Bytes of its allocated blocks.
    pub bytes: u64,
    /// Number of its allocated blocks.
    pub blocks: usize,
    /// `bytes` as a fraction of all allocated bytes.
    pub share: f64,
}

/// The allocated blocks of `state` grouped by the stack that allocated them, largest first
/// (ties by stack id, so the order is stable). Their bytes add up to `allocated_bytes`.
pub fn memory_by_stack(state: &PoolState) -> Vec<StackGroup> {
    let mut groups: HashMap<Option<ContextId>, (u64, usize)> = HashMap::new();
    let mut total = 0u64;
    for block in state.segments.values().flat_map(|s| &s.blocks) {
        if block.state == BlockState::ActiveAllocated {
            let g = groups.entry(block.context).or_default();
            g.0 += block.size;
            g.1 += 1;
            total += block.size;
        }
    }
    let mut groups: Vec<StackGroup> = groups
        .into_iter()
        .map(|(context, (bytes, blocks))| StackGroup {
            context,
            bytes,
            blocks,
            share: if total == 0 { 0.0 } else { bytes as f64 / total as f64 },
        })
        .collect();
    groups.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.context.cmp(&b.context)));
    groups
}

/// The upper bounds of the fragmentation table's size classes (the last class is unbounded):
/// the small pool's blocks (≤ 1 MiB), the large pool's up to its rounding steps, and larger.
pub const SIZE_CLASSES: [(u64, &str); 6] = [
    (4 << 10, "< 4 KiB"),
    (1 << 20, "4 KiB – 1 MiB"),
    (2 << 20, "1 – 2 MiB"),
    (10 << 20, "2 – 10 MiB"),
    (100 << 20, "10 – 100 MiB"),
    (u64::MAX, "≥ 100 MiB"),
];

/// Cached free blocks of one size class.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SizeClass {
    /// The class's label ([`SIZE_CLASSES`]).
    pub label: &'static str,
    /// Blocks.
    pub blocks: usize,
    /// Bytes.
    pub bytes: u64,
}

/// A segment with free bytes in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentFree {
    /// Address.
    pub address: u64,
    /// Bytes of the segment.
    pub size: u64,
    /// Its stream.
    pub stream: StreamId,
    /// Its pool.
    pub pool: PoolKind,
    /// Bytes of its cached free blocks.
    pub free: u64,
    /// Number of its cached free blocks.
    pub free_blocks: usize,
    /// Its largest free block.
    pub largest: u64,
    /// Bytes of its blocks freed by the user but waiting for other streams.
    pub pending: u64,
}

/// Reserved bytes not allocated at a moment, and where they are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fragmentation {
    /// `reserved_bytes`.
    pub reserved: u64,
    /// `allocated_bytes`.
    pub allocated: u64,
    /// Bytes of cached free blocks.
    pub cached_free: u64,
    /// Bytes of blocks freed but waiting for other streams' events.
    pub pending_free: u64,
    /// The cached free blocks by size class, smallest class first (every class, empty or not).
    pub by_size_class: Vec<SizeClass>,
    /// Segments holding free or pending-free bytes, most free bytes first.
    pub segments: Vec<SegmentFree>,
}

impl Fragmentation {
    /// The fragmentation of `state`. `cached_free + pending_free = reserved − allocated`.
    pub fn of(state: &PoolState) -> Self {
        let mut f = Fragmentation {
            reserved: state.stats.reserved_bytes.all().current.max(0) as u64,
            allocated: state.stats.allocated_bytes.all().current.max(0) as u64,
            by_size_class: SIZE_CLASSES.iter().map(|&(_, label)| SizeClass { label, ..SizeClass::default() }).collect(),
            ..Fragmentation::default()
        };
        for segment in state.segments.values() {
            let mut s = SegmentFree {
                address: segment.address,
                size: segment.size,
                stream: segment.stream,
                pool: segment.pool,
                free: 0,
                free_blocks: 0,
                largest: 0,
                pending: 0,
            };
            for block in &segment.blocks {
                match block.state {
                    BlockState::Inactive => {
                        s.free += block.size;
                        s.free_blocks += 1;
                        s.largest = s.largest.max(block.size);
                        let class = SIZE_CLASSES.iter().position(|&(upper, _)| block.size < upper).unwrap_or(0);
                        f.by_size_class[class].blocks += 1;
                        f.by_size_class[class].bytes += block.size;
                    }
                    BlockState::ActivePendingFree => s.pending += block.size,
                    BlockState::ActiveAllocated => {}
                }
            }
            f.cached_free += s.free;
            f.pending_free += s.pending;
            if s.free + s.pending > 0 {
                f.segments.push(s);
            }
        }
        f.segments.sort_by(|a, b| (b.free + b.pending).cmp(&(a.free + a.pending)).then(a.address.cmp(&b.address)));
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Rules, RunKind, StateCache};
    use cachalot_core::{AllocatorConfig, CachingAllocator, Frame, SimBackend};

    /// Three stacks with known live bytes at the end: 40 MiB, 24 MiB, 8 MiB (all multiples of
    /// the 2 MiB rounding, so block sizes equal the requests), plus freed blocks that leave
    /// cached free memory behind.
    fn known_stacks() -> (Run, [ContextId; 3]) {
        let mut a = CachingAllocator::new(SimBackend::new(1 << 32), AllocatorConfig::default()).unwrap();
        a.record_history(true, usize::MAX, &[], false);
        let frame = |name: &str| Frame { filename: "train.py".into(), line: 1, name: name.into() };
        let ids = [
            a.intern_context(&[frame("weights"), frame("main")]),
            a.intern_context(&[frame("activations"), frame("main")]),
            a.intern_context(&[frame("gradients"), frame("main")]),
        ];
        let mib = 1u64 << 20;
        let mut freed = Vec::new();
        for (id, sizes) in ids.iter().zip([[20 * mib, 20 * mib], [12 * mib, 12 * mib], [4 * mib, 4 * mib]]) {
            a.set_context(Some(*id));
            for size in sizes {
                a.malloc(size, StreamId::DEFAULT).unwrap();
                freed.push(a.malloc(size / 2, StreamId::DEFAULT).unwrap());
            }
        }
        for x in freed {
            a.free(x).unwrap();
        }
        let mut run = Run::new("stacks", RunKind::Cachalot, Rules::default());
        run.trace = a.trace();
        run.contexts = a.contexts().clone();
        run.build(true, |_, _| {});
        (run, ids)
    }

    #[test]
    fn known_stacks_give_known_shares_that_add_up_to_the_allocated_bytes() {
        let (run, ids) = known_stacks();
        let mut cache = StateCache::default();
        let state = run.seek(&mut cache, run.end());
        let groups = memory_by_stack(state);
        let mib = 1u64 << 20;
        let got: Vec<_> = groups.iter().map(|g| (g.context, g.bytes, g.blocks)).collect();
        assert_eq!(got, vec![(Some(ids[0]), 40 * mib, 2), (Some(ids[1]), 24 * mib, 2), (Some(ids[2]), 8 * mib, 2)]);
        let shares: Vec<_> = groups.iter().map(|g| (g.share * 72.0).round() as u64).collect();
        assert_eq!(shares, vec![40, 24, 8], "shares of 72 MiB");
        let allocated = state.stats.allocated_bytes.all().current as u64;
        assert_eq!(groups.iter().map(|g| g.bytes).sum::<u64>(), allocated);
        assert!((groups.iter().map(|g| g.share).sum::<f64>() - 1.0).abs() < 1e-12);
        // At every moment, not only the end.
        for p in (0..=run.end()).step_by(3) {
            let state = run.seek(&mut cache, p);
            let sum: u64 = memory_by_stack(state).iter().map(|g| g.bytes).sum();
            assert_eq!(sum, run.allocated.at(p), "at {p}");
        }
    }

    #[test]
    fn fragmentation_splits_reserved_minus_allocated() {
        let (run, _) = known_stacks();
        let mut cache = StateCache::default();
        for p in 0..=run.end() {
            let f = Fragmentation::of(run.seek(&mut cache, p));
            assert_eq!(f.cached_free + f.pending_free, f.reserved - f.allocated, "at {p}");
            assert_eq!(f.by_size_class.iter().map(|c| c.bytes).sum::<u64>(), f.cached_free);
            assert_eq!(f.segments.iter().map(|s| s.free + s.pending).sum::<u64>(), f.cached_free + f.pending_free);
        }
        let f = Fragmentation::of(run.seek(&mut cache, run.end()));
        // One stream: nothing waits for events, every freed byte is cached.
        assert_eq!(f.pending_free, 0);
        assert_eq!(f.cached_free, f.reserved - f.allocated);
        // The 10 MiB halves freed their own segments: a class of at least two 10 MiB blocks.
        assert!(f.by_size_class[4].blocks >= 2, "{:?}", f.by_size_class);
        assert!(f.segments.windows(2).all(|w| w[0].free >= w[1].free), "most free bytes first");
        assert!(f.segments.iter().all(|s| s.largest <= s.free && s.free <= s.size));
    }

    #[test]
    fn peaks_are_the_first_maxima() {
        let (run, _) = known_stacks();
        let peaks = Peaks::of(&run);
        let max = run.allocated.values().iter().max().unwrap();
        assert_eq!(run.allocated.at(peaks.allocated), *max);
        assert!(run.allocated.values()[..peaks.allocated].iter().all(|v| v < max));
        let fragmentation = |p: usize| run.reserved.at(p) - run.allocated.at(p);
        let most = (0..=run.end()).map(fragmentation).max().unwrap();
        assert_eq!(fragmentation(peaks.fragmentation), most);
        assert_eq!(fragmentation(run.end()), most, "the frees at the end leave the most cached");
        assert_eq!(peaks.get(PeakKind::Reserved), peaks.reserved);
    }
}
