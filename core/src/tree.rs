//! The ordered sets of blocks (PyTorch's `std::set<Block*>` with its comparators), without heap
//! allocation on the cache-hit path and with short searches.
//!
//! Why not `BTreeSet`: inserting and removing allocates and frees nodes, and the cache-hit path
//! must not touch the heap. Two structures instead:
//!
//! - [`BlockTree`]: an AVL tree threaded through the blocks' own links, for the unmapped VA of
//!   expandable segments (ordered by stream and address; rarely touched).
//! - [`FreeIndex`]: the best-fit set of free blocks, ordered exactly like PyTorch 2.11's
//!   `(stream, size, address)`. Per stream it splits sizes into 3,200 classes (64 per power of
//!   two, like TLSF) with a two-level bitmap of the non-empty ones, and keeps one sorted chunk
//!   list per class ([`chunks`]; its chunks come from one recycled arena). Best fit is then a
//!   bit scan plus two short binary searches over contiguous keys, instead of a walk through
//!   every free block of the pool; the order, and so every tie-break, is the same as one big
//!   tree's. The block inserted last waits beside the lists, as it is usually the next one
//!   taken.

use crate::backend::StreamId;
use crate::block::{Block, Blocks, NIL};
use chunks::{Arena, List, pack};

mod chunks;

/// A key, compared lexicographically: (size, address) within one stream's size class, or
/// (stream, address) in the address set.
pub(crate) type Key = (u64, u64);

/// The order of a set: how a block's key is read from its fields.
pub(crate) trait Order {
    fn key(block: &Block) -> Key;
}

/// (size, address), within one stream: PyTorch's `BlockComparatorSize` below the stream.
pub(crate) struct BySize;

impl Order for BySize {
    #[inline]
    fn key(block: &Block) -> Key {
        (block.size, block.ptr)
    }
}

/// (stream, address): PyTorch's `BlockComparatorAddress`.
pub(crate) struct ByAddress;

impl Order for ByAddress {
    #[inline]
    fn key(block: &Block) -> Key {
        (block.stream.0, block.ptr)
    }
}

/// A set of blocks ordered by (stream, address): one AVL tree.
#[derive(Clone, Debug)]
pub(crate) struct BlockTree {
    root: u32,
    len: usize,
}

impl BlockTree {
    pub(crate) fn new() -> Self {
        BlockTree { root: NIL, len: 0 }
    }

    pub(crate) fn insert(&mut self, blocks: &mut Blocks, id: u32) {
        self.root = avl::insert::<ByAddress>(blocks.slice_mut(), self.root, id);
        self.len += 1;
    }

    pub(crate) fn remove(&mut self, blocks: &mut Blocks, id: u32) {
        let (root, found) = avl::remove::<ByAddress>(blocks.slice_mut(), self.root, id);
        debug_assert!(found, "block {id} not in its set");
        self.root = root;
        self.len -= usize::from(found);
    }

    /// The first block of `stream` (lowest address): with [`BlockTree::successor`], the
    /// search from the root that [`BlockTree::walk_stream`] replaced, kept as the tests'
    /// reference for it.
    #[cfg(test)]
    pub(crate) fn first_of_stream(&self, blocks: &Blocks, stream: StreamId) -> Option<u32> {
        avl::lower_bound::<ByAddress>(blocks.slice(), self.root, (stream.0, 0))
            .filter(|&id| blocks[id].stream == stream)
    }

    /// The blocks of `stream` in address order, from its lowest: an in-order walk that keeps
    /// its path, so that a step costs a constant on average instead of a search from the root.
    /// The expandable search visits a stream's unmapped blocks one after another until a run
    /// offers a request's bytes, dozens of them per miss once `policy:cachalot` has given
    /// pages back in many places.
    pub(crate) fn walk_stream<'a>(&self, blocks: &'a Blocks, stream: StreamId) -> StreamWalk<'a> {
        let blocks = blocks.slice();
        let mut walk = StreamWalk { blocks, stream, path: [NIL; PATH], depth: 0 };
        // The path to the first block of `stream`: every node where the search went left is
        // still to be visited, in the order the path holds them, deepest first.
        let mut node = self.root;
        while node != NIL {
            let b = &blocks[node as usize];
            if ByAddress::key(b) >= (stream.0, 0) {
                walk.push(node);
                node = b.left;
            } else {
                node = b.right;
            }
        }
        walk
    }

    /// The block after `id`.
    #[cfg(test)]
    pub(crate) fn successor(&self, blocks: &Blocks, id: u32) -> Option<u32> {
        avl::after::<ByAddress>(blocks.slice(), self.root, ByAddress::key(&blocks[id]))
    }

    pub(crate) fn check(&self, blocks: &Blocks) -> Result<usize, String> {
        let n = avl::check::<ByAddress>(blocks.slice(), self.root, None, None)?.1;
        if n != self.len {
            return Err(format!("address set holds {n} blocks but counts {}", self.len));
        }
        Ok(n)
    }
}

/// The longest path of a [`StreamWalk`]: an AVL tree of fewer than 2^32 blocks is at most
/// 1.44 × 32 levels deep.
const PATH: usize = 48;

/// [`BlockTree::walk_stream`]'s iterator: the blocks of one stream in address order.
pub(crate) struct StreamWalk<'a> {
    blocks: &'a [Block],
    stream: StreamId,
    /// The nodes still to visit whose right subtrees come after them; the next block on top.
    path: [u32; PATH],
    depth: usize,
}

impl StreamWalk<'_> {
    #[inline]
    fn push(&mut self, node: u32) {
        self.path[self.depth] = node;
        self.depth += 1;
    }
}

