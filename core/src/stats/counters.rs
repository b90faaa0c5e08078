//! The allocator's live counters: what [`MemoryStats`] reports, kept in a layout that a malloc
//! and a free update with a third fewer writes, every reading still PyTorch's to the byte.
//!
//! Why not update a [`MemoryStats`] in place: its rules move ten buckets of three fields on
//! every malloc and ten of two on every free, 52–69 instructions per op on the op files, a
//! tenth of a cache hit (new-c3_00071: 69 of 548). Three facts of those rules let most of the
//! writes go, and [`Counters::to_stats`] computes the same numbers when they are read:
//!
//! - `allocated − freed = current − (current at the last accumulated reset)`, so a bucket's
//!   `allocated` is derived, not summed on every increase.
//! - Every update moves `all` and one pool's bucket by the same amount, so `all`'s `freed` (and
//!   the current at its last reset) are the pools' sums: `all` keeps only its current and peak.
//! - `active` is `allocation` plus the blocks whose free waits for events on other streams
//!   (`record_stream`), and `active_bytes` is `allocated_bytes` plus their bytes: both families
//!   rise together, at a malloc, and `active` falls when the wait ends. So only the waiting
//!   blocks are counted. `active`'s peak is `allocation`'s except where it was reached while a
//!   block waited; such peaks are tracked then, off the common path.
//!
//! The rules that move the families both layouts keep are written once, in [`Families`]; what
//! differs is `active`, `active_bytes` and the derived sums. The tests replay random sequences
//! through both layouts and compare every key, after every step.

use super::{Families, Family, MemoryStats, Stat, StatArray};
use crate::size::PoolKind;

/// One pool's bucket of a counter family. `allocated` is `current - base + freed`.
#[derive(Clone, Copy, Debug, Default)]
struct PoolBucket {
    current: i64,
    peak: i64,
    freed: i64,
    /// `current` at the last accumulated reset.
    base: i64,
}

impl PoolBucket {
    fn stat(&self) -> Stat {
        Stat {
            current: self.current,
            peak: self.peak,
            allocated: self.current - self.base + self.freed,
            freed: self.freed,
        }
    }
}

/// A family of counters (`allocation`, `reserved_bytes`, ...): the `all` bucket's current and
/// peak, and a bucket per pool; `all`'s accumulated sums are the pools'.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tally {
    all: i64,
    all_peak: i64,
    pools: [PoolBucket; 2],
}

impl Family for Tally {
    #[inline]
    fn increase(&mut self, pool: PoolKind, amount: u64) {
        let amount = amount as i64;
        self.all += amount;
        self.all_peak = self.all_peak.max(self.all);
        let bucket = &mut self.pools[pool_index(pool)];
        bucket.current += amount;
        bucket.peak = bucket.peak.max(bucket.current);
    }

    #[inline]
    fn decrease(&mut self, pool: PoolKind, amount: u64) {
        let amount = amount as i64;
        self.all -= amount;
        let bucket = &mut self.pools[pool_index(pool)];
        bucket.current -= amount;
        bucket.freed += amount;
    }
}

impl Tally {
    fn current(&self, bucket: usize) -> i64 {
        match bucket {
            0 => self.all,
            pool => self.pools[pool - 1].current,
        }
    }

    fn reset_peak(&mut self) {
        self.all_peak = self.all;
        for bucket in &mut self.pools {
            bucket.peak = bucket.current;
        }
    }

    fn reset_accumulated(&mut self) {
        for bucket in &mut self.pools {
            bucket.freed = 0;
            bucket.base = bucket.current;
        }
    }

    fn stat_array(&self) -> StatArray {
        let [small, large] = self.pools.map(|bucket| bucket.stat());
        let all = Stat {
            current: self.all,
            peak: self.all_peak,
            allocated: small.allocated + large.allocated,
            freed: small.freed + large.freed,
        };
        StatArray([all, small, large])
    }
}

