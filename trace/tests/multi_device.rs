//! Several devices in one snapshot (PyTorch's `device_traces` has one trace per device): every
//! device is replayed at once, each on its own allocator, and each matches what PyTorch recorded
//! for it. No two-GPU machine recorded one here, so the snapshot is made of two reference traces
//! of the same settings and device (H200, PyTorch's defaults): `multistream` as device 0 and
//! `seeds` as device 1.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use cachalot_core::DeviceAllocators;
use cachalot_trace::replay::{ExpectedRun, ReplayOptions, replay, replay_devices, verify_against_recording};
use cachalot_trace::snapshot::torch::TorchSnapshot;

mod common;

/// `multistream` on device 0 and `seeds` on device 1, with each one's expected.json. Device 1's
/// stacks are left out (the two recordings' stack tables differ; the check does not read them).
fn two_devices() -> (TorchSnapshot, ExpectedRun, ExpectedRun) {
    let dir = common::vendored();
    let (mut snapshot, first) = common::load(&dir.join("multistream.pickle"));
    let (second, second_expected) = common::load(&dir.join("seeds.pickle"));
    let mut trace = second.device_traces[0].clone();
    for e in &mut trace {
        e.context = None;
        e.annotation = None;
    }
    snapshot.device_traces.push(trace);
    for mut segment in second.segments {
        segment.device = 1;
        segment.frames = None;
        for b in &mut segment.blocks {
            b.frames = None;
        }
        snapshot.segments.push(segment);
    }
    (snapshot, first, second_expected)
}

#[test]
fn every_device_of_a_two_device_snapshot_replays_at_once_and_matches() {
    let (snapshot, first, second) = two_devices();
    let options = ReplayOptions::for_snapshot(&snapshot, Some(&first)).unwrap();
    let outcomes = replay_devices(&snapshot, &options).unwrap();
    assert_eq!(outcomes.len(), 2);
    for (device, expected) in [(0, &first), (1, &second)] {
        assert_eq!(outcomes[device].device, device);
        if let Err(difference) = verify_against_recording(&snapshot, &outcomes[device], Some(expected)) {
            panic!("device {device}: {difference}");
        }
    }
    // Stats per device: each device's counters are its own recording's.
    let devices = DeviceAllocators::from_allocators(outcomes.into_iter().map(|o| o.allocator).collect());
    let stats = devices.stats();
    assert_eq!(stats[0].to_flat()["num_device_alloc"], first.memory_stats["num_device_alloc"]);
    assert_eq!(stats[1].to_flat()["num_device_alloc"], second.memory_stats["num_device_alloc"]);
    assert_ne!(stats[0].to_flat()["allocation.all.allocated"], stats[1].to_flat()["allocation.all.allocated"]);
}

/// `--device 1` alone replays what the all-device replay gives device 1.
#[test]
fn one_device_of_several_replays_alone_as_in_the_whole() {
    let (snapshot, first, second) = two_devices();
    let mut options = ReplayOptions::for_snapshot(&snapshot, Some(&first)).unwrap();
    options.device = 1;
    options.calls = None;
    let alone = replay(&snapshot, &options, |_, _| {}).unwrap();
    verify_against_recording(&snapshot, &alone, Some(&second)).unwrap();
    let all = replay_devices(&snapshot, &options).unwrap();
    assert_eq!(alone.allocator.snapshot(), all[1].allocator.snapshot());
    assert_eq!(alone.allocator.stats().to_flat(), all[1].allocator.stats().to_flat());
}