impl Iterator for StreamWalk<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.depth == 0 {
            return None;
        }
        self.depth -= 1;
        let id = self.path[self.depth];
        let b = &self.blocks[id as usize];
        if b.stream != self.stream {
            // Every later block is of a later stream.
            self.depth = 0;
            return None;
        }
        // Its successor is the leftmost block of its right subtree, if any, else the node below
        // it on the path.
        let mut node = b.right;
        while node != NIL {
            self.push(node);
            node = self.blocks[node as usize].left;
        }
        Some(id)
    }
}

/// Bits of the sub-class index within a power of two.
const SUB_BITS: u32 = 6;
/// Sizes below this get one class per 512 bytes (the classes 0..64).
const LINEAR_LIMIT: u64 = 1 << (SUB_BITS + 9);
/// Number of size classes: 64 linear ones, then 64 per power of two from 2^15 to 2^63.
const CLASSES: usize = 50 * 64;
const GROUPS: usize = CLASSES / 64;
/// Classes whose lists are allocated together, when a block is first filed in one of them.
const LIST_GROUP: usize = 16;
/// Number of such groups.
const LIST_GROUPS: usize = CLASSES / LIST_GROUP;
const _: () = assert!(LIST_GROUPS < u8::MAX as usize, "a group's slot is a byte");

/// The size class of `size`; monotonic in `size`.
#[inline]
fn size_class(size: u64) -> usize {
    if size < LINEAR_LIMIT {
        (size >> 9) as usize
    } else {
        let log = 63 - size.leading_zeros();
        ((log - 14) as usize) * 64 + ((size >> (log - SUB_BITS)) & 63) as usize
    }
}

/// One stream's classes: an ordered list per class and bitmaps of the non-empty classes.
#[derive(Clone, Debug)]
struct StreamClasses {
    stream: StreamId,
    /// Blocks in the lists; the entry is released when this drops to 0.
    filed: usize,
    /// The lists of the groups of [`LIST_GROUP`] classes that were used, in the order they
    /// were first used: a group's lists take 2 KB, all 3,200 classes' 400 KB, so a stream
    /// holding a few free blocks pays for the groups their sizes fall in.
    lists: Vec<[List; LIST_GROUP]>,
    /// For each group of [`LIST_GROUP`] classes, 1 + the index of its lists in `lists`, or 0
    /// where it has none. A byte per group rather than a pointer keeps the entry at 648 bytes
    /// (2,696 with one group), which the index moves whole when a stream's entry comes and
    /// goes; an array of 200 pointers made that 2 KB, and such moves cost 12% more
    /// instructions per op on trace-multistream.
    slot: [u8; LIST_GROUPS],
    /// Bit `g` set when `bits[g]` is non-zero.
    groups: u64,
    /// Bit `c % 64` of `bits[c / 64]` set when class `c` is non-empty.
    bits: [u64; GROUPS],
}

impl StreamClasses {
    fn new(stream: StreamId) -> Self {
        StreamClasses { stream, filed: 0, lists: Vec::new(), slot: [0; LIST_GROUPS], groups: 0, bits: [0; GROUPS] }
    }

    /// The index in `lists` of class `class`'s group; `usize::MAX` (beyond every index) when
    /// the group has no lists.
    #[inline]
    fn group_index(&self, class: usize) -> usize {
        usize::from(self.slot[class / LIST_GROUP]).wrapping_sub(1)
    }

    /// The list of class `class`, if its group has lists.
    #[inline]
    fn list(&self, class: usize) -> Option<&List> {
        self.lists.get(self.group_index(class)).map(|group| &group[class % LIST_GROUP])
    }

    /// The list of class `class`, if its group has lists, mutably.
    #[inline]
    fn existing_list_mut(&mut self, class: usize) -> Option<&mut List> {
        let index = self.group_index(class);
        self.lists.get_mut(index).map(|group| &mut group[class % LIST_GROUP])
    }

    /// The list of class `class`, allocating its group's lists on first use.
    #[inline]
    fn list_mut(&mut self, class: usize) -> &mut List {
        if self.slot[class / LIST_GROUP] == 0 {
            self.lists.push(std::array::from_fn(|_| List::default()));
            // At most LIST_GROUPS (< 255) groups are ever pushed, so the slot fits a byte.
            self.slot[class / LIST_GROUP] = self.lists.len() as u8;
        }
        let index = self.group_index(class);
        &mut self.lists[index][class % LIST_GROUP]
    }

    /// Marks class `class` non-empty (after an insert).
    #[inline]
    fn mark_filled(&mut self, class: usize) {
        let g = class / 64;
        self.bits[g] |= 1 << (class % 64);
        self.groups |= 1 << g;
    }

    /// Clears class `class`'s bits (after a removal emptied its list).
    #[inline]
    fn mark_emptied(&mut self, class: usize) {
        let g = class / 64;
        self.bits[g] &= !(1 << (class % 64));
        if self.bits[g] == 0 {
            self.groups &= !(1 << g);
        }
    }

    /// The first non-empty class `>= class`.
    #[inline]
    fn first_from(&self, class: usize) -> Option<usize> {
        if class >= CLASSES {
            return None;
        }
        let g = class / 64;
        let word = self.bits[g] & (!0u64 << (class % 64));
        if word != 0 {
            return Some(g * 64 + word.trailing_zeros() as usize);
        }
        let later = if g + 1 >= 64 { 0 } else { self.groups & (!0u64 << (g + 1)) };
        if later == 0 {
            return None;
        }
        let g = later.trailing_zeros() as usize;
        Some(g * 64 + self.bits[g].trailing_zeros() as usize)
    }

    /// The last non-empty class `< class`.
    fn last_before(&self, class: usize) -> Option<usize> {
        let g = class / 64;
        let word = self.bits[g] & ((1u64 << (class % 64)) - 1);
        if word != 0 {
            return Some(g * 64 + 63 - word.leading_zeros() as usize);
        }
        let earlier = self.groups & ((1u64 << g) - 1);
        if earlier == 0 {
            return None;
        }
        let g = 63 - earlier.leading_zeros() as usize;
        Some(g * 64 + 63 - self.bits[g].leading_zeros() as usize)
    }
}

