//! `memory_stats()`: PyTorch's counters, their update rules and the 122 flattened keys
//! (`docs/allocator-rules.md` §16).

use std::collections::BTreeMap;

use crate::size::PoolKind;

mod counters;

pub(crate) use counters::Counters;

/// One counter with PyTorch's four readings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Stat {
    /// The value now.
    pub current: i64,
    /// The highest `current` since the last peak reset.
    pub peak: i64,
    /// The sum of all increases since the last accumulated reset.
    pub allocated: i64,
    /// The sum of all decreases since the last accumulated reset.
    pub freed: i64,
}

impl Stat {
    /// `increase(n)`: current, peak and allocated move.
    #[inline]
    pub fn increase(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current += amount;
        self.peak = self.peak.max(self.current);
        self.allocated += amount;
    }

    /// `decrease(n)`: current and freed move; the peak stays.
    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current -= amount;
        self.freed += amount;
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// Which bucket of a [`StatArray`]: every update goes to `All` and to one pool bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatType {
    /// Both pools (`all`).
    All = 0,
    /// The small pool (`small_pool`).
    SmallPool = 1,
    /// The large pool (`large_pool`).
    LargePool = 2,
}

impl StatType {
    const ALL: [StatType; 3] = [StatType::All, StatType::SmallPool, StatType::LargePool];

    /// The key PyTorch uses in `memory_stats()`.
    pub fn key(self) -> &'static str {
        match self {
            StatType::All => "all",
            StatType::SmallPool => "small_pool",
            StatType::LargePool => "large_pool",
        }
    }
}

/// A [`Stat`] per [`StatType`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// The bucket for `kind`.
    pub fn get(&self, kind: StatType) -> &Stat {
        &self.0[kind as usize]
    }

    /// The `all` bucket.
    pub fn all(&self) -> &Stat {
        &self.0[0]
    }

    /// Increases `all` and the bucket of `pool`.
    #[inline]
    pub fn increase(&mut self, pool: PoolKind, amount: u64) {
        self.0[0].increase(amount);
        self.0[pool_index(pool)].increase(amount);
    }

    /// Decreases `all` and the bucket of `pool`.
    #[inline]
    pub fn decrease(&mut self, pool: PoolKind, amount: u64) {
        self.0[0].decrease(amount);
        self.0[pool_index(pool)].decrease(amount);
    }

    /// Moves `all` and the bucket of `pool` by a signed net amount, as one increase or one
    /// decrease: PyTorch applies the net change of a merge this way, which keeps `allocated`
    /// and `freed` different from two separate updates.
    #[inline]
    pub fn add(&mut self, pool: PoolKind, delta: i64) {
        <Self as Family>::add(self, pool, delta);
    }

    fn for_each(&mut self, f: impl Fn(&mut Stat)) {
        self.0.iter_mut().for_each(f);
    }
}

/// A family of counters (`allocation`, `reserved_bytes`, ...) as a layout keeps it: a
/// [`StatArray`] in [`MemoryStats`], a tally of fewer fields in the allocator's [`Counters`].
pub(crate) trait Family {
    /// `all` and the bucket of `pool` rise by `amount`.
    fn increase(&mut self, pool: PoolKind, amount: u64);
    /// `all` and the bucket of `pool` fall by `amount`.
    fn decrease(&mut self, pool: PoolKind, amount: u64);

    /// A signed net change as one increase or one decrease ([`StatArray::add`]).
    #[inline]
    fn add(&mut self, pool: PoolKind, delta: i64) {
        if delta > 0 {
            self.increase(pool, delta as u64);
        } else if delta < 0 {
            self.decrease(pool, delta.unsigned_abs());
        }
    }
}

impl Family for StatArray {
    #[inline]
    fn increase(&mut self, pool: PoolKind, amount: u64) {
        StatArray::increase(self, pool, amount);
    }

    #[inline]
    fn decrease(&mut self, pool: PoolKind, amount: u64) {
        StatArray::decrease(self, pool, amount);
    }
}

