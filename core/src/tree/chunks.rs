//! Ordered lists of block ids kept as sorted runs in fixed-size chunks (a two-level B-tree).
//!
//! A busy size class can hold hundreds of free blocks of one size (the 512-byte tails of a
//! random workload): an AVL tree threaded through the blocks then costs a cache miss per level,
//! on blocks scattered over the whole block array. Here a list is a short sorted array of
//! (last key, chunk) entries over chunks of [`CAP`] keys, with the keys stored next to the ids:
//! a search is two binary searches over contiguous memory and never reads a block.
//!
//! Keys are `(size, address)` packed into one `u128` (size in the high half), so the order is
//! PyTorch's and a comparison is one instruction pair. Chunks live in an [`Arena`] shared by all
//! lists of one index and are recycled through its free list, so a warm index allocates nothing.

use super::Key;

/// Keys per chunk. Eight, not more: a shift then copies seven slots and the two binary searches
/// stay short; with sixteen, best fit's take of a list's first key moved fifteen.
pub(crate) const CAP: usize = 8;
/// A chunk this small after a removal is merged into a neighbour when both fit in
/// [`MERGE_LIMIT`] keys; the gap between the two keeps a split and a merge from alternating.
const MERGE_BELOW: usize = CAP / 4;
const MERGE_LIMIT: usize = CAP * 3 / 4;

/// A key as one `u128`, compared like the tuple.
#[inline]
pub(crate) fn pack(key: Key) -> u128 {
    (u128::from(key.0) << 64) | u128::from(key.1)
}

/// Up to `SLOTS / 2` sorted keys and their block ids.
///
/// The upper half of the slots is slack, never holding a live key: it lets a shift copy a fixed
/// number of slots (`SLOTS / 2 - 1`) from any position a key can take. A copy of fixed length
/// is straight-line moves or one `memmove` that always takes the same path, whatever the
/// position; a per-slot loop compiled into a chain of compares on it, which mispredicted on
/// most inserts and on best fit's takes (the measurements are in
/// docs/journal/benchmarks-2026-11.md, section 1, "Then the shifts").
#[derive(Clone, Debug)]
struct Run<const SLOTS: usize> {
    keys: [u128; SLOTS],
    ids: [u32; SLOTS],
    len: usize,
}

/// A chunk of the arena.
type Chunk = Run<{ 2 * CAP }>;

impl<const SLOTS: usize> Run<SLOTS> {
    const EMPTY: Self = Run { keys: [0; SLOTS], ids: [0; SLOTS], len: 0 };
    /// The most keys a run holds.
    const CAPACITY: usize = SLOTS / 2;

    #[inline]
    fn keys(&self) -> &[u128] {
        &self.keys[..self.len]
    }

    /// The position of the first key `>= key`.
    #[inline]
    fn position(&self, key: u128) -> usize {
        self.keys().partition_point(|&k| k < key)
    }

    // The shifts copy `CAPACITY - 1` slots whatever `len` is: what lands past `len` is
    // never read, and the slack keeps the copy inside the array.
    fn insert_at(&mut self, at: usize, key: u128, id: u32) {
        debug_assert!(self.len < Self::CAPACITY && at <= self.len);
        self.keys.copy_within(at..at + Self::CAPACITY - 1, at + 1);
        self.ids.copy_within(at..at + Self::CAPACITY - 1, at + 1);
        self.keys[at] = key;
        self.ids[at] = id;
        self.len += 1;
    }

    fn remove_at(&mut self, at: usize) {
        debug_assert!(at < self.len);
        self.keys.copy_within(at + 1..at + Self::CAPACITY, at);
        self.ids.copy_within(at + 1..at + Self::CAPACITY, at);
        self.len -= 1;
    }

    fn last_key(&self) -> u128 {
        self.keys[self.len - 1]
    }

    /// Inserts `key`, which must not be present, in order.
    fn insert(&mut self, key: u128, id: u32) {
        let at = self.position(key);
        debug_assert!(at == self.len || self.keys[at] != key, "key inserted twice");
        self.insert_at(at, key, id);
    }

