//! `SimBackend`: a device with a capacity and a deterministic address space but no memory.
//!
//! It serves replays, what-if planning, tests and machines without a GPU. Addresses come from a
//! bump pointer that never reuses an address (as the CUDA driver was observed to do), or from a
//! plan: the addresses a recorded trace got, because PyTorch 2.11 breaks best-fit ties by device
//! address. Streams are instantly idle unless a test or a replay holds one busy.

use std::collections::{BTreeMap, VecDeque};

use crate::backend::{BackendError, DeviceFacts, Pages, Segments, StreamEvents, StreamId};
use crate::size::SMALL_BUFFER;

/// Where fresh simulated addresses start (a typical CUDA device address).
const FIRST_ADDRESS: u64 = 0x7f00_0000_0000;

/// An event of the simulator: a position in a stream's work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimEvent {
    stream: StreamId,
    sequence: u64,
}

#[derive(Clone, Debug, Default)]
struct StreamWork {
    /// Events recorded so far.
    recorded: u64,
    /// Events up to this sequence number are complete, while the stream is held busy.
    completed: u64,
    held: bool,
}

#[derive(Clone, Debug)]
struct Reservation {
    size: u64,
    page_size: u64,
    mapped: MappedRanges,
}

/// The mapped pages of a reservation, as maximal runs: a map or unmap of any number of pages
/// costs a few look-ups, where one set entry per page made the simulator's share of a replay
/// grow with the gigabytes mapped (half the instructions of trace-oom_probe_fraction under
/// `policy:cachalot`). On CUDA each page is a physical handle, so there the cost per page is
/// real; the device calls (`num_device_alloc` / `num_device_free`) count it.
#[derive(Clone, Debug, Default)]
struct MappedRanges {
    /// (start offset, end offset), sorted; disjoint, and never touching (adjacent runs are
    /// merged), so that a range of mapped pages lies within one run. A sorted vector, not a
    /// B-tree: a reservation holds a few dozen runs at most on the reference traces, where a
    /// binary search and a short shift cost less than the tree's look-ups.
    runs: Vec<(u64, u64)>,
}

impl MappedRanges {
    /// The number of runs starting before `offset`.
    fn starting_before(&self, offset: u64) -> usize {
        self.runs.partition_point(|&(start, _)| start < offset)
    }

    /// Whether any byte of the non-empty range `[start, end)` is mapped.
    fn overlaps(&self, start: u64, end: u64) -> bool {
        // The last run beginning before `end`; runs before it end before it begins.
        let i = self.starting_before(end);
        i > 0 && self.runs[i - 1].1 > start
    }

    /// Whether all of the non-empty range `[start, end)` is mapped.
    fn covers(&self, start: u64, end: u64) -> bool {
        let i = self.starting_before(start + 1);
        i > 0 && self.runs[i - 1].1 >= end
    }

    /// Marks the non-empty range `[start, end)`, which overlaps no run, mapped.
    fn insert(&mut self, start: u64, end: u64) {
        let i = self.starting_before(start);
        let joins_before = i > 0 && self.runs[i - 1].1 == start;
        let joins_after = i < self.runs.len() && self.runs[i].0 == end;
        match (joins_before, joins_after) {
            (true, true) => {
                self.runs[i - 1].1 = self.runs[i].1;
                self.runs.remove(i);
            }
            (true, false) => self.runs[i - 1].1 = end,
            (false, true) => self.runs[i].0 = start,
            (false, false) => self.runs.insert(i, (start, end)),
        }
    }

