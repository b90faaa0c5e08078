//! The retry chain of a cache miss (`docs/allocator-rules.md` §9–§13), written once.
//!
//! [`walk`] takes PyTorch's steps in PyTorch's order: the policy's other pool (rule 5 of
//! `policy:cachalot`), the policy's give-backs before the miss (rule 4), the garbage collector,
//! a device allocation, the release of oversize blocks and a second allocation, the release of
//! the whole cache (not while allocations are routed to a pool: it synchronizes, which a
//! capture must not) and a last allocation; then out of memory. It is generic over how a step
//! is taken ([`Steps`]):
//!
//! - [`Apply`] is the malloc's: each step changes the state and calls the device;
//! - the replay's questions (`plan.rs`) take each step over a model of the device and of what
//!   the earlier steps took, without changing anything.
//!
//! Each step's decision is one function of the state that both ask: the policy's
//! ([`PolicyRules`]), [`CachingAllocator::garbage_to_collect`] and
//! [`CachingAllocator::oversize_to_release`]. A change to the chain's order or to a step's
//! decision is then made once, and the replay's answers follow it (the test below changes one).

mod cuts;
mod plan;

pub(super) use cuts::{CutView, Part};

use std::marker::PhantomData;

use super::CachingAllocator;
use super::malloc::Request;
use super::policy::PolicyRules;
use crate::backend::Backend;
use crate::error::AllocatorError;

/// One way of taking the retry chain's steps ([`walk`]), for one request.
pub(super) trait Steps {
    /// What stops the walk early.
    type Error;

    /// The policy serves the miss from another pool's free block
    /// ([`PolicyRules::other_pool_block`]): whether it does, which ends the chain, served.
    fn other_pool_block(&mut self) -> Result<bool, Self::Error>;

    /// The policy's give-backs before a miss ([`PolicyRules::give_backs_before_miss`]).
    fn give_back_before_miss(&mut self) -> Result<(), Self::Error>;

    /// `garbage_collect_cached_blocks` ([`CachingAllocator::garbage_to_collect`]).
    fn collect_garbage(&mut self) -> Result<(), Self::Error>;

    /// `alloc_block`: a new segment, or pages mapped; whether the request is served.
    /// `is_retry` after the full release (counted in `num_alloc_retries`).
    fn allocate(&mut self, is_retry: bool) -> Result<bool, Self::Error>;

    /// `release_available_cached_blocks` ([`CachingAllocator::oversize_to_release`]): whether
    /// it released enough for the request (then the allocation is tried again).
    fn release_oversize(&mut self) -> Result<bool, Self::Error>;

    /// `release_cached_blocks`: every free segment and page of the cache, after the
    /// outstanding cross-stream frees have completed.
    fn release_all(&mut self) -> Result<(), Self::Error>;
}

/// How a [`walk`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Served from another pool's free block.
    OtherPool,
    /// Served by a device allocation (or by pages already mapped that one found).
    Allocated,
    /// Every step taken, nothing served.
    OutOfMemory,
}

/// The retry chain, in PyTorch's order (see the module doc), over `steps`: the one place that
/// says which step comes after which. `collects_garbage`: the garbage collector runs (a memory
/// fraction and a threshold are set); `routed`: allocations are routed to a pool, so the
/// chain has no full release.
#[inline(always)]
pub(super) fn walk<S: Steps>(steps: &mut S, collects_garbage: bool, routed: bool) -> Result<Outcome, S::Error> {
    if !skipped(Step::OtherPool) && steps.other_pool_block()? {
        return Ok(Outcome::OtherPool);
    }
    if !skipped(Step::GiveBack) {
        steps.give_back_before_miss()?;
    }
    if collects_garbage && !skipped(Step::CollectGarbage) {
        steps.collect_garbage()?;
    }
    if steps.allocate(false)? {
        return Ok(Outcome::Allocated);
    }
    if !skipped(Step::ReleaseOversize) && steps.release_oversize()? && steps.allocate(false)? {
        return Ok(Outcome::Allocated);
    }
    if routed || skipped(Step::ReleaseAll) {
        return Ok(Outcome::OutOfMemory);
    }
    steps.release_all()?;
    match steps.allocate(true)? {
        true => Ok(Outcome::Allocated),
        false => Ok(Outcome::OutOfMemory),
    }
}

/// A step of [`walk`] that a test may leave out, to show that the malloc and the replay's plan
/// both follow the change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    OtherPool,
    GiveBack,
    CollectGarbage,
    ReleaseOversize,
    ReleaseAll,
}

#[cfg(not(test))]
#[inline(always)]
fn skipped(_: Step) -> bool {
    false
}

#[cfg(test)]
thread_local! {
    /// The step the current test's chain leaves out.
    static SKIPPED: std::cell::Cell<Option<Step>> = const { std::cell::Cell::new(None) };
}

#[cfg(test)]
fn skipped(step: Step) -> bool {
    SKIPPED.with(|skipped| skipped.get() == Some(step))
}

/// The malloc's steps: each changes the state and calls the device. Remembers the block that
/// serves the request, and the request as its pool serves it.
pub(super) struct Apply<'a, B: Backend, P> {
    allocator: &'a mut CachingAllocator<B>,
    request: Request,
    served: Option<(u32, Request)>,
    policy: PhantomData<P>,
}

