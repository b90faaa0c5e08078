//! `cachalot replay --oom-snapshot DIR`: an out-of-memory observer writes the allocator's
//! snapshot at each OOM error of the replay, as that error left it.

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