/// The best-fit set of one pool's free blocks, ordered by (stream, size, address).
///
/// The block inserted last is held beside the class lists, in `recent`, until the next insert
/// files it. Why: on the cache-hit path the block freed last is usually the next
/// one taken: a step frees a tensor and allocates the same size again, and a split's free tail
/// is merged back when the carved block is freed. Each of those pairs then costs a comparison
/// instead of two list updates (steady-1MiB's alloc/free pair made four). Every query weighs
/// the recent block against the lists' answer, so the order seen from outside is the one set's.
#[derive(Clone, Debug)]
#[allow(clippy::vec_box, reason = "an entry is 648 bytes: inserting among thousands moves pointers instead")]
pub(crate) struct FreeIndex {
    /// Sorted by stream: the streams with filed blocks, and at most [`IDLE_STREAMS`] whose
    /// last filed block left (`idle` of them). An entry takes 648 bytes plus 2 KB per group of
    /// classes it used (all of them: 400 KB), so beyond those few an emptied entry is released:
    /// a stream that holds no free block of this pool costs nothing, however many streams a
    /// trace names. Boxed, so that a new stream's entry inserted among thousands moves
    /// pointers, not 648 bytes per entry after it.
    streams: Vec<Box<StreamClasses>>,
    /// Entries of `streams` with no filed block.
    idle: usize,
    /// Emptied entries kept for the next stream that needs one (at most [`SPARE_STREAMS`]), so
    /// that a stream whose free set empties and fills again allocates nothing.
    spare: Vec<Box<StreamClasses>>,
    /// The chunks of every class's list.
    arena: Arena,
    /// Blocks in the class lists (the recent block not counted).
    listed: usize,
    recent: Recent,
}

/// Emptied per-stream entries a [`FreeIndex`] keeps for reuse, with the groups of lists they
/// had: a bounded cache (at most 1.6 MB, usually a few KB), enough for a few streams whose
/// free sets empty and fill again in turn.
const SPARE_STREAMS: usize = 4;

/// Emptied entries a [`FreeIndex`] leaves in place among the streams'. Why: a pool whose one
/// filed block is taken and freed again, on every step, would otherwise move its 648-byte entry
/// out of the sorted streams and back each time; those moves were 13% of the instructions per
/// op on trace-multistream. Bounded like the spare entries, so idle streams still cost nothing.
const IDLE_STREAMS: usize = 4;

/// The block inserted last, not in any class list; `id` is [`NIL`] when there is none. Its
/// stream and key are kept here, so that filing it later and comparing against it read no
/// block.
#[derive(Clone, Copy, Debug)]
struct Recent {
    id: u32,
    stream: StreamId,
    key: Key,
}

impl Default for FreeIndex {
    fn default() -> Self {
        FreeIndex {
            streams: Vec::new(),
            idle: 0,
            spare: Vec::new(),
            arena: Arena::default(),
            listed: 0,
            recent: Recent { id: NIL, stream: StreamId::DEFAULT, key: (0, 0) },
        }
    }
}

impl FreeIndex {
    /// The index of `stream`'s entry in the sorted `streams`: a binary search, so that a pool
    /// whose free blocks are on thousands of streams (a trace that names a stream per
    /// allocation) costs a logarithm per look-up, not a walk over them all.
    #[inline]
    fn index_of(&self, stream: StreamId) -> Option<usize> {
        self.streams.binary_search_by(|s| s.stream.cmp(&stream)).ok()
    }

    #[inline]
    fn stream(&self, stream: StreamId) -> Option<&StreamClasses> {
        self.index_of(stream).map(|i| &*self.streams[i])
    }

    /// Adds free block `id`, which becomes the recent block; the previous recent block is
    /// filed in its class list.
    #[inline]
    pub(crate) fn insert(&mut self, blocks: &Blocks, id: u32) {
        let b = &blocks[id];
        let previous = std::mem::replace(&mut self.recent, Recent { id, stream: b.stream, key: BySize::key(b) });
        if previous.id != NIL {
            self.file(previous);
        }
    }

    /// Removes block `id`, which must be in the set.
    #[inline]
    pub(crate) fn remove(&mut self, blocks: &Blocks, id: u32) {
        if self.recent.id == id {
            self.recent.id = NIL;
        } else {
            self.unfile(blocks, id);
        }
    }

    /// Puts a block in its class list. Always inlined, into the allocator's `insert_free`
    /// (which is not): a call here cost as much again as the filing's own work.
    #[inline(always)]
    fn file(&mut self, block: Recent) {
        let index = match self.index_of(block.stream) {
            Some(i) => {
                self.idle -= usize::from(self.streams[i].filed == 0);
                i
            }
            None => self.new_entry(block.stream),
        };
        let classes = &mut self.streams[index];
        let class = size_class(block.key.0);
        classes.list_mut(class).insert(&mut self.arena, block.key, block.id);
        classes.mark_filled(class);
        classes.filed += 1;
        self.listed += 1;
    }

    /// Makes an entry for `stream`, which has none, and returns its index. Out of line and
    /// cold: it is rare, and kept apart it leaves `file`, which runs at most frees, short.
    #[cold]
    #[inline(never)]
    fn new_entry(&mut self, stream: StreamId) -> usize {
        let at = self.streams.partition_point(|s| s.stream < stream);
        let classes = match self.spare.pop() {
            Some(mut spare) => {
                spare.stream = stream;
                spare
            }
            None => Box::new(StreamClasses::new(stream)),
        };
        self.streams.insert(at, classes);
        at
    }