/// The counters PyTorch's update rules move, borrowed from one layout (every family but `active`
/// and `active_bytes`, which [`Counters`] derives): the rules are written once, here, for both.
pub(crate) struct Families<'a, F: Family> {
    pub(crate) allocation: &'a mut F,
    pub(crate) segment: &'a mut F,
    pub(crate) inactive_split: &'a mut F,
    pub(crate) allocated_bytes: &'a mut F,
    pub(crate) reserved_bytes: &'a mut F,
    pub(crate) inactive_split_bytes: &'a mut F,
    pub(crate) requested_bytes: &'a mut F,
    pub(crate) oversize_allocations: &'a mut Stat,
    pub(crate) oversize_segments: &'a mut Stat,
    pub(crate) num_device_alloc: &'a mut u64,
    pub(crate) num_device_free: &'a mut u64,
}

impl<F: Family> Families<'_, F> {
    /// A block of `size` bytes handed out for `requested`.
    #[inline]
    pub(crate) fn alloc(self, pool: PoolKind, size: u64, requested: u64, oversize: bool) {
        self.allocation.increase(pool, 1);
        self.allocated_bytes.increase(pool, size);
        self.requested_bytes.increase(pool, requested);
        if oversize {
            self.oversize_allocations.increase(1);
        }
    }

    /// The inactive split blocks when a free block of `block_size` bytes, in a segment that was
    /// `already_split`, serves `rounded` bytes and is `split` or not; none for expandable
    /// segments, whose free pages can always be released.
    #[inline]
    pub(crate) fn split_on_alloc(
        self,
        pool: PoolKind,
        expandable: bool,
        already_split: bool,
        split: bool,
        block_size: u64,
        rounded: u64,
    ) {
        let (blocks, bytes) = match (expandable, split, already_split) {
            (true, _, _) | (false, false, false) => return,
            // An inactive split block shrinks by the carved size.
            (false, true, true) => (0, -(rounded as i64)),
            // A new inactive split block appears.
            (false, true, false) => (1, (block_size - rounded) as i64),
            // The whole inactive split block is handed out.
            (false, false, true) => (-1, -(block_size as i64)),
        };
        self.inactive_split.add(pool, blocks);
        self.inactive_split_bytes.add(pool, bytes);
    }

    /// A block of `size` bytes free-requested: no longer allocated.
    #[inline]
    pub(crate) fn free_requested(self, pool: PoolKind, size: u64, oversize: bool) {
        self.allocation.decrease(pool, 1);
        self.allocated_bytes.decrease(pool, size);
        if oversize {
            self.oversize_allocations.decrease(1);
        }
    }

    /// A free completed: its requested bytes go, and the inactive split blocks change by the
    /// net effect of its merges.
    #[inline]
    pub(crate) fn free_completed(self, pool: PoolKind, requested: u64, split_net: Option<(i64, i64)>) {
        if let Some((net_blocks, net_bytes)) = split_net {
            self.inactive_split.add(pool, net_blocks);
            self.inactive_split_bytes.add(pool, net_bytes);
        }
        self.requested_bytes.decrease(pool, requested);
    }

    /// A device allocation (or page mapping, no `segment`) of `size` bytes.
    #[inline]
    pub(crate) fn device_alloc(self, pool: PoolKind, size: u64, segment: bool, oversize: bool) {
        if segment {
            self.segment.increase(pool, 1);
            if oversize {
                self.oversize_segments.increase(1);
            }
        }
        self.reserved_bytes.increase(pool, size);
        *self.num_device_alloc += 1;
    }

    /// A device free (or page unmapping), the reverse of [`Families::device_alloc`].
    #[inline]
    pub(crate) fn device_free(self, pool: PoolKind, size: u64, segment: bool, oversize: bool) {
        if segment {
            self.segment.decrease(pool, 1);
            if oversize {
                self.oversize_segments.decrease(1);
            }
        }
        self.reserved_bytes.decrease(pool, size);
        *self.num_device_free += 1;
    }
}

#[inline]
fn pool_index(pool: PoolKind) -> usize {
    match pool {
        PoolKind::Small => StatType::SmallPool as usize,
        PoolKind::Large => StatType::LargePool as usize,
    }
}