/// The index of `pool` in [`Tally::pools`].
#[inline]
fn pool_index(pool: PoolKind) -> usize {
    match pool {
        PoolKind::Small => 0,
        PoolKind::Large => 1,
    }
}

/// Blocks freed by their user whose free waits for events on other streams: still active,
/// no longer allocated. Per bucket (`all`, small pool, large pool) as in a [`StatArray`].
#[derive(Clone, Copy, Debug, Default)]
struct Waiting {
    blocks: [i64; 3],
    bytes: [i64; 3],
    /// `blocks` and `bytes` at the last accumulated reset.
    base_blocks: [i64; 3],
    base_bytes: [i64; 3],
    /// The highest `active` and `active_bytes` reached while some block waited (or at the last
    /// peak reset): with `allocation`'s and `allocated_bytes`' peaks, the peaks of `active`.
    active_peak: [i64; 3],
    active_bytes_peak: [i64; 3],
}

impl Waiting {
    fn change(&mut self, pool: PoolKind, blocks: i64, bytes: i64) {
        for bucket in [0, 1 + pool_index(pool)] {
            self.blocks[bucket] += blocks;
            self.bytes[bucket] += bytes;
        }
    }

    /// `active` (or `active_bytes`): `family` (`allocation`, `allocated_bytes`) plus the
    /// waiting `extra`, with their bases and the peaks tracked while blocks waited.
    fn active(family: &Tally, extra: &[i64; 3], base: &[i64; 3], peak: &[i64; 3]) -> StatArray {
        let mut array = family.stat_array();
        for (bucket, stat) in array.0.iter_mut().enumerate() {
            // `allocated` is `allocation`'s: both rise by the same amounts.
            stat.current += extra[bucket];
            stat.freed -= extra[bucket] - base[bucket];
            stat.peak = stat.peak.max(peak[bucket]);
        }
        array
    }
}

/// The counters of one device allocator; [`Counters::to_stats`] gives its `memory_stats()`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Counters {
    allocation: Tally,
    segment: Tally,
    inactive_split: Tally,
    allocated_bytes: Tally,
    reserved_bytes: Tally,
    inactive_split_bytes: Tally,
    requested_bytes: Tally,
    waiting: Waiting,
    oversize_allocations: Stat,
    oversize_segments: Stat,
    /// [`MemoryStats::num_alloc_retries`].
    pub(crate) num_alloc_retries: u64,
    /// [`MemoryStats::num_ooms`].
    pub(crate) num_ooms: u64,
    /// [`MemoryStats::num_sync_all_streams`].
    pub(crate) num_sync_all_streams: u64,
    num_device_alloc: u64,
    num_device_free: u64,
    max_split_size: i64,
}

impl Counters {
    /// Zero counters whose stats report `max_split_size` (`-1` when unlimited).
    pub(crate) fn new(max_split_size: i64) -> Self {
        Counters { max_split_size, ..Counters::default() }
    }

    /// `memory_allocated()`.
    #[inline]
    pub(crate) fn memory_allocated(&self) -> u64 {
        self.allocated_bytes.all as u64
    }

    /// `memory_reserved()`.
    #[inline]
    pub(crate) fn memory_reserved(&self) -> u64 {
        self.reserved_bytes.all as u64
    }

    /// `max_memory_allocated()`.
    pub(crate) fn max_memory_allocated(&self) -> u64 {
        self.allocated_bytes.all_peak as u64
    }

    /// `max_memory_reserved()`.
    pub(crate) fn max_memory_reserved(&self) -> u64 {
        self.reserved_bytes.all_peak as u64
    }