    /// Marks the non-empty range `[start, end)`, which must be covered, unmapped.
    fn remove(&mut self, start: u64, end: u64) {
        let i = self.starting_before(start + 1);
        if i == 0 {
            return;
        }
        let (run, run_end) = self.runs[i - 1];
        match (run < start, end < run_end) {
            (true, true) => {
                self.runs[i - 1].1 = start;
                self.runs.insert(i, (end, run_end));
            }
            (true, false) => self.runs[i - 1].1 = start,
            (false, true) => self.runs[i - 1].0 = end,
            (false, false) => {
                self.runs.remove(i - 1);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }
}

/// A simulated device.
///
/// ```
/// use cachalot_core::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
///
/// // A device of 1 GiB: the allocator behaves as on a GPU of that size, out-of-memory included.
/// let mut allocator = CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default())?;
/// let x = allocator.malloc(300 << 20, StreamId::DEFAULT)?;
/// assert_eq!(allocator.backend().used(), 300 << 20);
/// let error = allocator.malloc(800 << 20, StreamId::DEFAULT).unwrap_err();
/// assert!(error.to_string().starts_with("CUDA out of memory. Tried to allocate 800.00 MiB"), "{error}");
/// allocator.free(x)?;
/// # Ok::<(), cachalot_core::AllocatorError>(())
/// ```
#[derive(Clone, Debug)]
pub struct SimBackend {
    facts: DeviceFacts,
    used: u64,
    next_address: u64,
    planned_segments: VecDeque<u64>,
    planned_reservations: VecDeque<u64>,
    plan_misses: u64,
    unplanned_reservations: bool,
    next_reservations: VecDeque<u64>,
    reservations_made: u64,
    segments: BTreeMap<u64, u64>,
    reservations: BTreeMap<u64, Reservation>,
    streams: BTreeMap<StreamId, StreamWork>,
    free_override: Option<u64>,
    clock_us: i64,
    process_text: String,
}

impl SimBackend {
    /// A device of `capacity` bytes that also reports `capacity` as its total memory.
    pub fn new(capacity: u64) -> Self {
        SimBackend {
            facts: DeviceFacts {
                backend: "sim".into(),
                name: "cachalot simulator".into(),
                index: 0,
                total_memory: capacity,
                alignment: 512,
                max_segment_size: None,
                max_binding_size: None,
                supports_expandable_segments: true,
                details: Vec::new(),
            },
            used: 0,
            next_address: FIRST_ADDRESS,
            planned_segments: VecDeque::new(),
            planned_reservations: VecDeque::new(),
            plan_misses: 0,
            unplanned_reservations: false,
            next_reservations: VecDeque::new(),
            reservations_made: 0,
            segments: BTreeMap::new(),
            reservations: BTreeMap::new(),
            streams: BTreeMap::new(),
            free_override: None,
            clock_us: 0,
            process_text: String::new(),
        }
    }

    /// The simulated device as device `index` of its process (0 by default): the index its
    /// memory summary and out-of-memory messages name, as `GPU 1` in PyTorch's.
    pub fn with_index(mut self, index: u32) -> Self {
        self.facts.index = index;
        self
    }

    /// Renames the simulated device (e.g. after the GPU a trace was recorded on).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.facts.name = name.into();
        self
    }

    /// The simulated device without page mapping, as wgpu's devices are: the allocator then
    /// refuses `expandable_segments:True` and `policy:cachalot` takes ordinary segments.
    pub fn without_page_mapping(mut self) -> Self {
        self.facts.supports_expandable_segments = false;
        self
    }

    /// A copy of the device's state (segments, reservations, streams, clock) without the
    /// addresses planned for later allocations, for a trial run whose addresses do not matter:
    /// the plan of a long trace is as long as the trace.
    pub fn trial_copy(&self) -> SimBackend {
        SimBackend {
            facts: self.facts.clone(),
            used: self.used,
            next_address: self.next_address,
            planned_segments: VecDeque::new(),
            planned_reservations: VecDeque::new(),
            plan_misses: self.plan_misses,
            unplanned_reservations: self.unplanned_reservations,
            next_reservations: VecDeque::new(),
            reservations_made: self.reservations_made,
            segments: self.segments.clone(),
            reservations: self.reservations.clone(),
            streams: self.streams.clone(),
            free_override: self.free_override,
            clock_us: self.clock_us,
            process_text: String::new(),
        }
    }

    /// Bytes currently backed: live segments plus mapped pages.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Addresses to give the next segment allocations, in order (from a recorded trace).
    pub fn plan_segment_addresses(&mut self, addresses: impl IntoIterator<Item = u64>) {
        self.planned_segments.extend(addresses);
    }

    /// Base addresses to give the next VA reservations, in order.
    pub fn plan_reservation_addresses(&mut self, addresses: impl IntoIterator<Item = u64>) {
        self.planned_reservations.extend(addresses);
    }

    /// While `true`, new VA reservations take fresh addresses and leave the planned ones for
    /// later: a replay sets it around a request that ran out of memory, where the recorded
    /// device may have reserved VA that no `segment_map` of the trace ever shows.
    /// Setting it back to `false` forgets the addresses of [`Self::plan_reservation_next`]
    /// not given.
    pub fn set_reservations_unplanned(&mut self, unplanned: bool) {
        self.unplanned_reservations = unplanned;
        if !unplanned {
            self.next_reservations.clear();
        }
    }

    /// How many VA reservations were ever made (released ones included).
    pub fn reservations_made(&self) -> u64 {
        self.reservations_made
    }

    /// Whether `address` lies in a live VA reservation.
    pub fn is_reserved(&self, address: u64) -> bool {
        self.reservations.range(..=address).next_back().is_some_and(|(base, r)| address < base + r.size)
    }

    /// Gives the next VA reservation not yet given one this way the planned address `address`
    /// (which then leaves the plan), even while reservations are unplanned (see
    /// [`Self::set_reservations_unplanned`]); `false` if it is not planned.
    pub fn plan_reservation_next(&mut self, address: u64) -> bool {
        // It leaves the plan only when given: one not given stays planned for its own map.
        let planned = self.planned_reservations.contains(&address);
        if planned {
            self.next_reservations.push_back(address);
        }
        planned
    }

    /// How many planned addresses could not be used because they overlapped live memory.
    pub fn plan_misses(&self) -> u64 {
        self.plan_misses
    }

    /// Makes the device report `free` bytes and refuse any allocation or mapping larger than
    /// that, as the real device did at a recorded out-of-memory error. `None` restores the
    /// capacity model.
    pub fn set_free_memory_override(&mut self, free: Option<u64>) {
        self.free_override = free;
    }

    /// Sets the clock trace entries are stamped with.
    pub fn set_time_us(&mut self, time_us: i64) {
        self.clock_us = time_us;
    }

    /// Sets the per-process sentence of out-of-memory messages (empty by default).
    pub fn set_process_memory_text(&mut self, text: impl Into<String>) {
        self.process_text = text.into();
    }

    /// Keeps `stream` busy: events recorded on it from now on stay incomplete until
    /// [`SimBackend::finish_stream`] or a synchronization.
    pub fn hold_stream(&mut self, stream: StreamId) {
        let work = self.streams.entry(stream).or_default();
        if !work.held {
            work.held = true;
            work.completed = work.recorded;
        }
    }

    /// Whether `stream` is held busy (events recorded on it now stay incomplete). A stream stops
    /// being held by [`SimBackend::finish_stream`] and by anything that waits for it, such as
    /// unmapping pages it used.
    pub fn is_held(&self, stream: StreamId) -> bool {
        self.streams.get(&stream).is_some_and(|work| work.held)
    }

    /// Completes all work recorded on `stream` and lets it run freely again.
    pub fn finish_stream(&mut self, stream: StreamId) {
        if let Some(work) = self.streams.get_mut(&stream) {
            work.completed = work.recorded;
            work.held = false;
        }
    }

    fn fresh_address(&mut self, size: u64) -> u64 {
        let address = self.next_address;
        // Keep addresses 2 MiB aligned, like the driver's large allocations.
        self.next_address += size.div_ceil(SMALL_BUFFER).max(1) * SMALL_BUFFER;
        address
    }

    /// Whether `[address, address + size)` touches a live segment or reservation. Stored ranges
    /// never overlap, so only the last one starting before the end can reach the start.
    fn overlaps(&self, address: u64, size: u64) -> bool {
        let end = address.saturating_add(size);
        let segment = self.segments.range(..end).next_back().is_some_and(|(&b, &len)| b + len > address);
        let reservation = self.reservations.range(..end).next_back().is_some_and(|(&b, r)| b + r.size > address);
        segment || reservation
    }

    fn take_address(&mut self, planned_reservation: bool, size: u64) -> u64 {
        let planned = match (planned_reservation, self.unplanned_reservations) {
            // The first address given by plan_reservation_next that is free by now: one still
            // in use (its old reservation not yet released) waits for a later reservation.
            (true, _) if !self.next_reservations.is_empty() => {
                match self.next_reservations.iter().position(|&a| !self.overlaps(a, size)) {
                    Some(at) => {
                        let address = self.next_reservations.remove(at);
                        if let Some(p) = self.planned_reservations.iter().position(|&a| Some(a) == address) {
                            self.planned_reservations.remove(p);
                        }
                        address
                    }
                    None => return self.fresh_address(size),
                }
            }
            (true, true) => None,
            (true, false) => self.planned_reservations.pop_front(),
            (false, _) => self.planned_segments.pop_front(),
        };
        match planned {
            Some(address) if !self.overlaps(address, size) => {
                self.next_address = self.next_address.max(address.saturating_add(size).next_multiple_of(SMALL_BUFFER));
                address
            }
            Some(_) => {
                self.plan_misses += 1;
                self.fresh_address(size)
            }
            None => self.fresh_address(size),
        }
    }

    fn check_room(&self, size: u64) -> Result<(), BackendError> {
        let free = self.free_override.unwrap_or(self.facts.total_memory.saturating_sub(self.used));
        if size > free { Err(BackendError::out_of_memory()) } else { Ok(()) }
    }
}

impl Segments for SimBackend {
    fn device(&self) -> &DeviceFacts {
        &self.facts
    }