/// Everything `torch.cuda.memory_stats()` reports for one device.
///
/// Each family is a [`StatArray`] with PyTorch's three buckets (`all`, `small_pool`,
/// `large_pool`), each bucket a [`Stat`] (`current`, `peak`, `allocated`, `freed`);
/// [`MemoryStats::to_flat`] gives the dictionary `memory_stats()` returns, key for key.
///
/// ```
/// use cachalot_core::stats::StatType;
/// use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
///
/// let mut allocator = CachingAllocator::new(SimBackend::new(80 << 30), AllocatorConfig::default())?;
/// let x = allocator.malloc(3 << 20, StreamId::DEFAULT)?; // a 20 MiB segment of the large pool
/// allocator.free(x)?;
/// let stats = allocator.stats();
/// assert_eq!(stats.allocated_bytes.all().peak, 3 << 20);
/// assert_eq!(stats.reserved_bytes.get(StatType::LargePool).current, 20 << 20);
/// assert_eq!(stats.to_flat()["segment.all.current"], 1);
/// assert_eq!(stats.to_flat().len(), cachalot_core::stats::MEMORY_STATS_KEYS);
/// # Ok::<(), cachalot_core::AllocatorError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemoryStats {
    /// Blocks handed to users and not yet free-requested.
    pub allocation: StatArray,
    /// Device allocations (cudaMalloc'd segments; expandable segments are not counted).
    pub segment: StatArray,
    /// Blocks allocated or waiting for their cross-stream events.
    pub active: StatArray,
    /// Free blocks that are part of a split segment (non-releasable).
    pub inactive_split: StatArray,
    /// Bytes of [`MemoryStats::allocation`] blocks (rounded sizes).
    pub allocated_bytes: StatArray,
    /// Bytes held from the device (segments + mapped pages).
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks.
    pub active_bytes: StatArray,
    /// Bytes of inactive split blocks.
    pub inactive_split_bytes: StatArray,
    /// Bytes originally requested by active blocks.
    pub requested_bytes: StatArray,
    /// Allocations of at least `max_split_size`.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size`.
    pub oversize_segments: Stat,
    /// Times the allocator released the whole cache and retried a device allocation.
    pub num_alloc_retries: u64,
    /// Out-of-memory errors raised.
    pub num_ooms: u64,
    /// Times every outstanding event was waited for (`synchronize_and_free_events`).
    pub num_sync_all_streams: u64,
    /// Device allocations and page mappings.
    pub num_device_alloc: u64,
    /// Device frees and page unmappings.
    pub num_device_free: u64,
    /// `max_split_size` at construction, `-1` when unlimited.
    pub max_split_size: i64,
}

/// The nine stat arrays in PyTorch's nesting order, with their key names.
const ARRAYS: [&str; 9] = [
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
];

/// Number of keys in the flattened `memory_stats()` of PyTorch 2.11.
pub const MEMORY_STATS_KEYS: usize = 122;

impl MemoryStats {
    /// The stat array called `name` in `memory_stats()` (e.g. `"reserved_bytes"`).
    pub fn array(&self, name: &str) -> Option<&StatArray> {
        Some(match name {
            "allocation" => &self.allocation,
            "segment" => &self.segment,
            "active" => &self.active,
            "inactive_split" => &self.inactive_split,
            "allocated_bytes" => &self.allocated_bytes,
            "reserved_bytes" => &self.reserved_bytes,
            "active_bytes" => &self.active_bytes,
            "inactive_split_bytes" => &self.inactive_split_bytes,
            "requested_bytes" => &self.requested_bytes,
            _ => return None,
        })
    }

    fn array_mut(&mut self, name: &str) -> Option<&mut StatArray> {
        Some(match name {
            "allocation" => &mut self.allocation,
            "segment" => &mut self.segment,
            "active" => &mut self.active,
            "inactive_split" => &mut self.inactive_split,
            "allocated_bytes" => &mut self.allocated_bytes,
            "reserved_bytes" => &mut self.reserved_bytes,
            "active_bytes" => &mut self.active_bytes,
            "inactive_split_bytes" => &mut self.inactive_split_bytes,
            "requested_bytes" => &mut self.requested_bytes,
            _ => return None,
        })
    }

    /// `memory_allocated()`.
    pub fn memory_allocated(&self) -> u64 {
        self.allocated_bytes.all().current as u64
    }

    /// `memory_reserved()`.
    pub fn memory_reserved(&self) -> u64 {
        self.reserved_bytes.all().current as u64
    }

