//! The ordered sets of free blocks (PyTorch's `std::set<Block*>` with its comparators), as an
//! AVL tree whose links live inside the blocks themselves.
//!
//! Why not `BTreeSet`: inserting and removing in a `BTreeSet` allocates and frees nodes, and the
//! cache-hit path must not touch the heap. With the links in the block slab, insert, remove,
//! lower bound, successor and predecessor are O(log n) and allocation-free. A block is in at
//! most one set at a time (a pool's free set or its unmapped set), so one set of links suffices.

use crate::block::{Blocks, NIL};

/// The comparator a set orders its blocks by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// `BlockComparatorSize` of PyTorch 2.11: (stream, size, address).
    StreamSizeAddress,
    /// `BlockComparatorAddress`: (stream, address).
    StreamAddress,
}

/// A key in either order, compared lexicographically.
pub(crate) type Key = (u64, u64, u64);

#[derive(Clone, Debug)]
pub(crate) struct BlockTree {
    root: u32,
    len: usize,
    order: Order,
}

impl BlockTree {
    pub(crate) fn new(order: Order) -> Self {
        BlockTree { root: NIL, len: 0, order }
    }

    #[inline]
    pub(crate) fn key(&self, blocks: &Blocks, id: u32) -> Key {
        let b = &blocks[id];
        match self.order {
            Order::StreamSizeAddress => (b.stream.0, b.size, b.ptr),
            Order::StreamAddress => (b.stream.0, b.ptr, 0),
        }
    }

    pub(crate) fn insert(&mut self, blocks: &mut Blocks, id: u32) {
        let b = &mut blocks[id];
        b.left = NIL;
        b.right = NIL;
        b.height = 1;
        let key = self.key(blocks, id);
        self.root = self.insert_below(blocks, self.root, id, key);
        self.len += 1;
    }

    fn insert_below(&self, blocks: &mut Blocks, node: u32, id: u32, key: Key) -> u32 {
        if node == NIL {
            return id;
        }
        if key < self.key(blocks, node) {
            let left = self.insert_below(blocks, blocks[node].left, id, key);
            blocks[node].left = left;
        } else {
            let right = self.insert_below(blocks, blocks[node].right, id, key);
            blocks[node].right = right;
        }
        rebalance(blocks, node)
    }

    /// Removes `id`, which must be in this set with its key unchanged since insertion.
    pub(crate) fn remove(&mut self, blocks: &mut Blocks, id: u32) {
        let key = self.key(blocks, id);
        let mut found = false;
        self.root = self.remove_below(blocks, self.root, key, &mut found);
        debug_assert!(found, "block {id} not in its set");
        if found {
            self.len -= 1;
        }
    }

    fn remove_below(&self, blocks: &mut Blocks, node: u32, key: Key, found: &mut bool) -> u32 {
        if node == NIL {
            return NIL;
        }
        let here = self.key(blocks, node);
        if key < here {
            let left = self.remove_below(blocks, blocks[node].left, key, found);
            blocks[node].left = left;
        } else if key > here {
            let right = self.remove_below(blocks, blocks[node].right, key, found);
            blocks[node].right = right;
        } else {
            *found = true;
            let (left, right) = (blocks[node].left, blocks[node].right);
            if left == NIL {
                return right;
            }
            if right == NIL {
                return left;
            }
            let (rest, min) = remove_min(blocks, right);
            blocks[min].left = left;
            blocks[min].right = rest;
            return rebalance(blocks, min);
        }
        rebalance(blocks, node)
    }

    /// The first block whose key is `>= key`.
    #[inline]
    pub(crate) fn lower_bound(&self, blocks: &Blocks, key: Key) -> Option<u32> {
        let mut node = self.root;
        let mut best = NIL;
        while node != NIL {
            if self.key(blocks, node) >= key {
                best = node;
                node = blocks[node].left;
            } else {
                node = blocks[node].right;
            }
        }
        (best != NIL).then_some(best)
    }

    /// The block after `id` in set order.
    pub(crate) fn successor(&self, blocks: &Blocks, id: u32) -> Option<u32> {
        let key = self.key(blocks, id);
        let mut node = self.root;
        let mut best = NIL;
        while node != NIL {
            if self.key(blocks, node) > key {
                best = node;
                node = blocks[node].left;
            } else {
                node = blocks[node].right;
            }
        }
        (best != NIL).then_some(best)
    }

    /// The last block whose key is `< key`.
    pub(crate) fn before(&self, blocks: &Blocks, key: Key) -> Option<u32> {
        let mut node = self.root;
        let mut best = NIL;
        while node != NIL {
            if self.key(blocks, node) < key {
                best = node;
                node = blocks[node].right;
            } else {
                node = blocks[node].left;
            }
        }
        (best != NIL).then_some(best)
    }

    /// The block before `id` in set order.
    pub(crate) fn predecessor(&self, blocks: &Blocks, id: u32) -> Option<u32> {
        self.before(blocks, self.key(blocks, id))
    }

    /// The greatest block.
    pub(crate) fn last(&self, blocks: &Blocks) -> Option<u32> {
        let mut node = self.root;
        if node == NIL {
            return None;
        }
        while blocks[node].right != NIL {
            node = blocks[node].right;
        }
        Some(node)
    }