    fn allocate_segment(&mut self, size: u64, _stream: StreamId) -> Result<u64, BackendError> {
        self.check_room(size)?;
        let address = self.take_address(false, size);
        self.segments.insert(address, size);
        self.used += size;
        Ok(address)
    }

    fn free_segment(&mut self, address: u64, size: u64) -> Result<(), BackendError> {
        match self.segments.remove(&address) {
            Some(len) if len == size => {
                self.used -= size;
                Ok(())
            }
            Some(len) => {
                self.segments.insert(address, len);
                Err(BackendError::Device(format!("free of {size} bytes at {address:#x}, but the segment has {len}")))
            }
            None => Err(BackendError::Device(format!("free of unknown segment {address:#x}"))),
        }
    }

    fn memory_info(&mut self) -> Result<(u64, u64), BackendError> {
        let free = self.free_override.unwrap_or(self.facts.total_memory.saturating_sub(self.used));
        Ok((free, self.facts.total_memory))
    }

    fn now_us(&mut self) -> i64 {
        self.clock_us
    }

    fn process_memory_text(&mut self) -> String {
        self.process_text.clone()
    }
}

impl Pages for SimBackend {
    fn reserve_address_space(&mut self, size: u64, page_size: u64, _stream: StreamId) -> Result<u64, BackendError> {
        let base = self.take_address(true, size);
        self.reservations_made += 1;
        self.reservations.insert(base, Reservation { size, page_size, mapped: Default::default() });
        Ok(base)
    }