    /// Removes `key`; false when it is not here.
    fn remove(&mut self, key: u128) -> bool {
        // Best fit takes a list's smallest block most of the time: found without a search.
        let at = if self.len > 0 && self.keys[0] == key { 0 } else { self.position(key) };
        let found = at < self.len && self.keys[at] == key;
        if found {
            self.remove_at(at);
        }
        found
    }

    /// The first key `>= key` (`strict`: `> key`) and its id.
    #[inline]
    fn first_from(&self, key: u128, strict: bool) -> Option<(u128, u32)> {
        let at = if strict { self.keys().partition_point(|&k| k <= key) } else { self.position(key) };
        (at < self.len).then(|| (self.keys[at], self.ids[at]))
    }

    /// The last key `< key` and its id.
    fn last_before(&self, key: u128) -> Option<(u128, u32)> {
        let at = self.position(key);
        (at > 0).then(|| (self.keys[at - 1], self.ids[at - 1]))
    }

    fn first(&self) -> Option<(u128, u32)> {
        (self.len > 0).then(|| (self.keys[0], self.ids[0]))
    }

    fn last(&self) -> Option<(u128, u32)> {
        (self.len > 0).then(|| (self.keys[self.len - 1], self.ids[self.len - 1]))
    }

    fn extend_into(&self, out: &mut Vec<(Key, u32)>) {
        out.extend(self.keys().iter().zip(&self.ids).map(|(&k, &id)| (((k >> 64) as u64, k as u64), id)));
    }
}

/// The chunks of all lists of one index.
#[derive(Clone, Debug, Default)]
pub(crate) struct Arena {
    chunks: Vec<Chunk>,
    /// Chunks no list uses, reused before the arena grows.
    spare: Vec<u32>,
}

impl Arena {
    fn take(&mut self) -> u32 {
        match self.spare.pop() {
            Some(c) => c,
            None => {
                self.chunks.push(Chunk::EMPTY);
                (self.chunks.len() - 1) as u32
            }
        }
    }

    fn give_back(&mut self, chunk: u32) {
        self.chunks[chunk as usize].len = 0;
        self.spare.push(chunk);
    }

    #[inline]
    fn get(&self, chunk: u32) -> &Chunk {
        &self.chunks[chunk as usize]
    }

    #[inline]
    fn get_mut(&mut self, chunk: u32) -> &mut Chunk {
        &mut self.chunks[chunk as usize]
    }
}

/// A chunk of a list and the largest key in it. The key is kept as two `u64` halves, so an
/// entry takes 24 bytes instead of the 32 a `u128`'s alignment would make it: a long list's
/// entries are searched and shifted as one array.
#[derive(Clone, Copy, Debug)]
struct Entry {
    last_high: u64,
    last_low: u64,
    chunk: u32,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 24);

impl Entry {
    #[inline]
    fn new(last: u128, chunk: u32) -> Self {
        Entry { last_high: (last >> 64) as u64, last_low: last as u64, chunk }
    }

    #[inline]
    fn last(&self) -> u128 {
        (u128::from(self.last_high) << 64) | u128::from(self.last_low)
    }

    #[inline]
    fn set_last(&mut self, last: u128) {
        *self = Entry::new(last, self.chunk);
    }
}

/// One ordered list of (key, id), keys unique.
///
/// Most classes hold a block or two at a time (a 20 MiB segment's tail, the remainder of a
/// split), so a short list lives inline in [`Run`] `small` and touches no chunk; it moves to
/// chunks when it outgrows [`INLINE`] keys and back when a single chunk shrinks to
/// [`INLINE`]` / 2`, so a list that sways around the limit doesn't move at every step.
#[derive(Clone, Debug)]
pub(crate) struct List {
    /// The keys while `entries` is empty.
    small: Run<{ 2 * INLINE }>,
    /// In key order; every chunk holds at least one key.
    entries: Vec<Entry>,
}

/// Keys a list holds without chunks.
const INLINE: usize = 2;

impl Default for List {
    fn default() -> Self {
        List { small: Run::EMPTY, entries: Vec::new() }
    }
}

