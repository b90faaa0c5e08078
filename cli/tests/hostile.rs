//! Hostile inputs, one class per test, each generated here and small enough for CI: outputs
//! that must survive a bad input or a failed write, costs that must stay linear in a
//! dimension of the input, limits every reader applies, and errors that name the flag, file
//! or line and quote a bad value short.
//!
//! The cost tests take sizes at which the quadratic versions took a minute or more (and the
//! linear ones well under a second): they fail by not finishing, not by a timed assertion.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::{cachalot, text, trace};

/// A scratch folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("cachalot-hostile-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn write(&self, name: &str, bytes: impl AsRef<[u8]>) -> String {
        let path = self.path(name);
        std::fs::write(&path, bytes).unwrap();
        path.display().to_string()
    }

    /// The names in the folder, sorted.
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `cachalot ARGS...` under a file-size limit of `blocks` 512-byte blocks, with SIGXFSZ ignored:
/// every write past the limit fails as on a full disk.
#[cfg(unix)]
fn cachalot_on_a_full_disk(blocks: u32, args: &[&str]) -> Output {
    let mut command = format!("trap '' XFSZ; ulimit -f {blocks}; exec \"$0\"");
    for n in 1..=args.len() {
        command.push_str(&format!(" \"${n}\""));
    }
    Command::new("sh").arg("-c").arg(command).arg(env!("CARGO_BIN_EXE_cachalot")).args(args).output().unwrap()
}

fn assert_no_panic(out: &Output) {
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked") && !stderr.contains("memory allocation of"), "{stderr}");
}

