//! The `cachalot` command line as a user runs it: outputs, exit statuses (0 match, 1 mismatch,
//! 2 bad input) and errors that name the file and the place.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{cachalot, text, trace, traces};

#[test]
fn replay_check_matches_every_reference_trace() {
    let mut args = vec!["replay".to_owned(), "--check".to_owned()];
    let mut names = Vec::new();
    for entry in std::fs::read_dir(traces()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "pickle") {
            names.push(path.file_stem().unwrap().to_string_lossy().into_owned());
            args.push(path.display().to_string());
        }
    }
    assert_eq!(names.len(), 9);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = cachalot(&refs);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for name in names {
        assert!(stdout.contains(&format!("MATCH {name}\n")), "{name}: {stdout}");
    }
    // Not a terminal: no progress bar drawing.
    assert!(!text(&out.stderr).contains('\u{1b}'), "escape codes on a non-terminal");
}

#[test]
fn a_mismatch_exits_1_and_names_the_first_difference() {
    let out = cachalot(&["replay", "--check", "--config", "", &trace("random_stress_maxsplit")]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("MISMATCH random_stress_maxsplit: entry "), "{stdout}");
}

#[test]
fn bad_files_exit_2_with_the_file_and_place() {
    let dir = std::env::temp_dir().join(format!("cachalot-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.pickle");
    std::fs::write(&garbage, b"not a snapshot at all").unwrap();
    let truncated = dir.join("truncated.pickle");
    let bytes = std::fs::read(trace("gpt_train")).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    for (file, fragment) in [(&garbage, "not a cachalot snapshot"), (&truncated, "byte ")] {
        let out = cachalot(&["replay", file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{}", file.display());
        let stderr = text(&out.stderr);
        assert!(stderr.contains(&*file.display().to_string()) && stderr.contains(fragment), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let missing = cachalot(&["summary", dir.join("missing.pickle").to_str().unwrap()]);
    assert_eq!(missing.status.code(), Some(2));
    let bad_config = cachalot(&["replay", "--config", "bogus:1", &trace("seeds")]);
    assert_eq!(bad_config.status.code(), Some(2));
    assert!(text(&bad_config.stderr).contains("Unrecognized key 'bogus'"), "{}", text(&bad_config.stderr));
    std::fs::remove_dir_all(&dir).ok();
}

/// `compare` reads its files through the runtime's comparison columns, which apply the same
/// input limit as every other reader: a file over it, or a pickle beside an `expected.json`
/// over it, is refused before it is parsed.
#[test]
fn compare_refuses_files_over_the_input_limit() {
    let limited = |args: &[&str], limit: &str| {
        Command::new(env!("CARGO_BIN_EXE_cachalot")).args(args).env("CACHALOT_MAX_INPUT_BYTES", limit).output().unwrap()
    };
    // multistream.pickle is larger than its expected.json, which is read too.
    let pickle = trace("multistream");
    let size = std::fs::metadata(&pickle).unwrap().len();
    let out = limited(&["compare", &pickle, &pickle], &(size - 1).to_string());
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    let expected = format!("{size} bytes is more than the input limit of {} bytes", size - 1);
    assert!(stderr.contains(&pickle) && stderr.contains(&expected), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // At the file's size it is read.
    let out = limited(&["compare", &pickle, &pickle], &size.to_string());
    assert_ne!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn summary_and_stats_of_a_trace_end_state() {
    let out = cachalot(&["summary", &trace("seeds")]);
    assert!(out.status.success());
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(traces().join("seeds.expected.json")).unwrap()).unwrap();
    assert_eq!(text(&out.stdout), expected["memory_summary"].as_str().unwrap());

    let out = cachalot(&["stats", "--json", &trace("seeds")]);
    assert!(out.status.success());
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats, expected["memory_stats"]);
}

#[test]
fn replay_writes_snapshots_in_both_formats() {
    let dir = std::env::temp_dir().join(format!("cachalot-cli-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("seeds.json");
    let pickle = dir.join("seeds.pickle");
    for out_file in [&json, &pickle] {
        let out = cachalot(&["replay", &trace("seeds"), "--out", out_file.to_str().unwrap()]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    // Both describe the same end state: their summaries agree with PyTorch's.
    let summary = |f: &PathBuf| text(&cachalot(&["summary", f.to_str().unwrap()]).stdout);
    assert_eq!(summary(&json), summary(&pickle));
    std::fs::remove_dir_all(&dir).ok();
}

/// `cachalot bench` on the simulator: one line per file in torch_alloc_bench.py's shape, the
/// backend named on stderr; a bad op file exits 2 naming the file and line; an out-of-memory
/// replay exits 1 with PyTorch's message.
#[test]
fn bench_times_op_files_in_the_harness_shape() {
    let dir = std::env::temp_dir().join(format!("cachalot-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("pair.ops");
    std::fs::write(&good, "# two allocations\na 0 1048576\na 1 512\nf 0\nf 1\n").unwrap();
    let bad = dir.join("bad.ops");
    std::fs::write(&bad, "a 0 512\nf 7\n").unwrap();
    let (good, bad) = (good.display().to_string(), bad.display().to_string());

    let out = cachalot(&["bench", &good, &good, "--backend", "sim", "--reps", "3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for line in lines {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[..2], ["pair.ops", "cachalot-sim"], "{line}");
        assert!(fields[2].parse::<f64>().unwrap() > 0.0, "{line}");
        assert_eq!(fields[3], "ns/op");
    }
    assert!(text(&out.stderr).contains("# sim: taken: simulator"), "{}", text(&out.stderr));

    let out = cachalot(&["bench", &good, &bad, "--backend", "sim"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "nothing is timed before every file parses");
    assert!(text(&out.stderr).contains(&format!("{bad}: line 2: free of id 7")), "{}", text(&out.stderr));

    let out = cachalot(&["bench", &good, "--backend", "sim", "--capacity", "1MiB"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("CUDA out of memory. Tried to allocate 2.00 MiB"), "{}", text(&out.stderr));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `cachalot bench --each-replay`: after the median line, each timed replay's ns per op and its
/// device calls. Two oversize blocks that cannot serve each other on a device that holds only
/// one: every replay frees one segment and allocates the other, twice (PyTorch's retry chain);
/// on a roomy device only the warm-up allocates.
#[test]
fn bench_each_replay_counts_its_device_calls() {
    let dir = std::env::temp_dir().join(format!("cachalot-bench-each-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("alternate.ops");
    // 24 MiB and 46 MiB: with max_split_size_mb:20 both are oversize, and 46 MiB is past the
    // 20 MiB of rounding an oversize request may take beyond its size.
    std::fs::write(&file, "a 0 25165824\nf 0\na 1 48234496\nf 1\n").unwrap();
    let file = file.display().to_string();
    let replays = |extra: &[&str]| {
        let mut args = vec!["bench", &file, "--backend", "sim", "--reps", "3", "--each-replay"];
        args.extend_from_slice(extra);
        let out = cachalot(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
        assert_eq!(lines.len(), 4, "{stdout}");
        assert!(lines[0].starts_with("alternate.ops") && lines[0].ends_with("ns/op"), "{stdout}");
        lines[1..]
            .iter()
            .enumerate()
            .map(|(i, line)| {
                let prefix = format!("# alternate.ops replay {}: ", i + 2);
                let rest = line.strip_prefix(&prefix).unwrap_or_else(|| panic!("{line}"));
                let (ns, calls) = rest.split_once(" ns/op, ").unwrap();
                assert!(ns.parse::<f64>().unwrap() > 0.0, "{line}");
                calls.to_owned()
            })
            .collect::<Vec<_>>()
    };
    let tight = replays(&["--capacity", "64MiB", "--config", "max_split_size_mb:20"]);
    assert_eq!(tight, ["4 device calls"; 3]);
    let roomy = replays(&["--config", "max_split_size_mb:20"]);
    assert_eq!(roomy, ["0 device calls"; 3]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `cachalot stats --json | head -0`: the reader has closed the pipe, and the command ends as Unix
/// tools do, by SIGPIPE, without a panic message.
#[cfg(unix)]
#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;

    let mut child = Command::new(env!("CARGO_BIN_EXE_cachalot"))
        .args(["stats", "--json", &trace("gpt_train")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The read end closes before the replay behind the stats ends, so the first write finds no
    // reader.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{stderr}");
    assert!(out.status.success() || out.status.signal() == Some(libc_sigpipe()), "{:?}", out.status);
}

/// SIGPIPE's number on every Unix the tests run on.
#[cfg(unix)]
fn libc_sigpipe() -> i32 {
    13
}

/// Without XDG_RUNTIME_DIR (a container, CI, ssh without a login session), a wgpu command prints
/// no error line from Mesa's drivers.
#[test]
fn no_driver_noise_without_a_runtime_dir() {
    let out = Command::new(env!("CARGO_BIN_EXE_cachalot"))
        .args(["bench", "--backend", "wgpu", "--reps", "1"])
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/small.ops"))
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("XDG_RUNTIME_DIR"), "{stderr}");
}

/// Without files, `cachalot bench` times the standard workloads the repository ships.
#[test]
fn bench_without_files_times_the_standard_workloads() {
    let out = cachalot(&["bench", "--backend", "sim", "--reps", "1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let files: Vec<&str> = stdout.lines().filter_map(|line| line.split_whitespace().next()).collect();
    assert_eq!(files.len(), 12, "{stdout}");
    assert!(files.contains(&"steady-1MiB.ops") && files.contains(&"trace-gpt_train.ops"), "{stdout}");
}

/// `cachalot view FILE` where there is no display says so, and what to do instead.
#[cfg(all(unix, not(target_os = "macos")))]
#[test]
fn view_without_a_display_says_what_to_do() {
    let out = Command::new(env!("CARGO_BIN_EXE_cachalot"))
        .args(["view", &trace("seeds")])
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("WAYLAND_SOCKET")
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("no display") && stderr.contains("--screenshot") && stderr.contains("cachalot serve"),
        "{stderr}"
    );
    assert!(!stderr.contains("winit"), "{stderr}");
}

/// `cachalot view --run seeds --backend sim` headless, as `scripts/dev/live-cuda.sh` runs it on
/// CUDA: a picture mid-run (the experiment held) and at the end, the window's end state checked,
/// the run saved from the window, and that file's marks equal to PyTorch's.
#[test]
fn view_run_renders_a_live_run_mid_way_and_at_the_end_and_saves_pytorchs_marks() {
    let dir = std::env::temp_dir().join(format!("cachalot-view-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = |name: &str| dir.join(name).display().to_string();
    let out = cachalot(&[
        "view",
        "--run",
        "seeds",
        "--backend",
        "sim",
        "--no-compute",
        "--size",
        "700x450",
        "--screenshot",
        &path("end.png"),
        "--mid-screenshot",
        &path("mid.png"),
        "--mid-event",
        "30",
        "--out",
        &path("seeds.live.json"),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("live run: seeds on sim"), "{stdout}");
    assert!(stdout.contains("while the experiment was held there"), "{stdout}");
    assert!(stdout.contains("end state: the window's rebuilt state matches the run's"), "{stdout}");
    for png in ["mid.png", "end.png"] {
        assert!(std::fs::metadata(dir.join(png)).unwrap().len() > 1000, "{png}");
    }
    let expected = traces().join("seeds.expected.json").display().to_string();
    let compared = cachalot(&["compare", &expected, &path("seeds.live.json")]);
    let report = text(&compared.stdout);
    assert!(report.contains("linear_output") && !report.contains("marks differ"), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--run` and its experiment go together, and a device that cannot be used is an error.
#[test]
fn view_run_says_what_is_missing() {
    let out = cachalot(&["view", "seeds", "--backend", "sim"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("needs --run before it"), "{}", text(&out.stderr));
    let out = cachalot(&["view", "--run"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--run needs an experiment"), "{}", text(&out.stderr));
}

/// `compare` takes PyTorch snapshot pickles beside cachalot's snapshots (replayed, as `cachalot
/// replay --out` would), counts marks over those both runs have, and shows no total time for a
/// run that timed nothing.
#[test]
fn compare_takes_pickles_and_counts_marks_both_runs_have() {
    let dir = std::env::temp_dir().join(format!("cachalot-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let seeds = dir.join("seeds.json").display().to_string();
    let mlp = dir.join("mlp.json").display().to_string();
    for (args, out) in [(&["run", "seeds"][..], &seeds), (&["run", "mlp-train", "--steps", "2"][..], &mlp)] {
        let mut args = args.to_vec();
        args.extend(["--backend", "sim", "--no-compute", "--out", out]);
        let run = cachalot(&args);
        assert!(run.status.success(), "{}", text(&run.stderr));
    }

    let out = cachalot(&["compare", &seeds, &trace("seeds")]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("B vs A: identical (60 events)"), "{stdout}");

    let out = cachalot(&["compare", &seeds, &mlp]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("B vs A: no marks in common (12 only in A, 3 only in B)"), "{stdout}");
    let total = stdout.lines().find(|l| l.trim_start().starts_with("total")).unwrap_or_default();
    assert!(total.contains('—') && !total.contains("0.0000"), "{total}");

    let garbage = dir.join("notes.txt");
    std::fs::write(&garbage, "hello").unwrap();
    let out = cachalot(&["compare", &seeds, garbage.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("PyTorch snapshot pickle"), "{}", text(&out.stderr));
    std::fs::remove_dir_all(&dir).ok();
}

/// `run ops --ops-per-second N` paces the op file (1,000 ops at 1,000 per second: the run
/// sleeps after each 500 until its time, so it takes at least a second) and changes nothing
/// else: the same marks and allocator summary as the run at full speed.
#[test]
fn a_paced_ops_run_takes_its_time_and_does_the_same() {
    let dir = std::env::temp_dir().join(format!("cachalot-paced-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ops = dir.join("thousand.ops");
    let lines: String = (0..500).map(|i| format!("a {i} {}\nf {i}\n", 4096 << (i % 8))).collect();
    std::fs::write(&ops, lines).unwrap();
    let run = |extra: &[&str], out: &str| {
        let out = dir.join(out);
        let base = ["run", "ops", ops.to_str().unwrap(), "--backend", "sim", "--mark-every", "100"];
        let args = [&base[..], &["--out", out.to_str().unwrap()], extra].concat();
        let started = std::time::Instant::now();
        let result = cachalot(&args);
        assert!(result.status.success(), "{}", text(&result.stderr));
        let stdout = text(&result.stdout);
        // The lines that time the run differ; the marks and the summary do not.
        let kept: Vec<&str> = stdout.lines().filter(|l| !l.contains(" s") && !l.contains("snapshot:")).collect();
        (kept.join("\n"), started.elapsed())
    };
    let (fast, _) = run(&[], "fast.json");
    let (paced, took) = run(&["--ops-per-second", "1000"], "paced.json");
    assert_eq!(fast, paced);
    assert!(took >= std::time::Duration::from_secs(1), "{took:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