    /// All blocks in set order (for the rare walks over a whole pool).
    pub(crate) fn to_vec(&self, blocks: &Blocks) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len);
        let mut stack = Vec::new();
        let mut node = self.root;
        while node != NIL || !stack.is_empty() {
            while node != NIL {
                stack.push(node);
                node = blocks[node].left;
            }
            if let Some(top) = stack.pop() {
                out.push(top);
                node = blocks[top].right;
            }
        }
        out
    }

    /// Checks the AVL shape and ordering; returns the number of members.
    pub(crate) fn check(&self, blocks: &Blocks) -> Result<usize, String> {
        fn walk(
            t: &BlockTree,
            blocks: &Blocks,
            node: u32,
            lo: Option<Key>,
            hi: Option<Key>,
        ) -> Result<(u8, usize), String> {
            if node == NIL {
                return Ok((0, 0));
            }
            let key = t.key(blocks, node);
            if lo.is_some_and(|lo| key <= lo) || hi.is_some_and(|hi| key >= hi) {
                return Err(format!("block {node} out of order in its set"));
            }
            let (lh, ln) = walk(t, blocks, blocks[node].left, lo, Some(key))?;
            let (rh, rn) = walk(t, blocks, blocks[node].right, Some(key), hi)?;
            if lh.abs_diff(rh) > 1 || blocks[node].height != lh.max(rh) + 1 {
                return Err(format!("set node {node} unbalanced"));
            }
            Ok((lh.max(rh) + 1, ln + rn + 1))
        }
        let (_, n) = walk(self, blocks, self.root, None, None)?;
        if n != self.len {
            return Err(format!("set holds {n} blocks but counts {}", self.len));
        }
        Ok(n)
    }
}

#[inline]
fn height(blocks: &Blocks, node: u32) -> u8 {
    if node == NIL { 0 } else { blocks[node].height }
}

#[inline]
fn update(blocks: &mut Blocks, node: u32) {
    let h = height(blocks, blocks[node].left).max(height(blocks, blocks[node].right)) + 1;
    blocks[node].height = h;
}

fn rotate_right(blocks: &mut Blocks, node: u32) -> u32 {
    let left = blocks[node].left;
    blocks[node].left = blocks[left].right;
    blocks[left].right = node;
    update(blocks, node);
    update(blocks, left);
    left
}

fn rotate_left(blocks: &mut Blocks, node: u32) -> u32 {
    let right = blocks[node].right;
    blocks[node].right = blocks[right].left;
    blocks[right].left = node;
    update(blocks, node);
    update(blocks, right);
    right
}

fn rebalance(blocks: &mut Blocks, node: u32) -> u32 {
    update(blocks, node);
    let (left, right) = (blocks[node].left, blocks[node].right);
    let balance = i16::from(height(blocks, left)) - i16::from(height(blocks, right));
    if balance > 1 {
        if height(blocks, blocks[left].left) < height(blocks, blocks[left].right) {
            blocks[node].left = rotate_left(blocks, left);
        }
        return rotate_right(blocks, node);
    }
    if balance < -1 {
        if height(blocks, blocks[right].right) < height(blocks, blocks[right].left) {
            blocks[node].right = rotate_right(blocks, right);
        }
        return rotate_left(blocks, node);
    }
    node
}

/// Detaches the minimum of the subtree at `node`; returns (new subtree root, minimum).
fn remove_min(blocks: &mut Blocks, node: u32) -> (u32, u32) {
    let left = blocks[node].left;
    if left == NIL {
        return (blocks[node].right, node);
    }
    let (rest, min) = remove_min(blocks, left);
    blocks[node].left = rest;
    (rebalance(blocks, node), min)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::StreamId;
    use crate::block::Block;
    use crate::size::PoolKind;

    fn add(blocks: &mut Blocks, stream: u64, size: u64, ptr: u64) -> u32 {
        blocks.insert(Block::new(ptr, size, StreamId(stream), PoolKind::Large, NIL))
    }

    #[test]
    fn behaves_like_an_ordered_set() {
        let mut blocks = Blocks::default();
        let mut tree = BlockTree::new(Order::StreamSizeAddress);
        let mut reference = std::collections::BTreeSet::new();
        let mut ids = Vec::new();
        // A deterministic pseudo-random sequence of inserts and removals.
        let mut x: u64 = 12345;
        for step in 0..4000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if ids.is_empty() || x % 3 != 0 {
                let id = add(&mut blocks, x % 3, (x >> 8) % 64 * 512, step * 4096);
                tree.insert(&mut blocks, id);
                reference.insert((tree.key(&blocks, id), id));
                ids.push(id);
            } else {
                let id = ids.swap_remove((x >> 20) as usize % ids.len());
                reference.remove(&(tree.key(&blocks, id), id));
                tree.remove(&mut blocks, id);
                blocks.remove(id);
            }
            if step % 97 == 0 {
                tree.check(&blocks).unwrap();
                let ordered: Vec<u32> = reference.iter().map(|&(_, id)| id).collect();
                assert_eq!(tree.to_vec(&blocks), ordered);
                let probe = (x % 3, (x >> 12) % 64 * 512, 0);
                let expected = reference.range((probe, 0)..).next().map(|&(_, id)| id);
                assert_eq!(tree.lower_bound(&blocks, probe), expected);
                for w in ordered.windows(2) {
                    assert_eq!(tree.successor(&blocks, w[0]), Some(w[1]));
                    assert_eq!(tree.predecessor(&blocks, w[1]), Some(w[0]));
                }
                assert_eq!(tree.last(&blocks), ordered.last().copied());
            }
        }
    }
}
