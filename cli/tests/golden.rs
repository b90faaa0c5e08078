//! The command line's output, byte for byte, against outputs recorded before a change.
//!
//! Each case of `golden/cases.txt` runs `cachalot` from the workspace root and compares its exit
//! status, standard output and standard error with `golden/NAME.out`. Durations are the one
//! thing that changes from run to run, so every decimal number of seconds (`0.7920 s`) reads
//! `<t> s` on both sides, as do the figures of `compare`'s time section and of `ns per op`
//! (durations too). A restructuring of the code must leave every file unchanged; a change
//! of behaviour rewrites them with `CACHALOT_BLESS=1 cargo test --test golden` and shows in the
//! diff.
//!
//! Cases run on the simulator and on files of the repository only, so the outputs are the same on
//! every machine; cases that need a wgpu adapter start with `wgpu` and run only where wgpu takes
//! the adapter they were recorded on (Mesa's lavapipe, as on CI); elsewhere they say that they
//! skip.
//!
//! `CACHALOT_GOLDEN_BIN=PATH` runs another build of `cachalot` instead of this one: with
//! `CACHALOT_BLESS=1`, that records the outputs of a build from before a change.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test")]

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// `NAME ARGS...` per line; `#` starts a comment.
fn cases() -> Vec<(String, Vec<String>)> {
    let text = std::fs::read_to_string(golden_dir().join("cases.txt")).unwrap();
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let mut words = line.split_whitespace().map(str::to_owned);
            let name = words.next().unwrap();
            (name, words.collect())
        })
        .collect()
}

/// Masks what is measured, not computed: every decimal number of seconds (`12.5 s`,
/// `(0.7920 s)` reads `<t> s`), `N ns per op`, and every decimal number of `compare`'s section
/// of times (from its header to the next blank line).
fn without_durations(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_times = false;
    for line in text.split_inclusive('\n') {
        in_times = (in_times && !line.trim().is_empty()) || line.starts_with("time (seconds");
        let line = if in_times { every_decimal_masked(line) } else { seconds_masked(line) };
        match line.find(" ns per op") {
            Some(end) => {
                let start = line[..end].rfind(|c: char| !c.is_ascii_digit()).map_or(0, |i| i + 1);
                out.push_str(&line[..start]);
                out.push_str("<n>");
                out.push_str(&line[end..]);
            }
            None => out.push_str(&line),
        }
    }
    out
}

/// `line` with every decimal number (`0.3565`) as `<t>`.
fn every_decimal_masked(line: &str) -> String {
    masked(line, |_| true)
}

/// `line` with every decimal number followed by ` s` as `<t>`.
fn seconds_masked(line: &str) -> String {
    masked(line, |rest| rest.starts_with(" s") && !rest.as_bytes().get(2).is_some_and(u8::is_ascii_alphanumeric))
}

/// `text` with each decimal number for which `mask(text after it)` holds as `<t>`.
fn masked(text: &str, mask: impl Fn(&str) -> bool) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        let boundary = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'.');
        if boundary && bytes[i].is_ascii_digit() {
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            if i + 1 < bytes.len() && bytes[i] == b'.' && bytes[i + 1].is_ascii_digit() {
                i += 1;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                if mask(&text[i..]) {
                    out.push_str("<t>");
                    continue;
                }
            }
            out.push_str(&text[start..i]);
            continue;
        }
        let c = text[i..].chars().next().unwrap();
        out.push(c);
        i += c.len_utf8();
    }
    out
}

fn run_case(args: &[String]) -> String {
    let root = workspace_root();
    std::fs::create_dir_all(root.join("target/cli-golden")).unwrap();
    let binary = std::env::var_os("CACHALOT_GOLDEN_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_cachalot").into());
    let output = Command::new(binary)
        .args(args)
        .current_dir(&root)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .env_remove("RUST_LOG")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .output()
        .unwrap();
    without_durations(&format!(
        "$ cachalot {}\nexit: {}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        output.status.code().map_or("signal".to_owned(), |c| c.to_string()),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    ))
}

/// The line of a run's output that names the wgpu adapter it took, if any.
fn adapter_line(output: &str) -> Option<&str> {
    output.lines().find(|line| line.contains("wgpu: taken:"))
}

#[test]
fn durations_are_masked_and_nothing_else() {
    assert_eq!(without_durations("step 0  2.301420   (0.7920 s)"), "step 0  2.301420   (<t> s)");
    assert_eq!(without_durations("9629 entries in 0.01 s, 41 segments"), "9629 entries in <t> s, 41 segments");
    assert_eq!(without_durations("v1.2 s 3.5 sec 4 s 2.0 MiB"), "v1.2 s 3.5 sec 4 s 2.0 MiB");
    assert_eq!(without_durations("400 ops (3333 ns per op)"), "400 ops (<n> ns per op)");
    assert_eq!(
        without_durations("time (seconds; ratio)\n  step 0  —  0.3565 (1.00x)\n\nloss 2.30\n"),
        "time (seconds; ratio)\n  step 0  —  <t> (<t>x)\n\nloss 2.30\n"
    );
}

#[test]
fn every_case_prints_what_it_printed_when_recorded() {
    let bless = std::env::var_os("CACHALOT_BLESS").is_some();
    let mut differing = Vec::new();
    // The adapter the `wgpu` cases were recorded on, and whether wgpu takes it here.
    let mut recorded_adapter = None;
    let mut same_adapter = true;
    for (name, args) in cases() {
        let actual = run_case(&args);
        let path = golden_dir().join(format!("{name}.out"));
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        if name.starts_with("wgpu") && !bless {
            if let Some(recorded) = adapter_line(&expected) {
                same_adapter = adapter_line(&actual) == Some(recorded);
                recorded_adapter = Some(recorded.trim().to_owned());
            }
            if !same_adapter {
                println!(
                    "golden: skipped {name}: recorded on {}, and wgpu takes another adapter here",
                    recorded_adapter.as_deref().unwrap_or("another adapter")
                );
                continue;
            }
        }
        if bless {
            std::fs::write(&path, &actual).unwrap();
            continue;
        }
        if actual != expected {
            let line = actual.lines().zip(expected.lines()).position(|(a, b)| a != b);
            differing.push(format!(
                "{name}: differs from {} at line {}\n  now:      {:?}\n  recorded: {:?}",
                path.display(),
                line.map_or(actual.lines().count().min(expected.lines().count()) + 1, |l| l + 1),
                line.and_then(|l| actual.lines().nth(l)).unwrap_or("(end)"),
                line.and_then(|l| expected.lines().nth(l)).unwrap_or("(end)"),
            ));
        }
    }
    assert!(differing.is_empty(), "{}", differing.join("\n"));
}
