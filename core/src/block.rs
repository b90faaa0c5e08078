//! Blocks and segments: the allocator's records of device memory, kept in slabs so that a
//! cache hit allocates nothing on the heap.
//!
//! A *segment* is one device allocation (or one expandable VA reservation); its blocks form a
//! doubly linked list in address order through `prev`/`next`, tiling the segment exactly.

use crate::backend::StreamId;
use crate::size::PoolKind;
use crate::trace::ContextId;
use crate::tree::TreeNode;

/// "No block" / "no segment" in the `u32` links.
pub(crate) const NIL: u32 = u32::MAX;

/// Where a block currently is; each block is in exactly one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Location {
    /// Allocated, or freed but waiting for cross-stream events (PyTorch's `active_blocks`).
    Active,
    /// Free and mapped: in its pool's size-ordered set.
    Free,
    /// Unmapped VA of an expandable segment: in its pool's address-ordered set.
    Unmapped,
    /// Taken out of its set for the few steps of an allocation.
    Detached,
}

/// One block: a range of a segment.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub ptr: u64,
    pub size: u64,
    /// The request of the last allocation that used this block object (stale once free,
    /// as in PyTorch: split tails keep the value of the object they were carved from).
    pub requested_size: u64,
    pub stream: StreamId,
    /// Streams other than `stream` that used the block (`record_stream`): a small set, out of
    /// line because it is rare and the block should stay small; `None` when empty.
    #[allow(clippy::box_collection, reason = "8 bytes in every block instead of 24 for a rare set")]
    pub stream_uses: Option<Box<Vec<StreamId>>>,
    pub event_count: u32,
    pub gc_count_base: i64,
    pub prev: u32,
    pub next: u32,
    pub segment: u32,
    pub pool: PoolKind,
    pub allocated: bool,
    pub mapped: bool,
    pub expandable: bool,
    pub location: Location,
    /// Bumped at every hand-out, so an old handle to a reused block is recognisably stale.
    pub generation: u32,
    /// Stack of the allocation that holds the block ([`NIL`] when none), kept as a bare index
    /// so the block stays small.
    context: u32,
}

impl Block {
    pub(crate) fn new(ptr: u64, size: u64, stream: StreamId, pool: PoolKind, segment: u32) -> Self {
        Block {
            ptr,
            size,
            requested_size: 0,
            stream,
            stream_uses: None,
            event_count: 0,
            gc_count_base: 0,
            prev: NIL,
            next: NIL,
            segment,
            pool,
            allocated: false,
            mapped: true,
            expandable: false,
            location: Location::Detached,
            generation: 0,
            context: NIL,
        }
    }

    #[inline]
    pub(crate) fn context(&self) -> Option<ContextId> {
        (self.context != NIL).then_some(ContextId(self.context))
    }

    #[inline]
    pub(crate) fn set_context(&mut self, context: Option<ContextId>) {
        self.context = context.map_or(NIL, |c| c.0);
    }

    /// Adds a stream to the block's cross-stream uses.
    pub(crate) fn add_stream_use(&mut self, stream: StreamId) {
        let uses = self.stream_uses.get_or_insert_with(Default::default);
        if !uses.contains(&stream) {
            uses.push(stream);
        }
    }

    #[inline]
    pub(crate) fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    /// Free with no pending cross-stream use: may be merged or reused.
    #[inline]
    pub(crate) fn is_allocatable(&self) -> bool {
        !self.allocated && self.event_count == 0 && self.stream_uses.is_none()
    }
}

/// A slab of values addressed by `u32`, reusing freed slots.
#[derive(Clone, Debug)]
pub(crate) struct Slab<T> {
    items: Vec<Option<T>>,
    vacant: Vec<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { items: Vec::new(), vacant: Vec::new(), len: 0 }
    }
}

impl<T> Slab<T> {
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        self.len += 1;
        if let Some(index) = self.vacant.pop() {
            self.items[index as usize] = Some(value);
            index
        } else {
            self.items.push(Some(value));
            (self.items.len() - 1) as u32
        }
    }

    /// The index the next `insert` will use.
    pub(crate) fn next_index(&self) -> u32 {
        self.vacant.last().copied().unwrap_or(self.items.len() as u32)
    }

    pub(crate) fn remove(&mut self, index: u32) -> Option<T> {
        let value = self.items.get_mut(index as usize)?.take()?;
        self.vacant.push(index);
        self.len -= 1;
        Some(value)
    }

    #[inline]
    pub(crate) fn get(&self, index: u32) -> Option<&T> {
        self.items.get(index as usize)?.as_ref()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.items.iter().enumerate().filter_map(|(i, v)| Some((i as u32, v.as_ref()?)))
    }
}

impl<T> std::ops::Index<u32> for Slab<T> {
    type Output = T;
    #[inline]
    fn index(&self, index: u32) -> &T {
        match self.items[index as usize].as_ref() {
            Some(value) => value,
            None => panic!("slab slot {index} is vacant: allocator state corrupted"),
        }
    }
}

impl<T> std::ops::IndexMut<u32> for Slab<T> {
    #[inline]
    fn index_mut(&mut self, index: u32) -> &mut T {
        match self.items[index as usize].as_mut() {
            Some(value) => value,
            None => panic!("slab slot {index} is vacant: allocator state corrupted"),
        }
    }
}

/// The blocks of one allocator. Slots keep their generation across reuse so that a handle to
/// a block that was merged away and whose slot now holds another block stays invalid.
#[derive(Clone, Debug, Default)]
pub(crate) struct Blocks {
    slab: Slab<Block>,
    /// Generation of every slot ever used, surviving vacancy.
    generations: Vec<u32>,
    /// Ordered-set links and keys, parallel to the slab. Kept apart from the blocks so that a
    /// tree walk touches one small node per level instead of a whole block.
    pub nodes: Vec<TreeNode>,
}

impl Blocks {
    pub(crate) fn insert(&mut self, mut block: Block) -> u32 {
        let slot = self.slab.next_index() as usize;
        if slot == self.generations.len() {
            self.generations.push(0);
            self.nodes.push(TreeNode::default());
        }
        block.generation = self.generations[slot];
        self.slab.insert(block)
    }

    pub(crate) fn remove(&mut self, index: u32) {
        if let Some(block) = self.slab.remove(index) {
            self.generations[index as usize] = block.generation;
        }
    }

    #[inline]
    pub(crate) fn get(&self, index: u32) -> Option<&Block> {
        self.slab.get(index)
    }

    pub(crate) fn len(&self) -> usize {
        self.slab.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Block)> {
        self.slab.iter()
    }
}

impl std::ops::Index<u32> for Blocks {
    type Output = Block;
    #[inline]
    fn index(&self, index: u32) -> &Block {
        &self.slab[index]
    }
}

impl std::ops::IndexMut<u32> for Blocks {
    #[inline]
    fn index_mut(&mut self, index: u32) -> &mut Block {
        &mut self.slab[index]
    }
}

/// What the allocator knows of one device allocation or expandable reservation.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    /// Device address of the allocation or of the VA reservation.
    pub base: u64,
    /// Bytes of the allocation, or of the whole VA reservation when expandable.
    pub size: u64,
    pub pool: PoolKind,
    pub stream: StreamId,
    /// First block of the list (lowest address).
    pub head: u32,
    /// Page size when this is an expandable segment.
    pub page_size: Option<u64>,
    /// Stack of the allocation that created (or first mapped) the segment.
    pub context: Option<ContextId>,
}