    /// Takes a block out of its class list. Always inlined, as `file`.
    #[inline(always)]
    fn unfile(&mut self, blocks: &Blocks, id: u32) {
        let b = &blocks[id];
        let Some(index) = self.index_of(b.stream) else {
            debug_assert!(false, "block {id} not in its set");
            return;
        };
        let classes = &mut self.streams[index];
        let class = size_class(b.size);
        // One look-up of the list serves the removal and the emptiness test.
        let (found, emptied) = match classes.existing_list_mut(class) {
            Some(list) => (list.remove(&mut self.arena, BySize::key(b)), list.is_empty()),
            None => (false, true),
        };
        debug_assert!(found, "block {id} not in its set");
        if emptied {
            classes.mark_emptied(class);
        }
        classes.filed -= usize::from(found);
        self.listed -= usize::from(found);
        if classes.filed == 0 {
            // Left in place for the stream's next free block. When the idle entries are full,
            // another stream's makes room: the streams that empty and fill again keep theirs,
            // not those that emptied first.
            let evicted = if self.idle < IDLE_STREAMS {
                self.idle += 1;
                None
            } else {
                self.streams.iter().enumerate().position(|(i, s)| i != index && s.filed == 0)
            };
            if let Some(other) = evicted {
                // Every list is empty and every bit clear: the entry can serve any stream later.
                let emptied = self.streams.remove(other);
                if self.spare.len() < SPARE_STREAMS {
                    self.spare.push(emptied);
                }
            }
        }
    }

    /// The recent block if it is in `stream` and `qualifies` by its key, and comes before the
    /// lists' answer `listed` (after it, with `later`); else `listed`. The lists answer with
    /// the key they hold beside the id, so no block is read.
    #[inline]
    fn weigh_recent(
        &self,
        stream: StreamId,
        listed: Option<(u128, u32)>,
        qualifies: impl Fn(Key) -> bool,
        later: bool,
    ) -> Option<u32> {
        let recent = &self.recent;
        if recent.id != NIL
            && recent.stream == stream
            && qualifies(recent.key)
            && listed.is_none_or(|(key, _)| (pack(recent.key) < key) != later)
        {
            return Some(recent.id);
        }
        listed.map(|(_, id)| id)
    }

    /// The first block of the first non-empty class after `class`, with its packed key.
    fn first_after_class(&self, classes: &StreamClasses, class: usize) -> Option<(u128, u32)> {
        classes.first_from(class + 1).and_then(|c| classes.list(c)?.first(&self.arena))
    }

    /// The smallest block of `stream` with at least `size` bytes (lowest address among equals):
    /// PyTorch's `lower_bound((stream, size))` restricted to the stream.
    #[inline]
    pub(crate) fn lower_bound(&self, stream: StreamId, size: u64) -> Option<u32> {
        self.weigh_recent(stream, self.listed_lower_bound(stream, size), |key| key.0 >= size, false)
    }

    /// [`FreeIndex::lower_bound`], and beside it the block after it where that is known
    /// without a search: when the answer is the recent block, the lists' own answer (or none)
    /// is the next one, as every listed block of at least `size` bytes comes after it. Expandable
    /// best fit asks for the next block whenever the answer can grow, which under
    /// `policy:cachalot` is most of the time.
    #[inline]
    pub(crate) fn lower_bound_and_next(&self, stream: StreamId, size: u64) -> Option<(u32, Option<Option<u32>>)> {
        let listed = self.listed_lower_bound(stream, size);
        // `weigh_recent`'s test for `lower_bound`, written out: through it (and a comparison of
        // its answer with the recent block) expandable best fit took 0.4% more instructions
        // per op (trace-gpt_train under policy:cachalot 701.3 -> 704.6).
        let recent = &self.recent;
        if recent.id != NIL
            && recent.stream == stream
            && recent.key.0 >= size
            && listed.is_none_or(|(key, _)| pack(recent.key) < key)
        {
            return Some((recent.id, Some(listed.map(|(_, id)| id))));
        }
        listed.map(|(_, id)| (id, None))
    }

    /// The lists' answer to [`FreeIndex::lower_bound`], with its packed key.
    #[inline]
    fn listed_lower_bound(&self, stream: StreamId, size: u64) -> Option<(u128, u32)> {
        let classes = self.stream(stream)?;
        let class = size_class(size);
        // Block sizes are multiples of 512 bytes, so a linear class holds blocks of its one
        // size: its first block is the answer, found without a search.
        let found = classes.list(class).and_then(|list| {
            if size < LINEAR_LIMIT && size.is_multiple_of(512) {
                let first = list.first(&self.arena);
                debug_assert_eq!(first, list.first_from(&self.arena, (size, 0), false), "a linear class mixes sizes");
                first
            } else {
                list.first_from(&self.arena, (size, 0), false)
            }
        });
        found.or_else(|| self.first_after_class(classes, class))
    }

    /// The next block of the same stream.
    pub(crate) fn successor(&self, blocks: &Blocks, id: u32) -> Option<u32> {
        let (stream, key) = (blocks[id].stream, BySize::key(&blocks[id]));
        let listed = self.stream(stream).and_then(|classes| {
            let class = size_class(key.0);
            classes
                .list(class)
                .and_then(|list| list.first_from(&self.arena, key, true))
                .or_else(|| self.first_after_class(classes, class))
        });
        self.weigh_recent(stream, listed, |k| k > key, false)
    }

    /// The previous block of the same stream.
    pub(crate) fn predecessor(&self, blocks: &Blocks, id: u32) -> Option<u32> {
        self.last_below_key(blocks[id].stream, BySize::key(&blocks[id]))
    }

    /// The largest block of `stream` smaller than `size` bytes.
    pub(crate) fn last_below(&self, stream: StreamId, size: u64) -> Option<u32> {
        self.last_below_key(stream, (size, 0))
    }

