//! What the recording leaves out, inferred from the allocator's state at the entry that asks:
//! whether a run of releases was the next malloc's doing or an `empty_cache` call the program
//! made (PyTorch logs no entry for that call), and which VA reservations a failing request made
//! (the trace shows them only when a later request maps a page there). Each question is put to
//! the allocator's own plan of a malloc; only where that plan does not tell is the malloc tried
//! on a copy of the live state, counted, as a copy per entry makes a replay quadratic.

use cachalot_core::CachingAllocator;
use cachalot_core::backend::Segments;
use cachalot_core::config::Policy;
use cachalot_core::sim::SimBackend;
use cachalot_core::size::{SMALL_BUFFER, SMALL_SIZE, allocation_size, round_size};
use cachalot_core::trace::{TraceAction, TraceEntry};

use super::recording::ShownReservations;

/// The addresses of the VA reservations that the failing request `trace[at]` makes, where the
/// trace shows them. PyTorch's `find_expandable_block` reserves a new segment when no segment of
/// the stream and pool has room, whether or not mapping it then fails, and each step of the
/// retry chain tries again; the new reservations stay, unmapped, and the trace first shows one
/// when a later request of that stream and pool maps a page there. Such a request takes the
/// lowest of the stream's unmapped reservations, so later failures of the same stream and pool
/// (whose reservations may lie lower) interleave theirs with these: a reservation the trace
/// starts after `at`, for the stream and pool, is one of these only if its range stayed free of
/// every other reservation the trace shows from `at` on (one of a later failure may have taken
/// an address that was in use at `at`), and lies outside every reservation that was live before
/// the failure and outlives it (an earlier failure's, still unshown). Those never shown take
/// addresses of the simulator's own.
///
/// How many reservations the request makes is read off the allocator's state
/// ([`CachingAllocator::reservations_of_failing_malloc`]); only where it does not tell is the
/// request tried on a copy of the live state (counted in `trial_copies`).
pub(super) fn oom_reservation_addresses(
    allocator: &CachingAllocator<SimBackend>,
    trace: &[TraceEntry],
    shown: &ShownReservations,
    at: usize,
    trial_copies: &mut usize,
) -> Vec<u64> {
    let e = &trace[at];
    let small = e.size <= SMALL_SIZE;
    let Some(later) = shown.of_stream_and_pool(e.stream, small, at) else { return Vec::new() };
    let sim = allocator.backend();
    let (made, outlived) = match allocator.reservations_of_failing_malloc(e.size, e.stream) {
        Some(made) => (made as usize, None),
        None => {
            *trial_copies += 1;
            let mut probe = allocator.trial_copy(sim.trial_copy());
            probe.backend_mut().set_reservations_unplanned(true);
            let before = probe.backend().reservations_made();
            let _ = probe.malloc(e.size, e.stream);
            ((probe.backend().reservations_made() - before) as usize, Some(probe))
        }
    };
    // A reservation live before the failure and after it; the failure's own new ones, at
    // addresses of the simulator's own, are those the answer places.
    let outlives = |base: u64| {
        sim.is_reserved(base)
            && match &outlived {
                Some(probe) => probe.backend().is_reserved(base),
                None => allocator.reservation_outlives_release(base),
            }
    };
    let mut addresses = Vec::new();
    for (base, blocked_until) in later {
        if addresses.len() == made {
            break;
        }
        if blocked_until <= at && !outlives(base) {
            addresses.push(base);
        }
    }
    addresses
}

