//! Blocks and segments: the allocator's records of device memory, kept in slabs so that a
//! cache hit allocates nothing on the heap.
//!
//! A *segment* is one device allocation (or one expandable VA reservation); its blocks form a
//! doubly linked list in address order through `prev`/`next`, tiling the segment exactly.

use crate::backend::StreamId;
use crate::size::PoolKind;
use crate::trace::ContextId;

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
    /// An empty slot of the slab (the block was merged away or released).
    Vacant,
}

/// One block: a range of a segment. Exactly one cache line: everything an allocation or a free
/// reads, including the AVL links used while the block is unmapped VA (the free set keeps its
/// own keys; either way the block's `size`/`ptr`/`stream` never change while it is in a set).
/// What only some configurations need lives in [`BlockCold`].
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub(crate) struct Block {
    pub ptr: u64,
    pub size: u64,
    /// The request of the last allocation that used this block object (stale once free,
    /// as in PyTorch: split tails keep the value of the object they were carved from).
    pub requested_size: u64,
    pub stream: StreamId,
    pub prev: u32,
    pub next: u32,
    /// Links of the unmapped-VA AVL tree, while the block is in it.
    pub left: u32,
    pub right: u32,
    pub segment: u32,
    /// Bumped at every hand-out, so an old handle to a reused block is recognisably stale; it
    /// survives vacancy of the slot.
    pub generation: u32,
    /// Outstanding cross-stream events.
    pub event_count: u16,
    /// Height of the block in the unmapped-VA AVL tree.
    pub height: u8,
    pub pool: PoolKind,
    pub allocated: bool,
    pub mapped: bool,
    pub expandable: bool,
    pub location: Location,
}

const _: () = assert!(std::mem::size_of::<Block>() == 64, "a block is one cache line");

/// The parts of a block that only some uses need: the garbage collector's insertion time,
/// `record_stream` targets and allocation stacks. Kept apart so the hot path does not carry
/// them; written only once the allocator has started using them.
#[derive(Clone, Debug)]
pub(crate) struct BlockCold {
    pub gc_count_base: i64,
    /// Streams other than the block's own that used it (`record_stream`); `None` when none.
    #[allow(clippy::box_collection, reason = "8 bytes per block instead of 24 for a rare set")]
    pub stream_uses: Option<Box<Vec<StreamId>>>,
    /// Stack of the allocation that holds the block ([`NIL`] when none).
    pub context: u32,
}

impl Default for BlockCold {
    fn default() -> Self {
        BlockCold { gc_count_base: 0, stream_uses: None, context: NIL }
    }
}

impl Block {
    pub(crate) fn new(ptr: u64, size: u64, stream: StreamId, pool: PoolKind, segment: u32) -> Self {
        Block {
            ptr,
            size,
            requested_size: 0,
            stream,
            prev: NIL,
            next: NIL,
            left: NIL,
            right: NIL,
            segment,
            generation: 0,
            event_count: 0,
            height: 0,
            pool,
            allocated: false,
            mapped: true,
            expandable: false,
            location: Location::Detached,
        }
    }

    #[inline]
    pub(crate) fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
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