    fn last_below_key(&self, stream: StreamId, key: Key) -> Option<u32> {
        let listed = self.stream(stream).and_then(|classes| {
            let class = size_class(key.0);
            classes
                .list(class)
                .and_then(|list| list.last_before(&self.arena, key))
                .or_else(|| classes.last_before(class).and_then(|c| classes.list(c)?.last(&self.arena)))
        });
        self.weigh_recent(stream, listed, |k| k < key, true)
    }

    /// The streams with free blocks in the set, each once (for walks over each stream's largest
    /// blocks, which visit only what they use instead of every free block). An iterator, not a
    /// vector: rule 4 of `policy:cachalot` asks at every miss at the peak, and the vectors'
    /// allocations were a tenth of the instructions of trace-multistream under that policy.
    pub(crate) fn streams(&self) -> impl Iterator<Item = StreamId> + '_ {
        let filed = self.streams.iter().filter(|classes| classes.filed > 0).map(|classes| classes.stream);
        let recent = self.recent.stream;
        let recent_alone = self.recent.id != NIL && !filed.clone().any(|stream| stream == recent);
        filed.chain(recent_alone.then_some(recent))
    }

    /// All blocks in set order.
    pub(crate) fn to_vec(&self) -> Vec<u32> {
        let mut entries = Vec::with_capacity(self.listed + 1);
        let mut class_entries = Vec::new();
        for classes in &self.streams {
            let mut class = classes.first_from(0);
            while let Some(c) = class {
                if let Some(list) = classes.list(c) {
                    list.extend_into(&self.arena, &mut class_entries);
                }
                class = classes.first_from(c + 1);
            }
            entries.extend(class_entries.drain(..).map(|(key, id)| ((classes.stream, key), id)));
        }
        let recent = &self.recent;
        if recent.id != NIL {
            let at = entries.partition_point(|&(order, _)| order < (recent.stream, recent.key));
            entries.insert(at, ((recent.stream, recent.key), recent.id));
        }
        entries.into_iter().map(|(_, id)| id).collect()
    }

    pub(crate) fn check(&self, blocks: &Blocks) -> Result<usize, String> {
        let mut total = 0;
        let idle = self.streams.iter().filter(|classes| classes.filed == 0).count();
        if idle != self.idle || idle > IDLE_STREAMS {
            return Err(format!("free index keeps {idle} idle stream entries but counts {}", self.idle));
        }
        for (i, classes) in self.streams.iter().enumerate() {
            if i > 0 && self.streams[i - 1].stream >= classes.stream {
                return Err("free index streams out of order".into());
            }
            let before = total;
            // Only the classes the bitmap marks are visited: a non-empty list the bitmap misses
            // leaves its members uncounted, which the total below catches.
            let mut class = classes.first_from(0);
            while let Some(c) = class {
                class = classes.first_from(c + 1);
                let Some(list) = classes.list(c).filter(|list| !list.is_empty()) else {
                    return Err(format!("size class {c} is marked but empty"));
                };
                let n = list.check(&self.arena)?;
                let mut members = Vec::new();
                list.extend_into(&self.arena, &mut members);
                for (key, id) in members {
                    let b = &blocks[id];
                    if b.stream != classes.stream || size_class(b.size) != c {
                        return Err(format!("block {id} sits in the wrong stream or size class"));
                    }
                    if BySize::key(b) != key {
                        return Err(format!("block {id} is filed under a stale key {key:?}"));
                    }
                    if id == self.recent.id {
                        return Err(format!("block {id} is both filed and the recent block"));
                    }
                }
                total += n;
            }
            for g in 0..GROUPS {
                if (classes.groups >> g & 1 == 1) != (classes.bits[g] != 0) {
                    return Err(format!("size class group {g} bitmap disagrees"));
                }
            }
            if total - before != classes.filed {
                return Err(format!(
                    "stream {} lists {} blocks but counts {}",
                    classes.stream.0,
                    total - before,
                    classes.filed
                ));
            }
        }
        for spare in &self.spare {
            if spare.filed != 0 || spare.groups != 0 {
                return Err("a spare free-index entry is not empty".into());
            }
        }
        if total != self.listed {
            return Err(format!("free index lists {total} blocks but counts {}", self.listed));
        }
        let recent = &self.recent;
        if recent.id != NIL {
            let b = blocks.get(recent.id).ok_or_else(|| format!("recent block {} is vacant", recent.id))?;
            if (b.stream, BySize::key(b)) != (recent.stream, recent.key) {
                return Err(format!("recent block {} is held under a stale key {:?}", recent.id, recent.key));
            }
            total += 1;
        }
        Ok(total)
    }
}

/// AVL trees threaded through the blocks' `left`/`right`/`height`, each identified by its
/// root, ordered by `O`.
mod avl {
    use super::{Key, Order};
    use crate::block::{Block, NIL};

    #[inline]
    fn key<O: Order>(blocks: &[Block], id: u32) -> Key {
        O::key(&blocks[id as usize])
    }

    /// Deepest path an AVL tree can have here: a tree of height 48 would hold more blocks than
    /// `u32` indices can name (an AVL tree of height h has at least Fib(h + 2) - 1 nodes).
    const MAX_DEPTH: usize = 48;

    /// The path from the root to a node: the nodes and, as bits, whether the walk went left.
    struct Path {
        nodes: [u32; MAX_DEPTH],
        left: u64,
        len: usize,
    }

    impl Path {
        fn new() -> Self {
            Path { nodes: [NIL; MAX_DEPTH], left: 0, len: 0 }
        }

        fn push(&mut self, node: u32, left: bool) {
            self.nodes[self.len] = node;
            self.left = (self.left & !(1 << self.len)) | (u64::from(left) << self.len);
            self.len += 1;
        }

        fn went_left(&self, at: usize) -> bool {
            self.left >> at & 1 == 1
        }
    }