    /// `max_memory_allocated()`.
    pub fn max_memory_allocated(&self) -> u64 {
        self.allocated_bytes.all().peak as u64
    }

    /// `max_memory_reserved()`.
    pub fn max_memory_reserved(&self) -> u64 {
        self.reserved_bytes.all().peak as u64
    }

    /// Every family but `active` and `active_bytes`, for the shared rules.
    #[inline]
    fn families(&mut self) -> Families<'_, StatArray> {
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

    /// The counters of a block handed out (`alloc_found_block`): `size` is the block's
    /// (rounded) size, `requested` the bytes asked for, `oversize` whether `size` reaches
    /// `max_split_size`.
    #[inline]
    pub fn count_alloc(&mut self, pool: PoolKind, size: u64, requested: u64, oversize: bool) {
        self.families().alloc(pool, size, requested, oversize);
        self.active.increase(pool, 1);
        self.active_bytes.increase(pool, size);
    }

    /// The inactive-split accounting of `alloc_found_block`: a free block of `block_size` bytes,
    /// in a segment that was `already_split`, serves `rounded` bytes and is `split` or not.
    /// Blocks of expandable segments stay out of it: their free pages can always be released.
    #[inline]
    pub fn count_split_on_alloc(
        &mut self,
        pool: PoolKind,
        expandable: bool,
        already_split: bool,
        split: bool,
        block_size: u64,
        rounded: u64,
    ) {
        self.families().split_on_alloc(pool, expandable, already_split, split, block_size, rounded);
    }

    /// The counters of a `free_requested` block of `size` bytes: it is no longer allocated
    /// (still active until its free completes).
    #[inline]
    pub fn count_free_requested(&mut self, pool: PoolKind, size: u64, oversize: bool) {
        self.families().free_requested(pool, size, oversize);
    }

    /// The counters of a completed free (`free_block`): the block of `size` bytes is no longer
    /// active, and the inactive split blocks change by the net effect of its merges
    /// (`net_blocks`, `net_bytes`; none for expandable segments, see
    /// [`MemoryStats::count_split_on_alloc`]).
    #[inline]
    pub fn count_free_completed(&mut self, pool: PoolKind, size: u64, requested: u64, split_net: Option<(i64, i64)>) {
        self.families().free_completed(pool, requested, split_net);
        self.active.decrease(pool, 1);
        self.active_bytes.decrease(pool, size);
    }

    /// The counters of a device allocation of `size` bytes (`cudaMalloc`; for a page mapping of
    /// an expandable segment, which is no segment of its own, only the bytes and the call).
    #[inline]
    pub fn count_device_alloc(&mut self, pool: PoolKind, size: u64, segment: bool, oversize: bool) {
        self.families().device_alloc(pool, size, segment, oversize);
    }

    /// The counters of a device free of `size` bytes (`cudaFree`, or a page unmapping): the
    /// reverse of [`MemoryStats::count_device_alloc`].
    #[inline]
    pub fn count_device_free(&mut self, pool: PoolKind, size: u64, segment: bool, oversize: bool) {
        self.families().device_free(pool, size, segment, oversize);
    }

