//! Several devices in one snapshot (PyTorch's `device_traces` has one trace per device): every
//! device is replayed at once, each on its own allocator, and each matches what PyTorch recorded
//! for it. Two kinds of snapshot: four programs recorded on two H200s of one host by
//! `scripts/conformance/capture_devices.py` (`testdata/conformance/devices`, each device with its
//! own expected.json), and one made of two reference traces of the same settings and device
//! (H200, PyTorch's defaults): `multistream` as device 0 and `seeds` as device 1.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::path::{Path, PathBuf};

use cachalot_core::DeviceAllocators;
use cachalot_trace::replay::{ExpectedRun, ReplayOptions, replay, replay_devices, verify_against_recording};
use cachalot_trace::snapshot::torch::TorchSnapshot;

mod common;

/// The two-GPU captures, and what was recorded for each device of each.
fn captured() -> Vec<(PathBuf, TorchSnapshot, Vec<Option<ExpectedRun>>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/conformance/devices");
    common::pickles_in(&dir)
        .into_iter()
        .map(|path| {
            let (snapshot, _) = common::load(&path);
            let recorded =
                (0..snapshot.device_traces.len()).map(|d| ExpectedRun::beside_device(&path, d).unwrap()).collect();
            (path, snapshot, recorded)
        })
        .collect()
}

#[test]
fn every_device_of_every_two_gpu_capture_matches_pytorch() {
    let captured = captured();
    assert_eq!(captured.len(), 4, "testdata/conformance/devices holds the four two-GPU captures");
    for (path, snapshot, recorded) in captured {
        assert_eq!(snapshot.device_traces.len(), 2, "{}", path.display());
        assert!(recorded.iter().all(Option::is_some), "{}: an expected.json per device", path.display());
        let options = ReplayOptions::for_snapshot(&snapshot, recorded[0].as_ref()).unwrap();
        let outcomes = replay_devices(&snapshot, &options, &recorded).unwrap();
        for (device, outcome) in outcomes.iter().enumerate() {
            assert!(!snapshot.device_traces[device].is_empty(), "{}: device {device} did work", path.display());
            outcome.allocator.check_consistency().unwrap();
            if let Err(difference) = verify_against_recording(&snapshot, outcome, recorded[device].as_ref()) {
                panic!("{} device {device}: {difference}", path.display());
            }
        }
    }
}

/// Device 1 names itself as PyTorch does ("device ID 1" in its summary, "GPU 1" when out of
/// memory), and an `empty_cache` that released nothing there still counts, as listed in its
/// own recording: without its calls, device 1 of `devices_streams` does not match.
#[test]
fn device_one_keeps_its_index_and_its_own_program_calls() {
    let captured = captured();
    let (path, snapshot, recorded) = captured.iter().find(|(p, ..)| p.ends_with("devices_fraction.pickle")).unwrap();
    let options =
        ReplayOptions::for_snapshot(snapshot, recorded[0].as_ref()).unwrap().for_device(1, recorded[1].as_ref());
    let outcome = replay(snapshot, &options, |_, _| {}).unwrap();
    assert!(outcome.allocator.memory_summary(false).contains("device ID 1"), "{}", path.display());
    let expected = recorded[1].as_ref().unwrap();
    assert!(expected.marks.iter().any(|m| m.message.as_deref().is_some_and(|m| m.contains("GPU 1 has a total"))));
    verify_against_recording(snapshot, &outcome, Some(expected)).unwrap();

    let (_, snapshot, recorded) = captured.iter().find(|(p, ..)| p.ends_with("devices_streams.pickle")).unwrap();
    let options = ReplayOptions::for_snapshot(snapshot, recorded[0].as_ref()).unwrap();
    let with_calls = replay(snapshot, &options.for_device(1, recorded[1].as_ref()), |_, _| {}).unwrap();
    verify_against_recording(snapshot, &with_calls, recorded[1].as_ref()).unwrap();
    let without = replay(snapshot, &options.for_device(1, None), |_, _| {}).unwrap();
    let difference = verify_against_recording(snapshot, &without, recorded[1].as_ref()).unwrap_err();
    assert!(difference.to_string().contains("num_sync_all_streams"), "{difference}");
}

/// `multistream` on device 0 and `seeds` on device 1, with each one's expected.json. Device 1's
/// stacks are left out (the two recordings' stack tables differ; the check does not read them).
fn two_devices() -> (TorchSnapshot, ExpectedRun, ExpectedRun) {
    let dir = common::vendored();
    let (mut snapshot, first) = common::load(&dir.join("multistream.pickle"));
    let (second, mut second_expected) = common::load(&dir.join("seeds.pickle"));
    // `seeds` was recorded as device 0, and its summary says so; as device 1 here, it is not.
    second_expected.memory_summary = None;
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
    let outcomes = replay_devices(&snapshot, &options, &[]).unwrap();
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
    let all = replay_devices(&snapshot, &options, &[]).unwrap();
    assert_eq!(alone.allocator.snapshot(), all[1].allocator.snapshot());
    assert_eq!(alone.allocator.stats().to_flat(), all[1].allocator.stats().to_flat());
}