    /// Makes `child` the child of `path.nodes[at - 1]` on the side the path took, or the root
    /// when `at` is 0.
    fn relink(blocks: &mut [Block], path: &Path, at: usize, root: &mut u32, child: u32) {
        if at == 0 {
            *root = child;
        } else if path.went_left(at - 1) {
            blocks[path.nodes[at - 1] as usize].left = child;
        } else {
            blocks[path.nodes[at - 1] as usize].right = child;
        }
    }

    /// Rebalances the nodes of `path[..len]` from the deepest up, stopping at the first one
    /// whose height comes out unchanged: nothing above it changes. Returns the root.
    fn retrace(blocks: &mut [Block], path: &Path, len: usize, mut root: u32) -> u32 {
        for at in (0..len).rev() {
            let node = path.nodes[at];
            let before = blocks[node as usize].height;
            let top = rebalance(blocks, node);
            if top != node {
                relink(blocks, path, at, &mut root, top);
            }
            if blocks[top as usize].height == before {
                break;
            }
        }
        root
    }

    /// Inserts `id`; returns the new root. Walks down once, then back up only as far as heights
    /// change (most inserts touch one or two levels on the way up).
    pub(super) fn insert<O: Order>(blocks: &mut [Block], root: u32, id: u32) -> u32 {
        let b = &mut blocks[id as usize];
        b.left = NIL;
        b.right = NIL;
        b.height = 1;
        if root == NIL {
            return id;
        }
        let k = O::key(b);
        let mut path = Path::new();
        let mut node = root;
        loop {
            let go_left = k < key::<O>(blocks, node);
            path.push(node, go_left);
            let n = &mut blocks[node as usize];
            let child = if go_left { &mut n.left } else { &mut n.right };
            if *child == NIL {
                *child = id;
                break;
            }
            node = *child;
        }
        retrace(blocks, &path, path.len, root)
    }

    /// Removes `id`; returns the new root and whether it was found.
    pub(super) fn remove<O: Order>(blocks: &mut [Block], root: u32, id: u32) -> (u32, bool) {
        let k = key::<O>(blocks, id);
        let mut path = Path::new();
        let mut node = root;
        while node != id {
            if node == NIL {
                return (root, false);
            }
            let go_left = k < key::<O>(blocks, node);
            path.push(node, go_left);
            node = if go_left { blocks[node as usize].left } else { blocks[node as usize].right };
        }
        let mut root = root;
        let at = path.len;
        let (left, right) = (blocks[id as usize].left, blocks[id as usize].right);
        if left == NIL || right == NIL {
            // One child or none: it takes the removed node's place.
            relink(blocks, &path, at, &mut root, if left == NIL { right } else { left });
            return (retrace(blocks, &path, at, root), true);
        }
        // Two children: the successor (leftmost of the right subtree) takes the node's place, and
        // the walk back up starts from where the successor was.
        path.push(id, false);
        let mut successor = right;
        while blocks[successor as usize].left != NIL {
            path.push(successor, true);
            successor = blocks[successor as usize].left;
        }
        let successor_right = blocks[successor as usize].right;
        relink(blocks, &path, path.len, &mut root, successor_right);
        let height = blocks[id as usize].height;
        let s = &mut blocks[successor as usize];
        s.left = left;
        s.right = if path.len == at + 1 { successor_right } else { right };
        s.height = height;
        path.nodes[at] = successor;
        relink(blocks, &path, at, &mut root, successor);
        (retrace(blocks, &path, path.len, root), true)
    }

    /// The first member with a key `>= k`.
    #[inline]
    #[cfg(test)]
    pub(super) fn lower_bound<O: Order>(blocks: &[Block], root: u32, k: Key) -> Option<u32> {
        let mut node = root;
        let mut best = NIL;
        while node != NIL {
            let b = &blocks[node as usize];
            if O::key(b) >= k {
                best = node;
                node = b.left;
            } else {
                node = b.right;
            }
        }
        (best != NIL).then_some(best)
    }

    /// The first member with a key `> k`.
    #[cfg(test)]
    pub(super) fn after<O: Order>(blocks: &[Block], root: u32, k: Key) -> Option<u32> {
        let mut node = root;
        let mut best = NIL;
        while node != NIL {
            let b = &blocks[node as usize];
            if O::key(b) > k {
                best = node;
                node = b.left;
            } else {
                node = b.right;
            }
        }
        (best != NIL).then_some(best)
    }

    /// Checks shape, balance and ordering; returns (height, members).
    pub(super) fn check<O: Order>(
        blocks: &[Block],
        node: u32,
        lo: Option<Key>,
        hi: Option<Key>,
    ) -> Result<(u8, usize), String> {
        if node == NIL {
            return Ok((0, 0));
        }
        let b = &blocks[node as usize];
        let k = O::key(b);
        if lo.is_some_and(|lo| k <= lo) || hi.is_some_and(|hi| k >= hi) {
            return Err(format!("block {node} out of order in its set (its key changed while in it?)"));
        }
        let (lh, ln) = check::<O>(blocks, b.left, lo, Some(k))?;
        let (rh, rn) = check::<O>(blocks, b.right, Some(k), hi)?;
        if lh.abs_diff(rh) > 1 || b.height != lh.max(rh) + 1 {
            return Err(format!("set node {node} unbalanced"));
        }
        Ok((lh.max(rh) + 1, ln + rn + 1))
    }

    #[inline]
    fn height(blocks: &[Block], node: u32) -> u8 {
        if node == NIL { 0 } else { blocks[node as usize].height }
    }

    #[inline]
    fn update(blocks: &mut [Block], node: u32) {
        let (l, r) = (blocks[node as usize].left, blocks[node as usize].right);
        blocks[node as usize].height = height(blocks, l).max(height(blocks, r)) + 1;
    }

    fn rotate_right(blocks: &mut [Block], node: u32) -> u32 {
        let left = blocks[node as usize].left;
        blocks[node as usize].left = blocks[left as usize].right;
        blocks[left as usize].right = node;
        update(blocks, node);
        update(blocks, left);
        left
    }