    /// Every family the shared rules move: the allocator counts a split, a free request and
    /// a device call through them ([`Families::split_on_alloc`], ...), as [`MemoryStats`] does.
    #[inline]
    pub(crate) fn families(&mut self) -> Families<'_, Tally> {
        Families {
            allocation: &mut self.allocation,
            segment: &mut self.segment,
            inactive_split: &mut self.inactive_split,
            allocated_bytes: &mut self.allocated_bytes,
            reserved_bytes: &mut self.reserved_bytes,
            inactive_split_bytes: &mut self.inactive_split_bytes,
            requested_bytes: &mut self.requested_bytes,
            oversize_allocations: &mut self.oversize_allocations,
            oversize_segments: &mut self.oversize_segments,
            num_device_alloc: &mut self.num_device_alloc,
            num_device_free: &mut self.num_device_free,
        }
    }

    /// [`MemoryStats::count_alloc`].
    #[inline]
    pub(crate) fn count_alloc(&mut self, pool: PoolKind, size: u64, requested: u64, oversize: bool) {
        self.families().alloc(pool, size, requested, oversize);
        // The `all` bucket of the waiting blocks: whether any waits.
        if self.waiting.blocks[0] != 0 {
            self.track_active_peaks();
        }
    }

    /// `active` rose with `allocation` while some block waited, so it may have passed its peak
    /// where `allocation` did not.
    #[cold]
    #[inline(never)]
    fn track_active_peaks(&mut self) {
        for bucket in 0..3 {
            let (active, active_bytes) = self.active_now(bucket);
            let w = &mut self.waiting;
            w.active_peak[bucket] = w.active_peak[bucket].max(active);
            w.active_bytes_peak[bucket] = w.active_bytes_peak[bucket].max(active_bytes);
        }
    }

    /// `active` and `active_bytes` now, in `bucket` (0 `all`, then the pools).
    fn active_now(&self, bucket: usize) -> (i64, i64) {
        let w = &self.waiting;
        (self.allocation.current(bucket) + w.blocks[bucket], self.allocated_bytes.current(bucket) + w.bytes[bucket])
    }

    /// The block of `size` bytes just free-requested waits for events on other streams: it
    /// stays active until [`Counters::count_wait_over`].
    pub(crate) fn count_waiting(&mut self, pool: PoolKind, size: u64) {
        self.waiting.change(pool, 1, size as i64);
    }

    /// The events of a waiting block of `size` bytes have completed; its free completes next
    /// ([`Counters::count_free_completed`]).
    pub(crate) fn count_wait_over(&mut self, pool: PoolKind, size: u64) {
        self.waiting.change(pool, -1, -(size as i64));
    }

    /// [`MemoryStats::count_free_completed`]; `active` falls by itself, as the block is neither
    /// allocated nor waiting any more.
    #[inline]
    pub(crate) fn count_free_completed(&mut self, pool: PoolKind, requested: u64, split_net: Option<(i64, i64)>) {
        self.families().free_completed(pool, requested, split_net);
    }

    fn tallies_mut(&mut self) -> [&mut Tally; 7] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// [`MemoryStats::reset_peak`].
    pub(crate) fn reset_peak(&mut self) {
        self.tallies_mut().into_iter().for_each(Tally::reset_peak);
        for bucket in 0..3 {
            (self.waiting.active_peak[bucket], self.waiting.active_bytes_peak[bucket]) = self.active_now(bucket);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// [`MemoryStats::reset_accumulated`].
    pub(crate) fn reset_accumulated(&mut self) {
        self.tallies_mut().into_iter().for_each(Tally::reset_accumulated);
        self.waiting.base_blocks = self.waiting.blocks;
        self.waiting.base_bytes = self.waiting.bytes;
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// `memory_stats()`, every key computed from the counters.
    pub(crate) fn to_stats(&self) -> MemoryStats {
        let w = &self.waiting;
        MemoryStats {
            allocation: self.allocation.stat_array(),
            segment: self.segment.stat_array(),
            active: Waiting::active(&self.allocation, &w.blocks, &w.base_blocks, &w.active_peak),
            inactive_split: self.inactive_split.stat_array(),
            allocated_bytes: self.allocated_bytes.stat_array(),
            reserved_bytes: self.reserved_bytes.stat_array(),
            active_bytes: Waiting::active(&self.allocated_bytes, &w.bytes, &w.base_bytes, &w.active_bytes_peak),
            inactive_split_bytes: self.inactive_split_bytes.stat_array(),
            requested_bytes: self.requested_bytes.stat_array(),
            oversize_allocations: self.oversize_allocations,
            oversize_segments: self.oversize_segments,
            num_alloc_retries: self.num_alloc_retries,
            num_ooms: self.num_ooms,
            num_sync_all_streams: self.num_sync_all_streams,
            num_device_alloc: self.num_device_alloc,
            num_device_free: self.num_device_free,
            max_split_size: self.max_split_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A block handed out: its pool, size, requested bytes and whether it is oversize.
    type Live = (PoolKind, u64, u64, bool);

    /// One update of the counters, as the allocator makes them.
    #[derive(Clone, Debug)]
    enum Step {
        /// A block handed out, with its split accounting.
        Alloc {
            large: bool,
            size: u64,
            requested: u64,
            oversize: bool,
            split: (bool, bool, bool),
            carved: u64,
        },
        /// The live block at this index (modulo their number) freed at once, with the net
        /// change of its merges.
        Free {
            pick: usize,
            net: Option<(i64, i64)>,
        },
        /// The live block at this index freed, waiting for events.
        FreeWaiting {
            pick: usize,
        },
        /// The waiting block at this index completes its free.
        WaitOver {
            pick: usize,
            net: Option<(i64, i64)>,
        },
        DeviceAlloc {
            large: bool,
            size: u64,
            segment: bool,
            oversize: bool,
        },
        DeviceFree {
            large: bool,
            size: u64,
            segment: bool,
            oversize: bool,
        },
        ResetPeak,
        ResetAccumulated,
    }

    fn pool(large: bool) -> PoolKind {
        if large { PoolKind::Large } else { PoolKind::Small }
    }

    fn step() -> impl Strategy<Value = Step> {
        let net = proptest::option::of((-2i64..3, -4096i64..4096));
        prop_oneof![
            4 => (any::<bool>(), 1u64..1 << 30, 1u64..512, any::<bool>(), any::<(bool, bool, bool)>(), 1u64..512)
                .prop_map(|(large, size, slack, oversize, split, carved)| Step::Alloc {
                    large,
                    size: size + carved,
                    requested: size.saturating_sub(slack).max(1),
                    oversize,
                    split,
                    carved,
                }),
            3 => (any::<usize>(), net.clone()).prop_map(|(pick, net)| Step::Free { pick, net }),
            1 => any::<usize>().prop_map(|pick| Step::FreeWaiting { pick }),
            1 => (any::<usize>(), net).prop_map(|(pick, net)| Step::WaitOver { pick, net }),
            1 => (any::<bool>(), 1u64..1 << 32, any::<bool>(), any::<bool>())
                .prop_map(|(large, size, segment, oversize)| Step::DeviceAlloc { large, size, segment, oversize }),
            1 => (any::<bool>(), 1u64..1 << 32, any::<bool>(), any::<bool>())
                .prop_map(|(large, size, segment, oversize)| Step::DeviceFree { large, size, segment, oversize }),
            1 => Just(Step::ResetPeak),
            1 => Just(Step::ResetAccumulated),
        ]
    }

    proptest! {
        /// Every key of `memory_stats()` from the counters equals PyTorch's rules applied to a
        /// `MemoryStats` in place, after every step of a random run with waiting frees and resets.
        #[test]
        fn counters_read_as_pytorchs_rules(steps in proptest::collection::vec(step(), 1..200)) {
            let mut rules = MemoryStats { max_split_size: 7 << 20, ..MemoryStats::default() };
            let mut counters = Counters::new(7 << 20);
            let mut live: Vec<Live> = Vec::new();
            let mut waiting: Vec<Live> = Vec::new();
            for step in steps {
                match step {
                    Step::Alloc { large, size, requested, oversize, split: (expandable, already, split), carved } => {
                        let pool = pool(large);
                        rules.count_split_on_alloc(pool, expandable, already, split, size, size - carved);
                        counters.families().split_on_alloc(pool, expandable, already, split, size, size - carved);
                        rules.count_alloc(pool, size, requested, oversize);
                        counters.count_alloc(pool, size, requested, oversize);
                        live.push((pool, size, requested, oversize));
                    }
                    Step::Free { pick, net } if !live.is_empty() => {
                        let (pool, size, requested, oversize) = live.swap_remove(pick % live.len());
                        rules.count_free_requested(pool, size, oversize);
                        counters.families().free_requested(pool, size, oversize);
                        rules.count_free_completed(pool, size, requested, net);
                        counters.count_free_completed(pool, requested, net);
                    }
                    Step::FreeWaiting { pick } if !live.is_empty() => {
                        let block = live.swap_remove(pick % live.len());
                        let (pool, size, _, oversize) = block;
                        rules.count_free_requested(pool, size, oversize);
                        counters.families().free_requested(pool, size, oversize);
                        counters.count_waiting(pool, size);
                        waiting.push(block);
                    }
                    Step::WaitOver { pick, net } if !waiting.is_empty() => {
                        let (pool, size, requested, _) = waiting.swap_remove(pick % waiting.len());
                        counters.count_wait_over(pool, size);
                        rules.count_free_completed(pool, size, requested, net);
                        counters.count_free_completed(pool, requested, net);
                    }
                    Step::DeviceAlloc { large, size, segment, oversize } => {
                        rules.count_device_alloc(pool(large), size, segment, oversize);
                        counters.families().device_alloc(pool(large), size, segment, oversize);
                    }
                    Step::DeviceFree { large, size, segment, oversize } => {
                        rules.count_device_free(pool(large), size, segment, oversize);
                        counters.families().device_free(pool(large), size, segment, oversize);
                    }
                    Step::ResetPeak => {
                        rules.reset_peak();
                        counters.reset_peak();
                    }
                    Step::ResetAccumulated => {
                        rules.reset_accumulated();
                        counters.reset_accumulated();
                    }
                    Step::Free { .. } | Step::FreeWaiting { .. } | Step::WaitOver { .. } => {}
                }
                prop_assert_eq!(counters.to_stats(), rules.clone());
                prop_assert_eq!(
                    (counters.memory_allocated(), counters.memory_reserved()),
                    (rules.memory_allocated(), rules.memory_reserved())
                );
                prop_assert_eq!(
                    (counters.max_memory_allocated(), counters.max_memory_reserved()),
                    (rules.max_memory_allocated(), rules.max_memory_reserved())
                );
            }
        }
    }

    #[test]
    fn a_peak_reached_while_a_free_waits_is_actives_alone() {
        let mut counters = Counters::new(-1);
        counters.count_alloc(PoolKind::Large, 4 << 20, 4 << 20, false);
        counters.families().free_requested(PoolKind::Large, 4 << 20, false);
        counters.count_waiting(PoolKind::Large, 4 << 20);
        counters.count_alloc(PoolKind::Large, 2 << 20, 2 << 20, false);
        let stats = counters.to_stats();
        assert_eq!((stats.allocated_bytes.all().peak, stats.active_bytes.all().peak), (4 << 20, 6 << 20));
        assert_eq!((stats.allocation.all().current, stats.active.all().current), (1, 2));
        counters.count_wait_over(PoolKind::Large, 4 << 20);
        counters.count_free_completed(PoolKind::Large, 4 << 20, None);
        let stats = counters.to_stats();
        assert_eq!(stats.active_bytes.all().current, 2 << 20);
        assert_eq!((stats.active.all().allocated, stats.active.all().freed), (2, 1));
        assert_eq!(stats.active_bytes.all().peak, 6 << 20);
    }
}
