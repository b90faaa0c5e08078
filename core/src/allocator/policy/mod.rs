//! Placement policies: the decisions that make one policy differ from another, behind one
//! trait, [`PolicyRules`], with PyTorch's rules as the default implementation (`pytorch.rs`)
//! and cachalot's own low-fragmentation rules (`policy:cachalot`, `cachalot.rs`) as another.
//!
//! - **Narrow**: a policy decides what a request is (rounding, block and segment size, pool,
//!   pages or segments), whether a best-fit hit is kept, whether a block is split, whether a
//!   miss is served first from another pool's free block, what cached memory a miss gives back
//!   before new memory is taken, and where in pages a miss maps. Everything else (best fit,
//!   splitting and merging, events, the retry chain's order, stats and trace events) is the
//!   allocator's, the same under every policy.
//! - **Read only**: every method reads the state and changes nothing, so that the malloc and
//!   the replay's plan of a malloc (`chain/`) ask the same rule and cannot drift apart. The
//!   allocator applies what a policy decided.
//! - **Static dispatch**: the configured [`Policy`](crate::config::Policy) is matched where a
//!   decision is asked ([`with_policy!`]), never through a trait object: on the hit path at each
//!   of its three decisions (one body for every policy keeps the compiler's layout of it, which
//!   a body per policy did not), and once per miss and per question of the replay, whose code
//!   then runs generic over the rules, PyTorch's empty ones (no give-backs, no other pool)
//!   compiled away.
//!
//! A new policy is a file here implementing [`PolicyRules`], a variant of
//! [`Policy`](crate::config::Policy) with its `policy:` name, and a line in [`with_policy!`].

mod cachalot;
mod pytorch;

pub(super) use cachalot::Cachalot;
pub(super) use cachalot::Settling;
pub(super) use pytorch::PyTorch;

use super::CachingAllocator;
use super::malloc::Request;
use crate::backend::{Backend, StreamId};
use crate::error::AllocatorError;

/// The decisions a placement policy makes, each read off the allocator's state. Implemented by
/// unit types, called as `P::request(allocator, ...)` from code generic over `P`.
pub(super) trait PolicyRules {
    /// The block and segment sizes, pool, pages or not, and routing of a request of `size`
    /// (> 0) bytes on `stream`.
    fn request<B: Backend>(allocator: &CachingAllocator<B>, size: u64, stream: StreamId) -> Request;

    /// Whether the best-fit free block `block` serves `request` (a hit), rather than the
    /// request going on as a miss.
    fn keeps_hit<B: Backend>(allocator: &CachingAllocator<B>, block: u32, request: &Request) -> bool;

    /// Whether a free block of `block_size` bytes serving `request` is split.
    fn splits<B: Backend>(allocator: &CachingAllocator<B>, block_size: u64, request: &Request) -> bool;

    /// The page size of a new expandable segment of the large pool (the small pool's is 2 MiB
    /// under every policy).
    fn large_page_size<B: Backend>(allocator: &CachingAllocator<B>) -> u64;

    /// The free block (of another pool) that serves a miss for `request` before the retry
    /// chain starts, and the request as that pool serves it; `None` to go on with the chain.
    fn other_pool_block<B: Backend>(allocator: &CachingAllocator<B>, request: &Request) -> Option<(u32, Request)>;

    /// The cached memory a miss for `request` gives back before new memory is taken, in
    /// order, into `scratch` (cleared first).
    fn give_backs_before_miss<B: Backend>(allocator: &CachingAllocator<B>, request: &Request, scratch: &mut GiveBacks);

    /// Whether a miss for `request` maps where it maps the fewest pages, rather than in the
    /// lowest run of free and unmapped blocks that holds it (PyTorch's `find_expandable_block`).
    fn maps_fewest_pages<B: Backend>(allocator: &CachingAllocator<B>, request: &Request) -> bool;
}

/// Runs `$body` with `$rules` naming the [`PolicyRules`] of the policy `$policy`: the one
/// place that lists the policies, matched once where the allocator enters code generic over
/// them.
macro_rules! with_policy {
    ($policy:expr, $rules:ident => $body:expr) => {
        match $policy {
            $crate::config::Policy::PyTorch => {
                type $rules = $crate::allocator::policy::PyTorch;
                $body
            }
            $crate::config::Policy::Cachalot => {
                type $rules = $crate::allocator::policy::Cachalot;
                $body
            }
        }
    };
}
pub(super) use with_policy;

/// What a policy's give-backs before a miss ([`PolicyRules::give_backs_before_miss`]) fill:
/// the plan, and the policy's working space. The allocator keeps one between misses, so that
/// a warm miss allocates nothing: a miss at the peak under `policy:cachalot` allocated and
/// freed both vectors, 2.6% of trace-multistream's instructions.
#[derive(Debug, Default)]
pub(super) struct GiveBacks {
    pub(super) plan: Vec<GiveBack>,
    /// Whether the miss would have passed the peak (rule 4's trigger under `policy:cachalot`),
    /// whatever it then gave back: rule 7 counts what it gave back.
    pub(super) at_peak: bool,
    /// One cursor per (pool, stream), at its largest free block not yet visited (rule 4's walk).
    pub(super) cursors: Vec<(crate::size::PoolKind, Option<u32>)>,
}