    fn map_pages(&mut self, base: u64, offset: u64, size: u64) -> Result<(), BackendError> {
        let reservation = self
            .reservations
            .get(&base)
            .ok_or_else(|| BackendError::Device(format!("map in unknown reservation {base:#x}")))?;
        let page = reservation.page_size;
        if !offset.is_multiple_of(page) || !size.is_multiple_of(page) || offset + size > reservation.size {
            return Err(BackendError::Device(format!(
                "map of [{offset:#x}, +{size:#x}) is not whole pages of {base:#x}"
            )));
        }
        if size > 0 && reservation.mapped.overlaps(offset, offset + size) {
            return Err(BackendError::Device(format!("map of an already mapped page in {base:#x}")));
        }
        self.check_room(size)?;
        if size > 0
            && let Some(reservation) = self.reservations.get_mut(&base)
        {
            reservation.mapped.insert(offset, offset + size);
        }
        self.used += size;
        Ok(())
    }

    fn unmap_pages(&mut self, base: u64, offset: u64, size: u64, stream: StreamId) -> Result<(), BackendError> {
        let reservation = self
            .reservations
            .get_mut(&base)
            .ok_or_else(|| BackendError::Device(format!("unmap in unknown reservation {base:#x}")))?;
        let page = reservation.page_size;
        if !offset.is_multiple_of(page)
            || !size.is_multiple_of(page)
            || (size > 0 && !reservation.mapped.covers(offset, offset + size))
        {
            return Err(BackendError::Device(format!("unmap of pages that are not mapped in {base:#x}")));
        }
        if size > 0 {
            reservation.mapped.remove(offset, offset + size);
        }
        self.used -= size;
        // Unmapping waits for the stream, like PyTorch's cudaStreamSynchronize.
        self.finish_stream(stream);
        Ok(())
    }