/// Decides whether the releases `trace[i..i + run]` are the work of the next malloc (garbage
/// collection, the oversize release or the full release of the retry chain, `policy:cachalot`'s
/// return of cached memory before a new peak, after which that policy may serve the request in
/// the pages it kept, so the allocation follows the releases directly) or of an `empty_cache`
/// call: the malloc's, when it would release exactly `run` segments itself. That count is read
/// off the allocator's state ([`CachingAllocator::releases_of_malloc`]); only where the state
/// does not tell is the malloc tried on a copy of the live state (counted in `trial_copies`).
pub(super) fn released_by_next_malloc(
    allocator: &CachingAllocator<SimBackend>,
    trace: &[TraceEntry],
    i: usize,
    run: usize,
    trial_copies: &mut usize,
) -> bool {
    let Some(next) = trace.get(i + run) else { return false };
    match next.action {
        TraceAction::Oom => true,
        // A miss may release (`policy:cachalot`'s give-backs, the garbage collector) and then be
        // served in mapped memory, with nothing allocated or mapped: its releases are followed
        // by the allocation itself. Otherwise this is read as an `empty_cache` call before the
        // allocation; that is also how the full release of a refused device allocation reads
        // when its synchronization frees the block the retry then takes (the same release).
        TraceAction::Alloc => {
            let device_free = unbacked_bytes(allocator.backend());
            allocator.releases_of_malloc_served_in_place(next.size, next.stream, device_free) == Some(run as u64)
        }
        TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
            let Some(request) = trace[i + run..]
                .iter()
                .find(|n| !matches!(n.action, TraceAction::SegmentAlloc | TraceAction::SegmentMap))
            else {
                return false;
            };
            if !matches!(request.action, TraceAction::Alloc) {
                return false;
            }
            if first_device_allocation_succeeds(allocator, request.size) {
                // The malloc's first device allocation succeeds, so it releases nothing: no
                // copy of the allocator is needed to see that (a copy per release run made
                // replay quadratic in the trace's length on traces that churn segments).
                return false;
            }
            // Garbage collection or a refusal would run: how much the malloc would release is
            // read off the state, in the time of the releases themselves (a copy of the live
            // state per release run made replay quadratic where many blocks stay live).
            let device_free = unbacked_bytes(allocator.backend());
            if let Some(releases) = allocator.releases_of_malloc(request.size, request.stream, device_free) {
                return releases == run as u64;
            }
            // The state does not tell: the malloc is tried on a copy of the live state (not of
            // the history or the address plan, which grow with the trace).
            *trial_copies += 1;
            let mut probe = allocator.trial_copy(allocator.backend().trial_copy());
            let before = probe.stats().num_device_free;
            probe.malloc(request.size, request.stream).is_ok() && probe.stats().num_device_free - before == run as u64
        }
        _ => false,
    }
}

/// Whether a malloc of `size` bytes that finds no cached block gets its memory from the device
/// at the first try, so that it releases no cached segment. It follows the steps of `malloc`
/// before that first try, each of which could release: the garbage collector (on with a memory
/// fraction and a threshold) releases nothing while the reserved bytes are within its
/// threshold; the fraction refuses a segment that would take the reserved bytes past the
/// allowance; the device refuses what it has no room for. With expandable segments the first
/// try maps pages for the request, at most its size rounded up to whole pages of its pool
/// (a page more is asked for, to be sure); under `policy:cachalot` their size is the policy's,
/// so that case is left to the trial.
fn first_device_allocation_succeeds(allocator: &CachingAllocator<SimBackend>, size: u64) -> bool {
    let config = allocator.config();
    let reserved = allocator.memory_reserved();
    let rounded = round_size(size, config.roundup_power2_divisions());
    let segment = allocation_size(rounded, config.large_segment_size());
    if let Some(allowed) = allocator.allowed_memory_maximum() {
        let threshold = config.garbage_collection_threshold();
        if threshold > 0.0 && reserved > (threshold * allowed as f64) as u64 {
            return false;
        }
        if reserved.saturating_add(segment) > allowed {
            return false;
        }
    }
    let needed = if config.expandable_segments() {
        if config.policy() != Policy::PyTorch {
            return false;
        }
        let page = if rounded <= SMALL_SIZE { SMALL_BUFFER } else { config.large_segment_size() };
        rounded.div_ceil(page).saturating_add(1).saturating_mul(page)
    } else {
        segment
    };
    unbacked_bytes(allocator.backend()) >= needed
}

/// The simulated device's bytes that back nothing (its total less its segments and mapped
/// pages): what a device allocation made now could get, the recorded free memory of an `oom`
/// entry aside.
fn unbacked_bytes(sim: &SimBackend) -> u64 {
    sim.device().total_memory.saturating_sub(sim.used())
}
