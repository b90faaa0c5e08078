//! `cachalot replay --oom-snapshot DIR` and `cachalot run --oom-snapshot DIR`: an out-of-memory
//! observer writes the allocator's snapshot at each OOM error of the replay or the run, as that
//! error left it.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

mod common;

use common::{cachalot, text, trace};

fn empty_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cachalot-oom-snapshot-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn one_snapshot_per_oom_error_and_none_without() {
    let dir = empty_dir("probe");
    let out = cachalot(&["replay", "--check", "--oom-snapshot", dir.to_str().unwrap(), &trace("oom_probe_fraction")]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let mut written: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    written.sort();
    assert_eq!(written, ["oom_probe_fraction.oom-1.json"]);
    let json = std::fs::read_to_string(dir.join(&written[0])).unwrap();
    assert!(json.starts_with(r#"{"format":"cachalot-snapshot""#), "{}", &json[..200]);
    assert!(json.contains("at out-of-memory error 1 (67108864 B requested"), "{}", &json[..300]);
    // The short answer after the replay's line, and the command that explains the snapshot in
    // full: it names the same cause, from the snapshot alone (its device and fraction).
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "MATCH oom_probe_fraction", "{stdout}");
    assert!(lines[1].starts_with("out of memory at entry 88: 64.00 MiB asked"), "{stdout}");
    assert!(lines[2].trim_start().starts_with("main cause: the memory fraction's allowance"), "{stdout}");
    let written = dir.join(&written[0]);
    let command = format!("the fix, proven by replay: cachalot explain {}", written.display());
    assert_eq!(lines[3].trim_start(), command, "{stdout}");
    let out = cachalot(&["explain", "--json", written.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let x: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((x["entry"].as_u64(), x["main_cause"].as_str()), (Some(88), Some("fraction_cap")), "{x:#}");
    assert_eq!(x["fix"]["fix"]["change"]["kind"], "memory_fraction", "{x:#}");
    std::fs::remove_dir_all(&dir).unwrap();

    let dir = empty_dir("seeds");
    let out = cachalot(&["replay", "--oom-snapshot", dir.to_str().unwrap(), &trace("seeds")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no OOM, no snapshot");
    assert!(!text(&out.stdout).contains("out of memory"), "{}", text(&out.stdout));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_directory_is_an_input_error() {
    let out = cachalot(&["replay", "--oom-snapshot", "/nonexistent/cachalot-oom", &trace("seeds")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--oom-snapshot must be an existing directory"), "{}", text(&out.stderr));
}

/// A run whose op file asks for more than the simulated device has: the run stops at PyTorch's
/// OOM, and the observer wrote the allocator as the error left it (the 1 MiB block still live).
#[test]
fn a_run_writes_a_snapshot_at_its_out_of_memory_error() {
    let dir = empty_dir("run");
    let ops = dir.join("too-big.ops");
    std::fs::write(&ops, "a 0 1048576\na 1 4294967296\nf 1\nf 0\n").unwrap();
    let out_json = dir.join("run.json");
    let out = cachalot(&[
        "run",
        "ops",
        ops.to_str().unwrap(),
        "--backend",
        "sim",
        "--capacity",
        "1073741824",
        "--oom-snapshot",
        dir.to_str().unwrap(),
        "--out",
        out_json.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!("out-of-memory snapshots: 1 in {}", dir.display())),
        "{stdout}{}",
        text(&out.stderr)
    );
    let json = std::fs::read_to_string(dir.join("ops.oom-1.json")).unwrap();
    assert!(json.starts_with(r#"{"format":"cachalot-snapshot""#), "{}", &json[..200]);
    assert!(json.contains("run of ops at out-of-memory error 1 (4294967296 B requested"), "{}", &json[..300]);
    // The short answer, read off the run's trace: live memory and the request exceed the device.
    let answer = stdout.split("\nout of memory at ").nth(1).unwrap_or_else(|| panic!("{stdout}"));
    assert!(answer.starts_with("entry 2: 4.00 GiB asked (large pool)"), "{stdout}");
    assert!(answer.contains("main cause: live memory alone leaves no room on the device"), "{stdout}");
    let command = format!(
        "no allocator setting helps; the stacks holding the live memory: cachalot explain {}",
        dir.join("ops.oom-1.json").display()
    );
    assert!(answer.contains(&command), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}