/// Data lost: a bad input refused before the output is opened leaves the previous snapshot
/// whole, and says nothing of a snapshot written.
#[test]
fn a_bad_input_to_run_leaves_the_previous_snapshot_untouched() {
    let dir = Scratch::new("run-input");
    let previous = b"{\"the\": \"previous snapshot\"}".repeat(1000);
    let out_path = dir.write("R.json", &previous);
    let bad_ops = dir.write("bad.ops", "a 0 512\nq 1\n");
    let missing = dir.path("missing.ops").display().to_string();
    let pickle = trace("seeds");
    let cases: [(&[&str], &str); 5] = [
        (&["ops", &missing], "missing.ops: cannot read"),
        (&["ops", &bad_ops], "bad.ops: line 2: unknown op 'q'"),
        (&["ops", &pickle], "seeds.pickle: not an op file"),
        (&["--capacity", "0", "seeds"], "--capacity 0"),
        (&["matmul-sweep", "--sizes", "4000000000"], "shape 4000000000x4000000000x4000000000"),
    ];
    for (args, fragment) in cases {
        let mut all = vec!["run", "--backend", "sim", "--out", &out_path];
        all.extend_from_slice(args);
        let out = cachalot(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(fragment), "{args:?}: {}", text(&out.stderr));
        assert!(!text(&out.stdout).contains("snapshot:"), "{args:?}: {}", text(&out.stdout));
        assert_no_panic(&out);
        assert_eq!(std::fs::read(&out_path).unwrap(), previous, "{args:?} touched R.json");
    }
    // --out in a folder that does not exist: refused before the run.
    let nowhere = dir.path("no/such/R.json").display().to_string();
    let out = cachalot(&["run", "--backend", "sim", "--no-compute", "--out", &nowhere, "seeds"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("does not exist"), "{}", text(&out.stderr));
    assert!(text(&out.stdout).is_empty(), "{}", text(&out.stdout));
    assert_eq!(dir.names(), ["R.json", "bad.ops"]);
}

/// Data lost: a write that fails part-way (the disk full) leaves the previous file whole and
/// no partial file behind; a series of out-of-memory snapshots stops at its first failed write
/// and says so.
#[cfg(unix)]
#[test]
fn a_failed_write_keeps_the_previous_file_and_stops_the_series() {
    let dir = Scratch::new("full-disk");
    let previous = b"previous".repeat(100);
    let out_path = dir.write("R.json", &previous);
    let out = cachalot_on_a_full_disk(4, &["run", "--backend", "sim", "--no-compute", "--out", &out_path, "seeds"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("R.json: cannot write"), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains("snapshot:"), "{}", text(&out.stdout));
    assert_eq!(std::fs::read(&out_path).unwrap(), previous);
    assert_eq!(dir.names(), ["R.json"]);

    // oom_probe_fraction's replay raises out-of-memory errors; the first snapshot cannot be
    // written, and no other is tried.
    let dumps = dir.path("dumps");
    std::fs::create_dir(&dumps).unwrap();
    let out = cachalot_on_a_full_disk(
        4,
        &["replay", "--oom-snapshot", dumps.to_str().unwrap(), &trace("oom_probe_fraction")],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("oom_probe_fraction.oom-1.json: cannot write"), "{stderr}");
    assert!(stderr.contains("stopped there, 0 written"), "{stderr}");
    assert_eq!(std::fs::read_dir(&dumps).unwrap().count(), 0, "partial snapshots were left");
}

/// Cost: an op file with a stream per allocation, in an order that inserts every new stream
/// among the others. 40,000 streams took 20 s when each stream's entry was found by a walk
/// and moved 648 bytes per entry after it; now a fraction of a second.
#[test]
fn thousands_of_streams_cost_linear_time() {
    let dir = Scratch::new("streams");
    let n = 40_000u64;
    // A fixed permutation of the streams: multiplying by an odd number modulo a power of two.
    let ops: String =
        (0..n).map(|i| format!("a {i} 512 {}\nf {i}\n", 0x1000 + (i * 0x9E37_79B1) % (1 << 20) * 16)).collect();
    let file = dir.write("streams.ops", ops);
    let out = cachalot(&["stats", &file]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("num_device_alloc")).unwrap();
    assert!(line.ends_with(&n.to_string()), "a small segment per stream: {line}");
}

/// Cost: `compare` of two expected.json files with 30,000 marks each (2k/4k/8k took
/// 0.15/0.34/1.6 s when every label was looked up by a walk over the others).
#[test]
fn many_marks_compare_in_linear_time() {
    let dir = Scratch::new("marks");
    let recorded = std::fs::read_to_string(common::traces().join("seeds.expected.json")).unwrap();
    let mut expected: serde_json::Value = serde_json::from_str(&recorded).unwrap();
    let marks: Vec<serde_json::Value> = (0..30_000)
        .map(|i| serde_json::json!({"label": format!("step {i}"), "allocated": 512 * i, "reserved": 2 << 20}))
        .collect();
    expected["marks"] = serde_json::Value::Array(marks);
    let a = dir.write("a.expected.json", expected.to_string());
    let b = dir.write("b.expected.json", expected.to_string());
    let out = cachalot(&["compare", &a, &b]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("step 29999"), "the last mark is a row");
}

/// Cost and threads: a pickle that names 3,000 (empty) device traces replays on as many
/// threads as the machine has, not one per device.
#[test]
fn thousands_of_devices_replay_on_bounded_threads() {
    let dir = Scratch::new("devices");
    let snapshot =
        cachalot_trace::snapshot::torch::TorchSnapshot { device_traces: vec![Vec::new(); 3000], ..Default::default() };
    let bytes = cachalot_trace::snapshot::pickle::write_snapshot(&snapshot).unwrap();
    let file = dir.write("devices.pickle", bytes);
    let out = cachalot(&["replay", "--all-devices", &file]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_no_panic(&out);
    assert!(text(&out.stdout).contains("devices: 3000 devices, 0 entries"), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("devices device 2999: 0 segments"));
}

/// Limits: `bench` and `run ops` read op files within the input limit, as every other reader.
#[test]
fn op_files_over_the_input_limit_are_refused() {
    let dir = Scratch::new("limit");
    let file = dir.write("big.ops", "a 0 512\nf 0\n".repeat(100));
    for args in [vec!["bench", "--backend", "sim", &file], vec!["run", "--backend", "sim", "ops", &file]] {
        let out = Command::new(env!("CARGO_BIN_EXE_cachalot"))
            .args(&args)
            .current_dir(&dir.0)
            .env("CACHALOT_MAX_INPUT_BYTES", "1000")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains("big.ops") && stderr.contains("input limit of 1000 bytes"), "{args:?}: {stderr}");
    }
    assert_eq!(dir.names(), ["big.ops"], "run wrote a snapshot for a refused input");
}

/// Limits: a matrix product's operands are checked against the device before any buffer is
/// made (one 100000² operand alone is 40 GB).
#[test]
fn matmul_sizes_over_the_device_are_refused_before_buffers() {
    let dir = Scratch::new("sweep");
    let out = Command::new(env!("CARGO_BIN_EXE_cachalot"))
        .args(["run", "--backend", "sim", "--capacity", "1GiB", "matmul-sweep", "--sizes", "100000"])
        .current_dir(&dir.0)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("shape 100000x100000x100000: its operands take 120000000000 bytes"), "{stderr}");
    assert!(stderr.contains("1073741824 bytes"), "{stderr}");
    assert_no_panic(&out);
    assert!(dir.names().is_empty());
}

/// Messages: errors name the flag, file and line, and quote a bad value by its first bytes.
#[test]
fn errors_name_the_place_and_quote_short() {
    let dir = Scratch::new("messages");
    let size = cachalot(&["view", "--size", "1400x900x3", "x.json"]);
    assert_eq!(size.status.code(), Some(2));
    assert!(text(&size.stderr).contains("--size 1400x900x3: expected WIDTHxHEIGHT"), "{}", text(&size.stderr));

    let fraction = cachalot(&["replay", "--memory-fraction", "-1", &trace("seeds")]);
    assert_eq!(fraction.status.code(), Some(2));
    assert!(
        text(&fraction.stderr).contains("--memory-fraction -1: must be within [0, 1]"),
        "{}",
        text(&fraction.stderr)
    );

    // A 10 MB number: a one-line error with the line, the column and the value's first bytes.
    let huge = dir.write("huge.ops", format!("a 0 512\na 1 {}x 0\n", "9".repeat(10_000_000)));
    let out = cachalot(&["stats", &huge]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.len() < 400, "{} bytes of error", stderr.len());
    assert!(
        stderr.contains("huge.ops: line 2: size '9999") && stderr.contains("(10,000,001 bytes)' at column 5"),
        "{stderr}"
    );

    // A 100 KB configuration string (about the most one argument may carry).
    let config = format!("max_split_size_mb:{}", "7".repeat(100_000));
    let small = dir.write("small.ops", "a 0 512\n");
    let out = cachalot(&["stats", "--config", &config, &small]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.len() < 400 && stderr.contains("(100,000 bytes)"),
        "{} bytes: {}",
        stderr.len(),
        &stderr[..200.min(stderr.len())]
    );

    // A value clap itself refuses (not a number) is quoted short too.
    let long = format!("0.{}x", "5".repeat(100_000));
    let out = cachalot(&["replay", "--memory-fraction", &long, &trace("seeds")]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.len() < 600 && stderr.contains("(100,003 bytes)") && stderr.contains("--memory-fraction"),
        "{} bytes: {}",
        stderr.len(),
        &stderr[..300.min(stderr.len())]
    );

    // An out-of-memory error of `run ops` names the op file and its line.
    let ops = dir.write("oom.ops", "# a comment\na 0 1048576\n\na 1 1099511627776\n");
    let out = Command::new(env!("CARGO_BIN_EXE_cachalot"))
        .args(["run", "--backend", "sim", "--capacity", "1GiB", "ops", &ops])
        .current_dir(&dir.0)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("oom.ops: line 4: ") && stderr.contains("out of memory"), "{stderr}");
}

/// Plain `replay` (no `--check`) says on stderr where the replay departed from the recording,
/// and keeps its exit status.
#[test]
fn plain_replay_reports_what_check_would_flag() {
    let out = cachalot(&["replay", "--config", "", &trace("random_stress_maxsplit")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("random_stress_maxsplit: the replay differs from the recording"), "{stderr}");
    let matching = cachalot(&["replay", &trace("seeds")]);
    assert!(matching.status.success());
    assert!(!text(&matching.stderr).contains("differs"), "{}", text(&matching.stderr));
}