    fn release_address_space(&mut self, base: u64, size: u64) -> Result<(), BackendError> {
        match self.reservations.get(&base) {
            Some(r) if r.size == size && r.mapped.is_empty() => {
                self.reservations.remove(&base);
                Ok(())
            }
            Some(_) => Err(BackendError::Device(format!(
                "release of reservation {base:#x} that still has pages or another size"
            ))),
            None => Err(BackendError::Device(format!("release of unknown reservation {base:#x}"))),
        }
    }
}

impl StreamEvents for SimBackend {
    type Event = SimEvent;

    fn record_event(&mut self, stream: StreamId) -> Result<SimEvent, BackendError> {
        let work = self.streams.entry(stream).or_default();
        work.recorded += 1;
        Ok(SimEvent { stream, sequence: work.recorded })
    }

    fn query_event(&mut self, event: &SimEvent) -> Result<bool, BackendError> {
        Ok(match self.streams.get(&event.stream) {
            Some(work) if work.held => event.sequence <= work.completed,
            _ => true,
        })
    }

    fn synchronize_event(&mut self, event: &SimEvent) -> Result<(), BackendError> {
        if let Some(work) = self.streams.get_mut(&event.stream) {
            work.completed = work.completed.max(event.sequence);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_fresh_aligned_and_follow_a_plan() {
        let mut sim = SimBackend::new(1 << 30);
        let a = sim.allocate_segment(3 << 20, StreamId::DEFAULT).unwrap();
        let b = sim.allocate_segment(512, StreamId::DEFAULT).unwrap();
        assert_eq!(a % SMALL_BUFFER, 0);
        assert!(b >= a + (3 << 20));
        sim.free_segment(a, 3 << 20).unwrap();
        let c = sim.allocate_segment(3 << 20, StreamId::DEFAULT).unwrap();
        assert_ne!(c, a, "addresses are never reused");
        sim.plan_segment_addresses([0x1000_0000, b]);
        assert_eq!(sim.allocate_segment(1 << 20, StreamId::DEFAULT).unwrap(), 0x1000_0000);
        let d = sim.allocate_segment(1 << 20, StreamId::DEFAULT).unwrap();
        assert_ne!(d, b, "a planned address over live memory is not used");
        assert_eq!(sim.plan_misses(), 1);
    }

    #[test]
    fn capacity_and_free_override_refuse_allocations() {
        let mut sim = SimBackend::new(4 << 20);
        sim.allocate_segment(2 << 20, StreamId::DEFAULT).unwrap();
        assert!(sim.allocate_segment(4 << 20, StreamId::DEFAULT).is_err());
        assert_eq!(sim.memory_info().unwrap(), (2 << 20, 4 << 20));
        sim.set_free_memory_override(Some(1 << 20));
        assert!(sim.allocate_segment(2 << 20, StreamId::DEFAULT).is_err());
        assert_eq!(sim.memory_info().unwrap().0, 1 << 20);
    }

    #[test]
    fn held_streams_keep_events_pending() {
        let mut sim = SimBackend::new(1 << 30);
        let s = StreamId(7);
        let free_running = sim.record_event(s).unwrap();
        assert!(sim.query_event(&free_running).unwrap());
        sim.hold_stream(s);
        let e1 = sim.record_event(s).unwrap();
        let e2 = sim.record_event(s).unwrap();
        assert!(!sim.query_event(&e1).unwrap());
        sim.synchronize_event(&e1).unwrap();
        assert!(sim.query_event(&e1).unwrap());
        assert!(!sim.query_event(&e2).unwrap());
        sim.finish_stream(s);
        assert!(sim.query_event(&e2).unwrap());
    }

    /// The runs of mapped pages answer as a set of pages would: every map and unmap of a
    /// pseudo-random sequence succeeds or fails alike, and leaves the same pages mapped.
    #[test]
    fn mapped_runs_agree_with_a_set_of_pages() {
        let mut runs = MappedRanges::default();
        let mut pages = std::collections::BTreeSet::new();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let (first, count) = (state % 64, 1 + (state >> 8) % 6);
            let (start, end) = (first, first + count);
            let all = (start..end).all(|p| pages.contains(&p));
            let any = (start..end).any(|p| pages.contains(&p));
            assert_eq!(runs.covers(start, end), all);
            assert_eq!(runs.overlaps(start, end), any);
            if state >> 40 & 1 == 0 && !any {
                runs.insert(start, end);
                pages.extend(start..end);
            } else if all {
                runs.remove(start, end);
                (start..end).for_each(|p| {
                    pages.remove(&p);
                });
            }
            let mut previous_end = None;
            for &(run, run_end) in &runs.runs {
                assert!(run < run_end && previous_end.is_none_or(|e| e < run), "runs merged and apart");
                previous_end = Some(run_end);
            }
            let listed: Vec<u64> = runs.runs.iter().flat_map(|&(s, e)| s..e).collect();
            assert_eq!(listed, pages.iter().copied().collect::<Vec<_>>());
        }
        assert_eq!(runs.is_empty(), pages.is_empty());
    }

    #[test]
    fn pages_map_and_unmap_inside_reservations() {
        let mut sim = SimBackend::new(100 << 20);
        let base = sim.reserve_address_space(200 << 20, 20 << 20, StreamId::DEFAULT).unwrap();
        sim.map_pages(base, 0, 40 << 20).unwrap();
        assert_eq!(sim.used(), 40 << 20);
        assert!(sim.map_pages(base, 20 << 20, 20 << 20).is_err(), "double map");
        assert!(sim.map_pages(base, 40 << 20, 80 << 20).is_err(), "over capacity");
        assert!(sim.release_address_space(base, 200 << 20).is_err(), "pages still mapped");
        sim.unmap_pages(base, 0, 40 << 20, StreamId::DEFAULT).unwrap();
        sim.release_address_space(base, 200 << 20).unwrap();
    }
}

#[cfg(test)]
mod event_layer_tests {
    use crate::backend::*;
    use crate::sim::SimEvent;
    use crate::{AllocatorConfig, CachingAllocator, SimBackend};