    fn rotate_left(blocks: &mut [Block], node: u32) -> u32 {
        let right = blocks[node as usize].right;
        blocks[node as usize].right = blocks[right as usize].left;
        blocks[right as usize].left = node;
        update(blocks, node);
        update(blocks, right);
        right
    }

    fn rebalance(blocks: &mut [Block], node: u32) -> u32 {
        update(blocks, node);
        let (l, r) = (blocks[node as usize].left, blocks[node as usize].right);
        let balance = i16::from(height(blocks, l)) - i16::from(height(blocks, r));
        if balance > 1 {
            if height(blocks, blocks[l as usize].left) < height(blocks, blocks[l as usize].right) {
                blocks[node as usize].left = rotate_left(blocks, l);
            }
            return rotate_right(blocks, node);
        }
        if balance < -1 {
            if height(blocks, blocks[r as usize].right) < height(blocks, blocks[r as usize].left) {
                blocks[node as usize].right = rotate_right(blocks, r);
            }
            return rotate_left(blocks, node);
        }
        node
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::Block;
    use crate::size::PoolKind;
    use std::collections::BTreeSet;

    fn add(blocks: &mut Blocks, stream: u64, size: u64, ptr: u64) -> u32 {
        blocks.insert(Block::new(ptr, size, StreamId(stream), PoolKind::Large, NIL))
    }

    #[test]
    fn size_classes_are_monotonic_and_in_range() {
        let mut last = 0;
        let mut size = 512;
        while size < u64::MAX / 3 {
            for s in [size, size + 512, size * 3 / 2] {
                let c = size_class(s);
                assert!(c < CLASSES);
                assert!(c >= last || s < size, "{s}");
            }
            last = size_class(size);
            size *= 2;
        }
        assert_eq!(size_class(512), 1);
        assert_eq!(size_class(LINEAR_LIMIT - 512), 63);
        assert_eq!(size_class(LINEAR_LIMIT), 64);
        assert_eq!(size_class(u64::MAX), CLASSES - 1);
    }

    /// The free index against a `BTreeSet` of PyTorch's keys, under random inserts and removals.
    #[test]
    fn free_index_orders_like_pytorch_set() {
        let mut blocks = Blocks::default();
        let mut index = FreeIndex::default();
        let mut reference = BTreeSet::new();
        let mut ids = Vec::new();
        let mut x: u64 = 12345;
        let key = |blocks: &Blocks, id: u32| (blocks[id].stream.0, blocks[id].size, blocks[id].ptr);
        for step in 0..6000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if ids.is_empty() || !x.is_multiple_of(3) {
                // Sizes across many classes, with many exact repeats.
                let size = if x.is_multiple_of(5) { 1 << 20 } else { 512 << ((x >> 8) % 24) } + (x >> 40) % 4 * 512;
                let id = add(&mut blocks, (x >> 4) % 3 * 0x1000, size, step * 4096);
                index.insert(&blocks, id);
                reference.insert((key(&blocks, id), id));
                ids.push(id);
            } else {
                // Often the block inserted last, which the index holds beside its lists.
                let id = match x.is_multiple_of(4) {
                    true => ids.pop().unwrap(),
                    false => ids.swap_remove((x >> 20) as usize % ids.len()),
                };
                reference.remove(&(key(&blocks, id), id));
                index.remove(&blocks, id);
                blocks.remove(id);
            }
            // Probed after inserts and removals alike, so with and without a recent block.
            if step % 101 == 0 || step % 103 == 0 {
                index.check(&blocks).unwrap();
                let ordered: Vec<u32> = reference.iter().map(|&(_, id)| id).collect();
                assert_eq!(index.to_vec(), ordered);
                // A random size, and the exact size of a block (often the recent one).
                let exact = ids.last().map_or(512, |&id| blocks[id].size);
                for (stream, probe) in
                    [0, 0x1000, 0x2000].into_iter().flat_map(|s| [(s, 512 << ((x >> 12) % 26)), (s, exact)])
                {
                    let expected = reference
                        .range(((stream, probe, 0), 0)..)
                        .next()
                        .filter(|((s, _, _), _)| *s == stream)
                        .map(|&(_, id)| id);
                    assert_eq!(index.lower_bound(StreamId(stream), probe), expected);
                    // The next block, where given, is the successor.
                    let with_next = index.lower_bound_and_next(StreamId(stream), probe);
                    assert_eq!(with_next.map(|(id, _)| id), expected);
                    if let Some((id, Some(next))) = with_next {
                        assert_eq!(next, index.successor(&blocks, id));
                    }
                    let below = reference
                        .range(..((stream, probe, 0), 0))
                        .next_back()
                        .filter(|((s, _, _), _)| *s == stream)
                        .map(|&(_, id)| id);
                    assert_eq!(index.last_below(StreamId(stream), probe), below);
                }
                for w in ordered.windows(2) {
                    let same_stream = blocks[w[0]].stream == blocks[w[1]].stream;
                    assert_eq!(index.successor(&blocks, w[0]), same_stream.then_some(w[1]));
                    assert_eq!(index.predecessor(&blocks, w[1]), same_stream.then_some(w[0]));
                }
            }
        }
    }

    /// The bytes of one stream's entry while it holds free blocks of one group of classes
    /// (at most 4 KB per idle stream, where it was about 10 KB): the entry, its
    /// one group of lists.
    #[test]
    fn a_stream_holding_one_free_block_costs_under_4_kb() {
        let mut blocks = Blocks::default();
        let mut index = FreeIndex::default();
        let first = add(&mut blocks, 5, 1 << 20, 0);
        let second = add(&mut blocks, 5, 3 << 20, 8192);
        index.insert(&blocks, first);
        index.insert(&blocks, second);
        let classes = index.stream(StreamId(5)).unwrap();
        let bytes =
            std::mem::size_of::<StreamClasses>() + classes.lists.capacity() * std::mem::size_of::<[List; LIST_GROUP]>();
        assert_eq!(classes.lists.len(), 1);
        assert!(bytes <= 4096, "{bytes} bytes");
    }