    /// `reset_peak_memory_stats()`: every peak becomes its current value.
    pub fn reset_peak(&mut self) {
        for name in ARRAYS {
            if let Some(array) = self.array_mut(name) {
                array.for_each(Stat::reset_peak);
            }
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `reset_accumulated_memory_stats()`: allocated/freed sums and the `num_*` counters go
    /// to zero; `max_split_size` stays.
    pub fn reset_accumulated(&mut self) {
        for name in ARRAYS {
            if let Some(array) = self.array_mut(name) {
                array.for_each(Stat::reset_accumulated);
            }
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// The flattened, sorted `memory_stats()` dictionary: 122 keys such as
    /// `"allocated_bytes.all.current"`.
    pub fn to_flat(&self) -> BTreeMap<String, i64> {
        let mut flat = BTreeMap::new();
        for name in ARRAYS {
            let Some(array) = self.array(name) else { continue };
            for kind in StatType::ALL {
                insert_stat(&mut flat, &format!("{name}.{}", kind.key()), array.get(kind));
            }
        }
        insert_stat(&mut flat, "oversize_allocations", &self.oversize_allocations);
        insert_stat(&mut flat, "oversize_segments", &self.oversize_segments);
        for (key, value) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_sync_all_streams", self.num_sync_all_streams),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
        ] {
            flat.insert(key.to_owned(), value as i64);
        }
        flat.insert("max_split_size".to_owned(), self.max_split_size);
        flat
    }

    /// Rebuilds stats from a flattened dictionary (e.g. PyTorch's recorded `memory_stats()`).
    /// Keys that are absent read as zero; unknown keys are an error naming them.
    pub fn from_flat(flat: &BTreeMap<String, i64>) -> Result<Self, String> {
        let mut stats = MemoryStats::default();
        for (key, &value) in flat {
            let parts: Vec<&str> = key.split('.').collect();
            let stat = match parts.as_slice() {
                [name, bucket, field] => {
                    let kind = StatType::ALL
                        .into_iter()
                        .find(|k| k.key() == *bucket)
                        .ok_or_else(|| format!("unknown stat bucket in '{key}'"))?;
                    let array = stats.array_mut(name).ok_or_else(|| format!("unknown stat '{key}'"))?;
                    Some((&mut array.0[kind as usize], *field))
                }
                ["oversize_allocations", field] => Some((&mut stats.oversize_allocations, *field)),
                ["oversize_segments", field] => Some((&mut stats.oversize_segments, *field)),
                [name] => {
                    let counter = match *name {
                        "num_alloc_retries" => &mut stats.num_alloc_retries,
                        "num_ooms" => &mut stats.num_ooms,
                        "num_sync_all_streams" => &mut stats.num_sync_all_streams,
                        "num_device_alloc" => &mut stats.num_device_alloc,
                        "num_device_free" => &mut stats.num_device_free,
                        "max_split_size" => {
                            stats.max_split_size = value;
                            continue;
                        }
                        // Newer PyTorch releases add counters 2.11 does not have.
                        "num_oom_rejections" => continue,
                        _ => return Err(format!("unknown stat '{key}'")),
                    };
                    *counter = value as u64;
                    None
                }
                _ => return Err(format!("unknown stat '{key}'")),
            };
            if let Some((stat, field)) = stat {
                match field {
                    "current" => stat.current = value,
                    "peak" => stat.peak = value,
                    "allocated" => stat.allocated = value,
                    "freed" => stat.freed = value,
                    _ => return Err(format!("unknown stat field in '{key}'")),
                }
            }
        }
        Ok(stats)
    }
}

fn insert_stat(flat: &mut BTreeMap<String, i64>, prefix: &str, stat: &Stat) {
    flat.insert(format!("{prefix}.allocated"), stat.allocated);
    flat.insert(format!("{prefix}.current"), stat.current);
    flat.insert(format!("{prefix}.freed"), stat.freed);
    flat.insert(format!("{prefix}.peak"), stat.peak);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_arithmetic_matches_pytorch() {
        let mut s = Stat::default();
        s.increase(10);
        s.decrease(4);
        s.increase(2);
        assert_eq!(s, Stat { current: 8, peak: 10, allocated: 12, freed: 4 });
        s.reset_peak();
        assert_eq!(s.peak, 8);
        s.reset_accumulated();
        assert_eq!((s.allocated, s.freed, s.current), (0, 0, 8));
    }

    #[test]
    fn flat_dictionary_has_122_sorted_keys_and_round_trips() {
        let mut stats = MemoryStats { max_split_size: -1, ..MemoryStats::default() };
        stats.reserved_bytes.increase(PoolKind::Large, 2 << 20);
        stats.num_ooms = 3;
        let flat = stats.to_flat();
        assert_eq!(flat.len(), MEMORY_STATS_KEYS);
        assert_eq!(flat["reserved_bytes.large_pool.current"], 2 << 20);
        assert_eq!(flat["reserved_bytes.all.peak"], 2 << 20);
        assert_eq!(flat["reserved_bytes.small_pool.current"], 0);
        assert_eq!(flat["max_split_size"], -1);
        assert_eq!(MemoryStats::from_flat(&flat).unwrap(), stats);
        assert!(MemoryStats::from_flat(&BTreeMap::from([("bogus.all.current".into(), 1)])).is_err());
    }
}
