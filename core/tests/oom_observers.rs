//! Out-of-memory observers (`CachingAllocator::attach_oom_observer`): called once per OOM
//! error, in the order attached, with PyTorch's four numbers and the allocator as the error
//! left it, before the error returns; never on success.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::sync::{Arc, Mutex};

use cachalot_core::{AllocatorConfig, AllocatorError, CachingAllocator, OomEvent, SimBackend, StreamId, TraceAction};

type Seen = Arc<Mutex<Vec<(&'static str, OomEvent, u64, bool)>>>;

fn observe(allocator: &mut CachingAllocator<SimBackend>, name: &'static str, seen: &Seen) {
    let seen = Arc::clone(seen);
    allocator.attach_oom_observer(Arc::new(move |event, allocator| {
        let oom_recorded = allocator.trace().last().is_some_and(|e| e.action == TraceAction::Oom);
        seen.lock().unwrap().push((name, *event, allocator.stats().num_ooms, oom_recorded));
    }));
}

#[test]
fn observers_see_each_oom_in_order_with_the_allocator_as_the_error_left_it() {
    let mut allocator = CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default()).unwrap();
    allocator.record_history(true, usize::MAX, &[], false);
    let seen: Seen = Arc::default();
    observe(&mut allocator, "first", &seen);
    observe(&mut allocator, "second", &seen);

    let held = allocator.malloc(600 << 20, StreamId::DEFAULT).unwrap();
    assert!(seen.lock().unwrap().is_empty(), "no call on success");
    let AllocatorError::OutOfMemory(oom) = allocator.malloc(500 << 20, StreamId::DEFAULT).unwrap_err() else {
        panic!("expected an OOM");
    };
    let seen = seen.lock().unwrap().clone();
    let event = OomEvent {
        device: 0,
        requested: 500 << 20,
        device_free: (1 << 30) - (600 << 20),
        device_total: 1 << 30,
        allowed: None,
    };
    assert_eq!(seen, vec![("first", event, 1, true), ("second", event, 1, true)]);
    assert_eq!((oom.device_free, oom.device_total), (event.device_free, event.device_total));
    allocator.free(held).unwrap();
    allocator.check_consistency().unwrap();
}

#[test]
fn under_a_memory_fraction_the_allowance_is_passed_and_copies_keep_their_observers() {
    let mut allocator = CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default()).unwrap();
    allocator.set_memory_fraction(0.25).unwrap();
    let seen: Seen = Arc::default();
    observe(&mut allocator, "only", &seen);
    let mut copy = allocator.clone();
    assert!(allocator.malloc(300 << 20, StreamId::DEFAULT).is_err());
    assert!(copy.malloc(300 << 20, StreamId::DEFAULT).is_err());
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].1.allowed, Some(256 << 20));
    assert_eq!(seen[0].1.requested, 300 << 20);
}