    /// A stream whose free blocks are all taken keeps no entry beyond a few left in place:
    /// 10,000 streams that each held free blocks once leave the index as small as a few
    /// streams do, and an emptied entry waits for reuse.
    #[test]
    fn idle_streams_cost_nothing() {
        let mut blocks = Blocks::default();
        let mut index = FreeIndex::default();
        for stream in 0..10_000u64 {
            // Two blocks, so that one is filed in the lists beside the recent one.
            let first = add(&mut blocks, stream, 1 << 20, stream * 8192);
            let second = add(&mut blocks, stream, 2 << 20, stream * 8192 + 4096);
            index.insert(&blocks, first);
            index.insert(&blocks, second);
            // Only the group of the filed block's size class has lists.
            let classes = index.stream(StreamId(stream)).unwrap();
            assert_eq!(classes.lists.len(), 1);
            index.remove(&blocks, first);
            index.remove(&blocks, second);
            blocks.remove(first);
            blocks.remove(second);
        }
        index.check(&blocks).unwrap();
        // The last streams' entries stay in place, empty; each made room by handing an older
        // one to the spares, where one entry served every stream after it.
        assert_eq!(index.streams.len(), IDLE_STREAMS);
        assert!(
            index.streams.iter().all(|classes| classes.filed == 0 && classes.stream.0 >= 10_000 - IDLE_STREAMS as u64)
        );
        assert_eq!(index.streams().count(), 0);
        assert_eq!(index.spare.len(), 1);
        // An emptied entry serves the next stream with its lists cleared.
        let id = add(&mut blocks, 77, 4096, 0);
        let other = add(&mut blocks, 77, 8192, 8192);
        index.insert(&blocks, id);
        index.insert(&blocks, other);
        index.check(&blocks).unwrap();
        assert_eq!(index.lower_bound(StreamId(77), 1), Some(id));
        assert!(index.spare.is_empty());
    }

    /// A stream whose one filed block is taken and freed again, step after step, keeps its
    /// entry where it is: nothing moves among the streams' entries or to the spares.
    #[test]
    fn a_stream_that_empties_and_fills_again_keeps_its_entry() {
        let mut blocks = Blocks::default();
        let mut index = FreeIndex::default();
        let others: Vec<u32> = (0..3).map(|s| add(&mut blocks, s * 2, 1 << 20, s << 30)).collect();
        let cycling = add(&mut blocks, 3, 1 << 20, 7 << 30);
        let spacer = add(&mut blocks, 3, 4096, 9 << 30);
        for &id in &others {
            index.insert(&blocks, id);
        }
        for _ in 0..100 {
            // Filed in its class list (the spacer becomes the recent block), then taken.
            index.insert(&blocks, cycling);
            index.insert(&blocks, spacer);
            index.remove(&blocks, spacer);
            assert_eq!(index.lower_bound(StreamId(3), 1 << 20), Some(cycling));
            index.remove(&blocks, cycling);
            index.check(&blocks).unwrap();
            assert_eq!(index.streams.iter().map(|c| c.stream.0).collect::<Vec<_>>(), [0, 2, 3, 4]);
            assert!(index.spare.is_empty());
        }
    }

    /// A stream's walk visits what `first_of_stream` and `successor` visit, in their order,
    /// in trees of every shape a run of inserts and removals leaves.
    #[test]
    fn a_stream_walk_follows_the_successors() {
        let mut blocks = Blocks::default();
        let mut tree = BlockTree::new();
        let mut ids = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for step in 0..3000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if ids.len() < 8 || !x.is_multiple_of(3) {
                let id = add(&mut blocks, x % 5, 512, step * 512);
                tree.insert(&mut blocks, id);
                ids.push(id);
            } else {
                let id = ids.swap_remove((x >> 20) as usize % ids.len());
                tree.remove(&mut blocks, id);
                blocks.remove(id);
            }
            if step % 97 == 0 {
                for stream in 0..6 {
                    let mut expected = Vec::new();
                    let mut cursor = tree.first_of_stream(&blocks, StreamId(stream));
                    while let Some(id) = cursor.filter(|&id| blocks[id].stream == StreamId(stream)) {
                        expected.push(id);
                        cursor = tree.successor(&blocks, id);
                    }
                    assert_eq!(tree.walk_stream(&blocks, StreamId(stream)).collect::<Vec<_>>(), expected);
                }
            }
        }
    }

    #[test]
    fn address_tree_orders_by_stream_and_address() {
        let mut blocks = Blocks::default();
        let mut tree = BlockTree::new();
        let ids: Vec<u32> = [(1, 300), (0, 200), (1, 100), (0, 400)]
            .into_iter()
            .map(|(s, p)| {
                let id = add(&mut blocks, s, 512, p);
                tree.insert(&mut blocks, id);
                id
            })
            .collect();
        tree.check(&blocks).unwrap();
        assert_eq!(tree.walk_stream(&blocks, StreamId(1)).collect::<Vec<_>>(), [ids[2], ids[0]]);
        assert_eq!(tree.first_of_stream(&blocks, StreamId(1)), Some(ids[2]));
        assert_eq!(tree.successor(&blocks, ids[2]), Some(ids[0]));
        assert_eq!(tree.first_of_stream(&blocks, StreamId(0)), Some(ids[1]));
        tree.remove(&mut blocks, ids[1]);
        assert_eq!(tree.first_of_stream(&blocks, StreamId(0)), Some(ids[3]));
        assert_eq!(tree.first_of_stream(&blocks, StreamId(2)), None);
    }
}