    /// A layer that keeps the events of one stream pending until told, and counts the events it
    /// passes to the device.
    #[derive(Default)]
    struct HoldOne {
        held: Option<StreamId>,
        done: bool,
        passed: usize,
    }

    impl EventLayer<SimBackend> for HoldOne {
        type Event = Option<SimEvent>;

        fn record_event(&mut self, device: &mut SimBackend, stream: StreamId) -> Result<Self::Event, BackendError> {
            if self.held == Some(stream) {
                return Ok(None);
            }
            self.passed += 1;
            device.record_event(stream).map(Some)
        }
        fn query_event(&mut self, device: &mut SimBackend, event: &Self::Event) -> Result<bool, BackendError> {
            match event {
                Some(event) => device.query_event(event),
                None => Ok(self.done),
            }
        }
        fn synchronize_event(&mut self, device: &mut SimBackend, event: &Self::Event) -> Result<(), BackendError> {
            match event {
                Some(event) => device.synchronize_event(event),
                None => {
                    self.done = true;
                    Ok(())
                }
            }
        }
    }

    /// The layer decides the events; segments are the device's. A block used on the held
    /// stream stays out of the cache until the layer says its work is done.
    #[test]
    fn a_layer_swaps_the_events_and_keeps_the_segments() {
        let (held, other) = (StreamId(7), StreamId(8));
        let layer = HoldOne { held: Some(held), ..HoldOne::default() };
        let mut allocator =
            CachingAllocator::new(WithEvents::new(SimBackend::new(1 << 30), layer), AllocatorConfig::default())
                .unwrap();
        let a = allocator.malloc(1 << 20, StreamId::DEFAULT).unwrap();
        let b = allocator.malloc(1 << 20, StreamId::DEFAULT).unwrap();
        let address = a.address();
        allocator.record_stream(&a, held).unwrap();
        allocator.record_stream(&b, other).unwrap();
        allocator.free(a).unwrap();
        allocator.free(b).unwrap();
        assert_eq!(allocator.backend().layer().passed, 1, "only the other stream's event reached the device");
        assert_eq!(allocator.backend().inner().used(), allocator.memory_reserved());
        let c = allocator.malloc(1 << 20, StreamId::DEFAULT).unwrap();
        assert_ne!(c.address(), address, "reused while the held stream's work was pending");
        allocator.backend_mut().layer_mut().done = true;
        let d = allocator.malloc(1 << 20, StreamId::DEFAULT).unwrap();
        assert_eq!(d.address(), address);
        allocator.free(c).unwrap();
        allocator.free(d).unwrap();
        assert_eq!(allocator.backend().layer().passed, 1);
    }
}