impl<'a, B: Backend, P: PolicyRules> Apply<'a, B, P> {
    /// The steps of a miss for `request` on `allocator`.
    pub(super) fn new(allocator: &'a mut CachingAllocator<B>, request: Request) -> Self {
        Apply { allocator, request, served: None, policy: PhantomData }
    }

    /// The block that serves the request (out of its pool's free set), and the request as
    /// its pool serves it; `None` when the chain ran out of memory.
    pub(super) fn served(&self) -> Option<(u32, Request)> {
        self.served
    }
}

impl<B: Backend, P: PolicyRules> Steps for Apply<'_, B, P> {
    type Error = AllocatorError;

    fn other_pool_block(&mut self) -> Result<bool, AllocatorError> {
        let Some((block, served)) = P::other_pool_block(self.allocator, &self.request) else {
            return Ok(false);
        };
        self.allocator.remove_free(block);
        self.served = Some((block, served));
        Ok(true)
    }

    fn give_back_before_miss(&mut self) -> Result<(), AllocatorError> {
        self.allocator.give_back_before_miss::<P>(&self.request)
    }

    fn collect_garbage(&mut self) -> Result<(), AllocatorError> {
        self.allocator.garbage_collect_cached_blocks()
    }

    fn allocate(&mut self, is_retry: bool) -> Result<bool, AllocatorError> {
        let found = self.allocator.alloc_block(&self.request, is_retry)?;
        self.served = found.map(|block| (block, self.request));
        Ok(found.is_some())
    }

    fn release_oversize(&mut self) -> Result<bool, AllocatorError> {
        self.allocator.release_available_cached_blocks(&self.request)
    }

    fn release_all(&mut self) -> Result<(), AllocatorError> {
        self.allocator.release_cached_blocks()
    }
}

#[cfg(test)]
mod tests {
    use super::{SKIPPED, Step};
    use crate::config::AllocatorConfig;
    use crate::size::MIB;
    use crate::{CachingAllocator, SimBackend, StreamId};

    const DEVICE: u64 = 1 << 30;

    /// What the replay's plan says a malloc of `size` on `stream` releases, and what the malloc
    /// then releases (made on a copy), with the chain leaving out `skipped`.
    fn planned_and_made(
        allocator: &CachingAllocator<SimBackend>,
        size: u64,
        stream: StreamId,
        skipped: Option<Step>,
    ) -> (Option<u64>, u64) {
        SKIPPED.with(|step| step.set(skipped));
        let device_free = DEVICE - allocator.backend().used();
        let planned = allocator.releases_of_malloc(size, stream, device_free);
        let mut copy = allocator.trial_copy(allocator.backend().trial_copy());
        let before = copy.stats().num_device_free;
        let made = copy.malloc(size, stream).map(|_| copy.stats().num_device_free - before);
        SKIPPED.with(|step| step.set(None));
        copy.check_consistency().unwrap();
        (planned, made.unwrap())
    }

    /// Leaving the oversize release out of the chain (one edit, in `walk`) changes what the
    /// malloc releases and what the replay's plan says it releases alike: the full release then
    /// takes the small segment too.
    #[test]
    fn a_step_left_out_of_the_chain_changes_the_malloc_and_its_plan_alike() {
        let config = AllocatorConfig::parse("max_split_size_mb:20").unwrap();
        let mut allocator = CachingAllocator::new(SimBackend::new(DEVICE), config).unwrap();
        allocator.set_memory_fraction(0.1).unwrap();
        let blocks: Vec<_> = [40 * MIB, 40 * MIB, MIB]
            .into_iter()
            .map(|size| allocator.malloc(size, StreamId::DEFAULT).unwrap())
            .collect();
        for block in blocks {
            allocator.free(block).unwrap();
        }
        // 50 MiB beside the 82 cached passes the fraction's 102.4: the two oversize segments go.
        assert_eq!(planned_and_made(&allocator, 50 * MIB, StreamId::DEFAULT, None), (Some(2), 2));
        let without = planned_and_made(&allocator, 50 * MIB, StreamId::DEFAULT, Some(Step::ReleaseOversize));
        assert_eq!(without, (Some(3), 3), "the full release takes the small segment too");
    }

    /// The same for a policy's step: `policy:cachalot`'s give-backs before a miss at the peak.
    #[test]
    fn a_policy_step_left_out_of_the_chain_changes_the_malloc_and_its_plan_alike() {
        let config = AllocatorConfig::parse("policy:cachalot").unwrap();
        let mut allocator = CachingAllocator::new(SimBackend::new(DEVICE), config).unwrap();
        let a = allocator.malloc(40 * MIB, StreamId::DEFAULT).unwrap();
        allocator.malloc(8 * MIB, StreamId(7)).unwrap();
        allocator.free(a).unwrap();
        // 40 MiB cached at the peak of 48: another stream's 20 MiB gives 20 of them back first.
        assert_eq!(planned_and_made(&allocator, 20 * MIB, StreamId(9), None), (Some(1), 1));
        assert_eq!(planned_and_made(&allocator, 20 * MIB, StreamId(9), Some(Step::GiveBack)), (Some(0), 0));
    }
}