    pub(crate) fn remove(&mut self, index: u32) -> Option<T> {
        let value = self.items.get_mut(index as usize)?.take()?;
        self.vacant.push(index);
        self.len -= 1;
        Some(value)
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

/// The blocks of one allocator: a slab of cache-line blocks with a parallel array of their
/// cold parts. Vacant slots keep their generation, so a handle to a block that was merged away
/// and whose slot now holds another block stays invalid.
#[derive(Clone, Debug, Default)]
pub(crate) struct Blocks {
    hot: Vec<Block>,
    cold: Vec<BlockCold>,
    vacant: Vec<u32>,
    len: usize,
    /// Whether any cold part was ever written; until then none needs resetting.
    cold_in_use: bool,
    /// Blocks whose `stream_uses` is set: while none is, no free needs to read a cold part.
    with_stream_uses: usize,
}

impl Blocks {
    #[inline]
    pub(crate) fn insert(&mut self, mut block: Block) -> u32 {
        self.len += 1;
        if let Some(index) = self.vacant.pop() {
            let slot = index as usize;
            block.generation = self.hot[slot].generation;
            self.hot[slot] = block;
            if self.cold_in_use {
                self.cold[slot] = BlockCold::default();
            }
            index
        } else {
            self.hot.push(block);
            self.cold.push(BlockCold::default());
            (self.hot.len() - 1) as u32
        }
    }

    pub(crate) fn remove(&mut self, index: u32) {
        let block = &mut self.hot[index as usize];
        debug_assert!(block.location != Location::Vacant);
        block.location = Location::Vacant;
        self.vacant.push(index);
        self.len -= 1;
    }

    /// The block in slot `index`, if the slot holds one.
    #[inline]
    pub(crate) fn get(&self, index: u32) -> Option<&Block> {
        self.hot.get(index as usize).filter(|b| b.location != Location::Vacant)
    }

    /// The cold part of a block.
    #[inline]
    pub(crate) fn cold(&self, index: u32) -> &BlockCold {
        &self.cold[index as usize]
    }

    /// The cold part of a block, for writing.
    #[inline]
    pub(crate) fn cold_mut(&mut self, index: u32) -> &mut BlockCold {
        self.cold_in_use = true;
        &mut self.cold[index as usize]
    }

    /// Free with no pending cross-stream use: may be merged or reused.
    #[inline]
    pub(crate) fn is_allocatable(&self, index: u32) -> bool {
        let b = &self.hot[index as usize];
        !b.allocated
            && b.event_count == 0
            && (self.with_stream_uses == 0 || self.cold[index as usize].stream_uses.is_none())
    }

    /// Adds `stream` to the block's stream uses; `Err(n)` if it already has `u16::MAX` (the most
    /// events one block can wait for).
    pub(crate) fn add_stream_use(&mut self, index: u32, stream: StreamId) -> Result<(), usize> {
        let cold = &mut self.cold[index as usize];
        let uses = match &mut cold.stream_uses {
            Some(uses) => uses,
            None => {
                self.with_stream_uses += 1;
                cold.stream_uses.insert(Box::default())
            }
        };
        if !uses.contains(&stream) {
            if uses.len() >= usize::from(u16::MAX) {
                return Err(uses.len());
            }
            uses.push(stream);
        }
        self.cold_in_use = true;
        Ok(())
    }

    /// Whether the block was used on streams other than its own: while no block was, no cold
    /// part is read.
    #[inline]
    pub(crate) fn has_stream_uses(&self, index: u32) -> bool {
        self.with_stream_uses != 0 && self.cold[index as usize].stream_uses.is_some()
    }

    /// Takes the block's stream uses (empty when it has none).
    pub(crate) fn take_stream_uses(&mut self, index: u32) -> Vec<StreamId> {
        match self.cold[index as usize].stream_uses.take() {
            Some(uses) => {
                self.with_stream_uses -= 1;
                *uses
            }
            None => Vec::new(),
        }
    }

    /// Checks the count of blocks with stream uses against the blocks.
    pub(crate) fn check_stream_uses(&self) -> Result<(), String> {
        let counted = self.iter().filter(|(i, _)| self.cold[*i as usize].stream_uses.is_some()).count();
        if counted != self.with_stream_uses {
            return Err(format!("{counted} blocks have stream uses but {} are counted", self.with_stream_uses));
        }
        Ok(())
    }

    /// Gives back stream uses taken by [`Blocks::take_stream_uses`] (when recording their
    /// events failed).
    pub(crate) fn restore_stream_uses(&mut self, index: u32, uses: Vec<StreamId>) {
        if !uses.is_empty() && self.cold[index as usize].stream_uses.replace(Box::new(uses)).is_none() {
            self.with_stream_uses += 1;
        }
    }

    /// The stack recorded for a block.
    #[inline]
    pub(crate) fn context(&self, index: u32) -> Option<ContextId> {
        let context = self.cold[index as usize].context;
        (context != NIL).then_some(ContextId(context))
    }

    /// All blocks, for the tree walks.
    #[inline]
    pub(crate) fn slice(&self) -> &[Block] {
        &self.hot
    }

    /// All blocks, for the tree updates.
    #[inline]
    pub(crate) fn slice_mut(&mut self) -> &mut [Block] {
        &mut self.hot
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Block)> {
        self.hot.iter().enumerate().filter(|(_, b)| b.location != Location::Vacant).map(|(i, b)| (i as u32, b))
    }
}

impl std::ops::Index<u32> for Blocks {
    type Output = Block;
    #[inline]
    fn index(&self, index: u32) -> &Block {
        &self.hot[index as usize]
    }
}

impl std::ops::IndexMut<u32> for Blocks {
    #[inline]
    fn index_mut(&mut self, index: u32) -> &mut Block {
        &mut self.hot[index as usize]
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
    /// The slot of the private pool the segment belongs to, [`NIL`] for the default pools.
    pub private: u32,
}
