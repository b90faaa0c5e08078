//! `cachalot replay --backend cuda|wgpu`: the trace's allocator calls made on a device (wgpu:
//! Mesa's lavapipe here and in CI) report what the simulator replay reports, and a device limit
//! that refuses a request is named with the request and its trace entry. wgpu tests skip without
//! an adapter unless `CACHALOT_REQUIRE_GPU` is set, CUDA tests without a CUDA device unless
//! `CACHALOT_REQUIRE_CUDA` is set.

#![allow(clippy::unwrap_used, reason = "test")]

mod common;

use common::{cachalot, text, trace};

fn required(variable: &str) -> bool {
    std::env::var(variable).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `cachalot replay --backend BACKEND ARGS...`'s stdout, or `None` (after saying so) when the
/// backend has no device and none is required.
fn replay_on(backend: &str, args: &[&str]) -> Option<String> {
    let out = cachalot(&[&["replay", "--backend", backend], args].concat());
    let stderr = text(&out.stderr);
    let variable = if backend == "cuda" { "CACHALOT_REQUIRE_CUDA" } else { "CACHALOT_REQUIRE_GPU" };
    if !out.status.success() && stderr.contains(&format!("backend {backend} is not usable")) && !required(variable) {
        skipped(backend, &stderr);
        return None;
    }
    assert!(out.status.success(), "{stderr}");
    Some(text(&out.stdout))
}

/// Says that the running test skips, straight to the process's standard error (the harness
/// would show an `eprintln!` of a passing test to nobody), in the words of the other GPU tests'
/// skips, which `scripts/test` counts: `skipped TEST: no usable CUDA device (...)`.
fn skipped(backend: &str, why: &str) {
    use std::io::Write as _;
    let (reason, variable) = match backend {
        "cuda" => ("no usable CUDA device", "CACHALOT_REQUIRE_CUDA"),
        _ => ("no wgpu adapter", "CACHALOT_REQUIRE_GPU"),
    };
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let _ = writeln!(std::io::stderr(), "skipped {test}: {reason} ({}); set {variable}=1 to fail instead", why.trim());
}

fn replay_on_wgpu(args: &[&str]) -> Option<String> {
    replay_on("wgpu", args)
}

/// The simulator's line without its time: `NAME: N entries, ...`.
fn without_time(line: &str) -> String {
    let (head, tail) = line.split_once(" in ").unwrap();
    format!("{head}{}", &tail[tail.find(" s,").unwrap() + 2..])
}

/// A device replay's lines against the simulator's: the same end state, OOMs, peaks and device
/// calls (the reference traces fit on any device these tests run on).
fn reports_the_simulators_stats(backend: &str) {
    for name in ["multistream", "convnet_train", "kvcache_infer"] {
        let path = trace(name);
        let Some(wgpu) = replay_on(backend, &[&path]) else { return };
        let sim = cachalot(&["replay", "--backend", "sim", &path]);
        assert!(sim.status.success());
        let sim_line = without_time(text(&sim.stdout).lines().next().unwrap());
        let lines: Vec<&str> = wgpu.lines().collect();
        assert!(lines[0].starts_with(&format!("{name}: on {backend}, ")), "{wgpu}");
        assert_eq!(without_time(lines[1]), sim_line, "{wgpu}");

        let stats = cachalot(&["stats", &path, "--json"]);
        let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
        let peaks = format!(
            "{name}: peak allocated {} B, peak reserved {} B, device allocations {}, device frees {}",
            stats["allocated_bytes.all.peak"],
            stats["reserved_bytes.all.peak"],
            stats["num_device_alloc"],
            stats["num_device_free"]
        );
        assert_eq!(lines[2], peaks, "{wgpu}");
    }
}

#[test]
fn wgpu_reports_the_simulators_stats() {
    reports_the_simulators_stats("wgpu");
}

#[test]
fn cuda_reports_the_simulators_stats() {
    reports_the_simulators_stats("cuda");
}

#[test]
fn a_device_limit_is_named_with_the_request_and_its_entry() {
    let path = trace("convnet_train");
    let Some(wgpu) = replay_on_wgpu(&["--device-total", "157286400", &path]) else { return };
    assert!(
        wgpu.contains(
            "convnet_train: first request refused by a device limit: device_traces[0][166], 12582912 B: \
             configured capacity: a segment of 12.00 MiB"
        ),
        "{wgpu}"
    );
    assert!(wgpu.contains("convnet_train: 24 more refused by device limits, the last at entry 999"), "{wgpu}");
    assert!(wgpu.contains("convnet_train: 25 frees skipped"), "{wgpu}");
    let sim = text(&cachalot(&["replay", "--device-total", "157286400", &path]).stdout);
    assert!(sim.ends_with("25 OOMs\n"), "{sim}");
    assert!(wgpu.lines().nth(1).unwrap().ends_with("25 OOMs"), "{wgpu}");
}

/// `--check` on a device compares its events with the recording's, addresses as segment +
/// offset: multistream's deferred frees complete where they did (the replay's stand-in
/// streams), and seeds is event for event the recording; convnet_train's first difference is a
/// best-fit tie that the device's segment order broke otherwise, and the output says so.
fn check_compares_events(backend: &str) {
    let variable = if backend == "cuda" { "CACHALOT_REQUIRE_CUDA" } else { "CACHALOT_REQUIRE_GPU" };
    for (name, matches) in [("multistream", true), ("seeds", true), ("convnet_train", false)] {
        let path = trace(name);
        let out = cachalot(&["replay", "--backend", backend, "--check", &path]);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        if stderr.contains(&format!("backend {backend} is not usable")) && !required(variable) {
            skipped(backend, &stderr);
            return;
        }
        if backend == "cuda" {
            // The driver's segment order decides the ties; print what this device did.
            eprintln!("{stdout}");
            assert!(stdout.contains(&format!("MATCH {name}")), "{stdout}{stderr}");
            continue;
        }
        if matches {
            assert!(out.status.success(), "{stdout}{stderr}");
            assert!(stdout.contains(&format!("MATCH {name}: the device's ")), "{stdout}");
        } else {
            assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
            assert!(
                stdout.contains(&format!("MISMATCH {name}: events as segment + offset differ from event ")),
                "{stdout}"
            );
            assert!(stdout.contains("PyTorch breaks best-fit ties by address"), "{stdout}");
        }
    }
}

#[test]
fn wgpu_check_compares_events_as_segment_and_offset() {
    check_compares_events("wgpu");
}

#[test]
fn cuda_check_compares_events_as_segment_and_offset() {
    check_compares_events("cuda");
}

#[test]
fn out_and_oom_snapshot_need_the_simulator() {
    let path = trace("multistream");
    for args in [vec!["--oom-snapshot", "."], vec!["--out", "x.json"]] {
        let out = cachalot(&[&["replay", "--backend", "wgpu", path.as_str()], args.as_slice()].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(text(&out.stderr).contains("need --backend sim"), "{}", text(&out.stderr));
    }
    let out = cachalot(&["replay", "--adapter", "0", &path]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--adapter applies to --backend cuda or wgpu only"));
}