impl List {
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.small.len == 0 && self.entries.is_empty()
    }

    /// The index of the first entry whose chunk may hold a key `>= key`.
    #[inline]
    fn entry_for(&self, key: u128) -> usize {
        self.entries.partition_point(|e| e.last() < key)
    }

    pub(crate) fn insert(&mut self, arena: &mut Arena, key: Key, id: u32) {
        let key = pack(key);
        if self.entries.is_empty() {
            if self.small.len < INLINE {
                self.small.insert(key, id);
                return;
            }
            // Outgrown: the inline keys become the first chunk.
            let chunk = arena.take();
            let c = arena.get_mut(chunk);
            c.keys[..INLINE].copy_from_slice(&self.small.keys[..INLINE]);
            c.ids[..INLINE].copy_from_slice(&self.small.ids[..INLINE]);
            c.len = INLINE;
            self.small.len = 0;
            self.entries.push(Entry::new(c.last_key(), chunk));
        }
        // A key above every other goes to the end of the last chunk, without the two searches:
        // blocks of one size freed in address order each come after all the others.
        let last = self.entries.len() - 1;
        let append = key > self.entries[last].last();
        let mut i = if append { last } else { self.entry_for(key) };
        if arena.get(self.entries[i].chunk).len == CAP {
            self.split(arena, i);
            if key > self.entries[i].last() {
                i += 1;
            }
        }
        let entry = &mut self.entries[i];
        let chunk = arena.get_mut(entry.chunk);
        match append {
            true => chunk.insert_at(chunk.len, key, id),
            false => chunk.insert(key, id),
        }
        entry.set_last(chunk.last_key());
    }

    /// Moves the upper half of entry `i`'s full chunk into a new chunk after it.
    fn split(&mut self, arena: &mut Arena, i: usize) {
        let upper = arena.take();
        let lower = self.entries[i].chunk;
        let half = CAP / 2;
        let (keys, ids) = {
            let c = arena.get_mut(lower);
            c.len = half;
            (c.keys, c.ids)
        };
        let new = arena.get_mut(upper);
        new.keys[..CAP - half].copy_from_slice(&keys[half..CAP]);
        new.ids[..CAP - half].copy_from_slice(&ids[half..CAP]);
        new.len = CAP - half;
        let upper_last = new.last_key();
        self.entries[i].set_last(keys[half - 1]);
        self.entries.insert(i + 1, Entry::new(upper_last, upper));
    }

    /// Removes `key`; false when it is not in the list.
    pub(crate) fn remove(&mut self, arena: &mut Arena, key: Key) -> bool {
        let key = pack(key);
        if self.entries.is_empty() {
            return self.small.remove(key);
        }
        // Best fit takes a list's smallest key most of the time: its place is known without a
        // search in the entries or the chunk.
        let taken_first = key == arena.get(self.entries[0].chunk).keys[0];
        let i = if taken_first { 0 } else { self.entry_for(key) };
        let only_chunk = self.entries.len() == 1;
        let Some(entry) = self.entries.get_mut(i) else { return false };
        let chunk = arena.get_mut(entry.chunk);
        if taken_first {
            chunk.remove_at(0);
        } else if !chunk.remove(key) {
            return false;
        }
        match chunk.len {
            0 => {
                arena.give_back(entry.chunk);
                self.entries.remove(i);
            }
            len if only_chunk && len <= INLINE / 2 => {
                // Small again: back inline.
                self.small.keys[..len].copy_from_slice(chunk.keys());
                self.small.ids[..len].copy_from_slice(&chunk.ids[..len]);
                self.small.len = len;
                arena.give_back(entry.chunk);
                self.entries.clear();
            }
            len => {
                entry.set_last(chunk.last_key());
                if len < MERGE_BELOW {
                    self.merge_around(arena, i);
                }
            }
        }
        true
    }

    /// Merges entry `i`'s chunk with a neighbour when the two fit in [`MERGE_LIMIT`] keys.
    fn merge_around(&mut self, arena: &mut Arena, i: usize) {
        let len = |e: &Entry| arena.get(e.chunk).len;
        let left = if i + 1 < self.entries.len() && len(&self.entries[i]) + len(&self.entries[i + 1]) <= MERGE_LIMIT {
            i
        } else if i > 0 && len(&self.entries[i - 1]) + len(&self.entries[i]) <= MERGE_LIMIT {
            i - 1
        } else {
            return;
        };
        let (into, from) = (self.entries[left].chunk, self.entries[left + 1].chunk);
        let moved = arena.get(from).clone();
        let target = arena.get_mut(into);
        target.keys[target.len..target.len + moved.len].copy_from_slice(moved.keys());
        target.ids[target.len..target.len + moved.len].copy_from_slice(&moved.ids[..moved.len]);
        target.len += moved.len;
        let last = self.entries[left + 1].last();
        self.entries[left].set_last(last);
        self.entries.remove(left + 1);
        arena.give_back(from);
    }

    /// The first key `>= key` (`strict`: `> key`), packed, and its id.
    #[inline]
    pub(crate) fn first_from(&self, arena: &Arena, key: Key, strict: bool) -> Option<(u128, u32)> {
        let key = pack(key);
        if self.entries.is_empty() {
            return self.small.first_from(key, strict);
        }
        // Best fit mostly asks below a class's smallest key (a size, address 0): then that key
        // is the answer, without the two searches.
        let first = arena.get(self.entries[0].chunk);
        if key < first.keys[0] || (!strict && key == first.keys[0]) {
            return Some((first.keys[0], first.ids[0]));
        }
        let i = if strict { self.entries.partition_point(|e| e.last() <= key) } else { self.entry_for(key) };
        arena.get(self.entries.get(i)?.chunk).first_from(key, strict)
    }

    /// The last key `< key`, packed, and its id.
    pub(crate) fn last_before(&self, arena: &Arena, key: Key) -> Option<(u128, u32)> {
        let key = pack(key);
        if self.entries.is_empty() {
            return self.small.last_before(key);
        }
        let i = self.entry_for(key);
        // Entry i's chunk may hold keys below `key`; if none, the answer ends entry i - 1.
        self.entries
            .get(i)
            .and_then(|e| arena.get(e.chunk).last_before(key))
            .or_else(|| arena.get(self.entries.get(i.checked_sub(1)?)?.chunk).last())
    }

    /// The first key, packed, and its id.
    #[inline]
    pub(crate) fn first(&self, arena: &Arena) -> Option<(u128, u32)> {
        match self.entries.first() {
            None => self.small.first(),
            Some(e) => arena.get(e.chunk).first(),
        }
    }

    /// The last key, packed, and its id.
    pub(crate) fn last(&self, arena: &Arena) -> Option<(u128, u32)> {
        match self.entries.last() {
            None => self.small.last(),
            Some(e) => arena.get(e.chunk).last(),
        }
    }

    /// Appends (key, id) in order.
    pub(crate) fn extend_into(&self, arena: &Arena, out: &mut Vec<(Key, u32)>) {
        self.small.extend_into(out);
        for e in &self.entries {
            arena.get(e.chunk).extend_into(out);
        }
    }

    /// Checks the list's own structure: inline keys only while there are no chunks, chunks
    /// non-empty and in order, entries' keys right. Returns the number of keys.
    pub(crate) fn check(&self, arena: &Arena) -> Result<usize, String> {
        if self.small.len > INLINE || (self.small.len > 0 && !self.entries.is_empty()) {
            return Err(format!("a size class holds {} inline keys besides its chunks", self.small.len));
        }
        let mut previous: Option<u128> = None;
        let mut in_order = |keys: &[u128]| {
            for &k in keys {
                if previous.is_some_and(|p| p >= k) {
                    return false;
                }
                previous = Some(k);
            }
            true
        };
        if !in_order(self.small.keys()) {
            return Err("inline keys of a size class out of order".into());
        }
        let mut total = self.small.len;
        for (i, e) in self.entries.iter().enumerate() {
            let chunk = arena.get(e.chunk);
            if chunk.len == 0 || chunk.len > CAP {
                return Err(format!("chunk {} of a size class holds {} keys", e.chunk, chunk.len));
            }
            if !in_order(chunk.keys()) {
                return Err(format!("keys out of order in chunk {} (entry {i})", e.chunk));
            }
            if e.last() != chunk.last_key() {
                return Err(format!("entry {i} records a wrong last key for chunk {}", e.chunk));
            }
            total += chunk.len;
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A list swaying around the inline limit moves to chunks and back, and stays in order.
    #[test]
    fn small_list_moves_between_inline_and_chunks() {
        let mut arena = Arena::default();
        let mut list = List::default();
        for round in 0..4u64 {
            for k in 0..=INLINE as u64 + round {
                list.insert(&mut arena, (512, k * 512), k as u32);
            }
            assert!(!list.entries.is_empty(), "more than INLINE keys live in chunks");
            assert_eq!(list.check(&arena).unwrap(), INLINE + 1 + round as usize);
            assert_eq!(list.first(&arena).map(|(_, id)| id), Some(0));
            for k in (1..=INLINE as u64 + round).rev() {
                assert!(list.remove(&mut arena, (512, k * 512)));
                list.check(&arena).unwrap();
                assert_eq!(list.last(&arena).map(|(_, id)| id), Some(k as u32 - 1));
            }
            // Down to one key: inline again, its chunk back in the arena.
            assert!(list.entries.is_empty());
            assert_eq!(arena.spare.len(), arena.chunks.len());
            assert!(list.remove(&mut arena, (512, 0)));
            assert!(list.is_empty());
        }
    }

    /// Blocks of one size freed in address order are appended without a search, through the
    /// splits of the last chunk, and taken back from the front: the list stays in order.
    #[test]
    fn appends_and_takes_from_the_front_keep_order() {
        let mut arena = Arena::default();
        let mut list = List::default();
        for k in 0..100u64 {
            list.insert(&mut arena, (1 << 26, k << 26), k as u32);
            assert_eq!(list.check(&arena).unwrap(), k as usize + 1);
            assert_eq!(list.last(&arena).map(|(_, id)| id), Some(k as u32));
        }
        for k in 0..100u64 {
            assert_eq!(list.first(&arena).map(|(_, id)| id), Some(k as u32));
            assert!(list.remove(&mut arena, (1 << 26, k << 26)));
            assert_eq!(list.check(&arena).unwrap(), 99 - k as usize);
        }
        assert!(list.is_empty());
    }

    /// A list against a `BTreeMap` under random inserts and removals, through splits and merges.
    #[test]
    fn list_matches_a_btree_map() {
        let mut arena = Arena::default();
        let mut list = List::default();
        let mut reference = BTreeMap::new();
        let mut x: u64 = 99;
        for step in 0..20_000u32 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Few sizes, so runs of equal sizes ordered by address, as in a busy class.
            let key = ((x >> 60) * 512, (x >> 20) % 4096 * 512);
            let grow = step < 10_000;
            if (x >> 4).is_multiple_of(5) {
                // Best fit's removal: the smallest key, taken without a search.
                if let Some((&first, _)) = reference.first_key_value() {
                    reference.remove(&first);
                    assert!(list.remove(&mut arena, first));
                }
            } else if (x >> 8).is_multiple_of(if grow { 3 } else { 2 }) || reference.contains_key(&key) {
                if reference.remove(&key).is_some() {
                    assert!(list.remove(&mut arena, key));
                } else {
                    assert!(!list.remove(&mut arena, key));
                }
            } else {
                reference.insert(key, step);
                list.insert(&mut arena, key, step);
            }
            if step % 97 == 0 {
                assert_eq!(list.check(&arena).unwrap(), reference.len());
                let mut all = Vec::new();
                list.extend_into(&arena, &mut all);
                assert_eq!(all, reference.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>());
                let probe = ((x >> 30) % 17 * 512, (x >> 40) % 4096 * 512);
                let entry = |e: Option<(&Key, &u32)>| e.map(|(&k, &v)| (pack(k), v));
                assert_eq!(list.first_from(&arena, probe, false), entry(reference.range(probe..).next()));
                assert_eq!(
                    list.first_from(&arena, probe, true),
                    entry(reference.range((std::ops::Bound::Excluded(probe), std::ops::Bound::Unbounded)).next())
                );
                assert_eq!(list.last_before(&arena, probe), entry(reference.range(..probe).next_back()));
                assert_eq!(list.first(&arena), entry(reference.iter().next()));
                assert_eq!(list.last(&arena), entry(reference.iter().next_back()));
            }
        }
        // Emptied, every chunk is back in the arena's spares.
        let keys: Vec<Key> = reference.keys().copied().collect();
        for key in keys {
            assert!(list.remove(&mut arena, key));
        }
        assert!(list.is_empty());
        assert_eq!(arena.spare.len(), arena.chunks.len());
    }
}
