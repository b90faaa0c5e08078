//! `cachalot replay --all-devices` (every device trace of a snapshot at once, a line per device)
//! and `--device N`: on the programs recorded on two H200s (`testdata/conformance/devices`, an
//! expected.json per device), and on a snapshot made of two reference traces, `multistream` as
//! device 0 and `seeds` as device 1.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

mod common;

use std::path::PathBuf;

use cachalot_trace::snapshot::pickle::{read_snapshot, write_snapshot};
use common::{cachalot, text, traces};

/// Writes the two-device pickle, with `multistream`'s expected.json beside it (device 0's).
fn two_device_pickle() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cachalot-multi-device-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut snapshot = read_snapshot(&std::fs::read(traces().join("multistream.pickle")).unwrap()).unwrap();
    let second = read_snapshot(&std::fs::read(traces().join("seeds.pickle")).unwrap()).unwrap();
    let mut trace = second.device_traces[0].clone();
    for e in &mut trace {
        (e.context, e.annotation) = (None, None);
    }
    snapshot.device_traces.push(trace);
    for mut segment in second.segments {
        segment.device = 1;
        segment.frames = None;
        segment.blocks.iter_mut().for_each(|b| b.frames = None);
        snapshot.segments.push(segment);
    }
    let path = dir.join("two_devices.pickle");
    std::fs::write(&path, write_snapshot(&snapshot).unwrap()).unwrap();
    std::fs::copy(traces().join("multistream.expected.json"), dir.join("two_devices.expected.json")).unwrap();
    path
}

#[test]
fn every_device_is_replayed_and_checked() {
    let path = two_device_pickle();
    let out = cachalot(&["replay", "--check", "--all-devices", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(text(&out.stdout), "MATCH two_devices device 0\nMATCH two_devices device 1\n");

    let out = cachalot(&["replay", "--all-devices", path.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("two_devices: 2 devices, "), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[1].starts_with("two_devices device 0: ") && lines[2].starts_with("two_devices device 1: "));
    assert_ne!(lines[1]["two_devices device 0".len()..], lines[2]["two_devices device 1".len()..], "stats per device");

    // Device 1 alone: the expected.json is device 0's and is not applied to it.
    let out = cachalot(&["replay", "--check", "--device", "1", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(text(&out.stdout), "MATCH two_devices\n");
    let out = cachalot(&["replay", "--device", "2", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no trace for device 2 (it has 2)"), "{}", text(&out.stderr));
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

#[test]
fn every_device_of_the_two_gpu_captures_matches_its_own_recording() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/conformance/devices");
    let mut args = vec!["replay".to_owned(), "--check".to_owned(), "--all-devices".to_owned()];
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_suffix(".pickle").map(str::to_owned))
        .collect();
    names.sort();
    assert_eq!(names.len(), 4);
    args.extend(names.iter().map(|n| dir.join(format!("{n}.pickle")).to_string_lossy().into_owned()));
    let out = cachalot(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let expected: String = names.iter().flat_map(|n| [0, 1].map(|d| format!("MATCH {n} device {d}\n"))).collect();
    let stdout = text(&out.stdout);
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort();
    assert_eq!(lines.join("\n") + "\n", expected);

    // Device 1 alone is checked against its own expected.json (its summary names device 1).
    let path = dir.join("devices_fraction.pickle");
    let out = cachalot(&["replay", "--check", "--device", "1", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(text(&out.stdout), "MATCH devices_fraction\n");
}