/// One give-back before a miss: the free block given back from, the bytes still wanted when it
/// is reached, and the bytes it gives (one `segment_free` or `segment_unmap` entry).
#[derive(Debug)]
pub(super) struct GiveBack {
    pub(super) block: u32,
    pub(super) wanted: u64,
    pub(super) bytes: u64,
}

impl<B: Backend> CachingAllocator<B> {
    /// The page size of a new expandable segment of `pool` under the configured policy.
    pub(super) fn expandable_page_size(&self, pool: crate::size::PoolKind) -> u64 {
        match pool {
            crate::size::PoolKind::Small => crate::size::SMALL_BUFFER,
            crate::size::PoolKind::Large => with_policy!(self.config.policy(), P => P::large_page_size(self)),
        }
    }

    /// Whether a miss for `request` maps where it maps the fewest pages (rule 7 of
    /// `policy:cachalot`) under the configured policy: the one place that decides it, for the
    /// malloc (`expandable_room`) and its plan (`CutView::room`) alike.
    pub(super) fn maps_fewest_pages(&self, request: &Request) -> bool {
        with_policy!(self.config.policy(), P => P::maps_fewest_pages(self, request))
    }

    /// Before a miss takes new memory for `request`: gives back what the policy `P` decides
    /// ([`PolicyRules::give_backs_before_miss`]), in its order, and tells rule 7 of
    /// `policy:cachalot` what a miss at the peak gave back (counted when the miss ends).
    pub(super) fn give_back_before_miss<P: PolicyRules>(&mut self, request: &Request) -> Result<(), AllocatorError> {
        // The vectors of the last miss are reused (an error drops them: the next miss makes new ones).
        let mut scratch = std::mem::take(&mut self.give_back_scratch);
        P::give_backs_before_miss(self, request, &mut scratch);
        if scratch.at_peak {
            self.settling.at_peak(scratch.plan.iter().map(|g| g.bytes).sum());
        }
        for give_back in &scratch.plan {
            let given = self.give_back_from(give_back.block, give_back.wanted)?;
            debug_assert_eq!(given, give_back.bytes, "the give-back gave what its plan said");
        }
        self.give_back_scratch = scratch;
        Ok(())
    }

    /// The page range `give_back_from(id, wanted)` unmaps from the expandable free block `id`
    /// (first page and end, counted from its segment's base, with the page size), or `None`
    /// where the block holds no whole page: the fewest pages at its top that cover `wanted`.
    pub(super) fn pages_given_back_from(&self, id: u32, wanted: u64) -> Option<(u64, u64, u64)> {
        let b = &self.blocks[id];
        let (base, page) = self.segment_pages(b.segment);
        let first = (b.ptr - base).div_ceil(page);
        let end = (b.ptr + b.size - base) / page;
        (first < end).then(|| (first.max(end - wanted.div_ceil(page).min(end - first)), end, page))
    }

    /// The bytes `give_back_from(id, wanted)` gives back, without giving them.
    pub(super) fn bytes_given_back_from(&self, id: u32, wanted: u64) -> u64 {
        let b = &self.blocks[id];
        match b.expandable {
            false if b.is_split() => 0,
            false => b.size,
            true => self.pages_given_back_from(id, wanted).map_or(0, |(begin, end, page)| (end - begin) * page),
        }
    }

    /// Gives back up to about `wanted` bytes of the free block `id`: the fully free pages at
    /// its top, as few as cover `wanted`, or the whole block if it is an entire ordinary
    /// segment. Returns the bytes given back.
    fn give_back_from(&mut self, id: u32, wanted: u64) -> Result<u64, AllocatorError> {
        let b = &self.blocks[id];
        if !b.expandable {
            if b.is_split() {
                return Ok(0);
            }
            let size = b.size;
            self.release_block(id)?;
            return Ok(size);
        }
        let Some((begin, end, page)) = self.pages_given_back_from(id, wanted) else {
            return Ok(0);
        };
        let ptr = self.blocks[id].ptr;
        let cut = self.segments[self.blocks[id].segment].base + begin * page;
        if cut > ptr {
            // The pages kept stay mapped as a free block of their own below the ones unmapped.
            self.remove_free(id);
            let below = self.blocks.insert(self.sibling(id, ptr, cut - ptr));
            let prev = self.blocks[id].prev;
            self.splice(below, prev, id);
            self.insert_free(below);
            let b = &mut self.blocks[id];
            b.ptr = cut;
            b.size -= cut - ptr;
            self.insert_free(id);
        }
        self.unmap_block(id)?;
        if !self.blocks[id].is_split() {
            self.release_expandable_segment(id)?;
        }
        Ok((end - begin) * page)
    }
}
