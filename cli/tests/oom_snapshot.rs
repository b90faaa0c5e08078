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
    std::fs::remove_dir_all(&dir).unwrap();

    let dir = empty_dir("seeds");
    let out = cachalot(&["replay", "--oom-snapshot", dir.to_str().unwrap(), &trace("seeds")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no OOM, no snapshot");
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
    std::fs::remove_dir_all(&dir).unwrap();
}
