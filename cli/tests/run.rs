//! `cachalot run` as a user meets it: the allocator settings from `PYTORCH_CUDA_ALLOC_CONF` (and
//! `--config` over them), nothing written without `--out`, and Ctrl-C, which stops the run and
//! keeps the snapshot of what it did.

#![allow(clippy::unwrap_used, reason = "test")]

mod common;

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::text;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cachalot-run-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(dir: &PathBuf, variable: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cachalot"));
    command.arg("run").args(args).current_dir(dir);
    match variable {
        Some(value) => command.env("PYTORCH_CUDA_ALLOC_CONF", value),
        None => command.env_remove("PYTORCH_CUDA_ALLOC_CONF"),
    };
    command.output().unwrap()
}

/// The variable applies as in PyTorch, a bad value is refused as `--config` refuses it (naming
/// the variable), `--config` wins over it, and the run says which it used. Without `--out`
/// nothing is written. Viewing a file is not stopped by a bad variable.
#[test]
fn the_variable_applies_and_config_wins_over_it() {
    let dir = scratch("conf");
    let seeds = ["seeds", "--backend", "sim", "--no-compute"];

    let out = run(&dir, Some("expandable_segments:True"), &seeds);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("allocator config: expandable_segments:True (the PYTORCH_CUDA_ALLOC_CONF variable)"),
        "{stdout}"
    );
    assert!(stdout.contains("no snapshot written: add --out FILE.json"), "{stdout}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing written into the current folder");

    let bad = run(&dir, Some("expandable_segments:maybe"), &seeds);
    let flag = run(&dir, None, &[&seeds[..], &["--config", "expandable_segments:maybe"]].concat());
    assert_eq!((bad.status.code(), flag.status.code()), (Some(2), Some(2)));
    let (bad, flag) = (text(&bad.stderr), text(&flag.stderr));
    assert!(bad.starts_with(flag.trim_end()), "the same error:\n{bad}\n{flag}");
    assert!(bad.contains("from the PYTORCH_CUDA_ALLOC_CONF variable"), "{bad}");

    let out = run(&dir, Some("expandable_segments:maybe"), &[&seeds[..], &["--config", ""]].concat());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "--config wins: {}", text(&out.stderr));
    assert!(stdout.contains("allocator config: PyTorch's defaults (--config; PYTORCH_CUDA_ALLOC_CONF="), "{stdout}");

    // Viewing a file runs nothing: a bad variable does not stop it.
    let picture = dir.join("seeds.png");
    let view = Command::new(env!("CARGO_BIN_EXE_cachalot"))
        .args(["view", &common::trace("seeds"), "--screenshot", picture.to_str().unwrap()])
        .env("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:maybe")
        .output()
        .unwrap();
    assert!(view.status.success(), "{}", text(&view.stderr));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Marks arrive as the run reaches them; Ctrl-C then stops it at its next operation: exit
/// status 130, a line of what was done, and the snapshot of the run so far, whole, at `--out`.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_the_run_and_keeps_its_snapshot() {
    let dir = scratch("ctrl-c");
    let snapshot = dir.join("partial.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachalot"))
        .args(["run", "mlp-train", "--steps", "1000000", "--backend", "sim", "--no-compute", "--out"])
        .arg(&snapshot)
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    // A mark of a step is printed while the run goes on (a million steps take hours).
    while !seen.contains("  step1 ") {
        let mut line = String::new();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "the output ended before a mark: {seen}");
        seen.push_str(&line);
    }
    let killed = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{seen}{rest}{stderr}");
    assert!(rest.contains("interrupted: mlp-train stopped after "), "{rest}");
    assert!(rest.contains(&format!("snapshot of the run so far: {}", snapshot.display())), "{rest}");
    assert!(stderr.contains("Ctrl-C again quits at once"), "{stderr}");
    let summary = common::cachalot(&["summary", snapshot.to_str().unwrap()]);
    assert!(summary.status.success(), "the snapshot reads: {}", text(&summary.stderr));
    let names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["partial.json"], "no partial file is left beside it");
    std::fs::remove_dir_all(&dir).unwrap();
}
