//! `cachalot tune`: its prediction is the exact replay, so the winner's peak is what `cachalot
//! stats` reports for the same setting, to the byte; with a small device it says where the job
//! stops.

#![allow(clippy::unwrap_used, reason = "test")]

mod common;

use cachalot_core::error::group_digits;
use common::{cachalot, text, trace};
use serde_json::Value;

/// `cachalot tune --json ARGS...`, which must succeed.
fn tune_json(args: &[&str]) -> Value {
    let out = cachalot(&[&["tune", "--json"], args].concat());
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `reserved_bytes.all.peak` and `num_ooms` of `cachalot stats TRACE --json ARGS...`.
fn stats_peak_and_ooms(trace: &str, args: &[&str]) -> (u64, u64) {
    let out = cachalot(&[&["stats", trace, "--json"], args].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stats: Value = serde_json::from_slice(&out.stdout).unwrap();
    (stats["reserved_bytes.all.peak"].as_u64().unwrap(), stats["num_ooms"].as_u64().unwrap())
}

#[test]
fn the_winner_is_what_stats_reports_for_its_setting() {
    let convnet = trace("convnet_train");
    let tuning = tune_json(&[&convnet]);
    let (winner, baseline) = (&tuning["winner"], &tuning["baseline"]);
    let settings = winner["settings"].as_str().unwrap();
    assert!(!settings.is_empty(), "the defaults are not the best for convnet_train: {tuning}");
    assert_eq!(tuning["winner_line"], format!("PYTORCH_CUDA_ALLOC_CONF={settings}"));

    let (peak, ooms) = stats_peak_and_ooms(&convnet, &["--config", settings]);
    assert_eq!(winner["peak_reserved"].as_u64(), Some(peak), "tune and stats disagree on {settings}");
    assert_eq!(winner["ooms"].as_u64(), Some(ooms));
    let (own_peak, _) = stats_peak_and_ooms(&convnet, &[]);
    assert_eq!(baseline["peak_reserved"].as_u64(), Some(own_peak));
    assert_eq!(baseline["settings"], "", "convnet_train ran with PyTorch's defaults");

    assert!(peak <= own_peak, "the winner ({peak}) is worse than the trace's own settings ({own_peak})");
    assert_eq!(winner["rank"], 1);
    assert!(tuning["candidates"].as_u64().unwrap() >= 100, "{}", tuning["candidates"]);
    assert_eq!(tuning["ranked"].as_array().unwrap().len(), 10, "--top defaults to 10");
}

#[test]
fn a_small_device_says_where_the_trace_s_own_settings_run_out() {
    let convnet = trace("convnet_train");
    // 190 MiB: PyTorch's defaults run out of memory there; other settings do not.
    let tuning = tune_json(&["--device-total", "190MiB", &convnet]);
    assert_eq!(tuning["device_total"], 190u64 << 20);
    let baseline = &tuning["baseline"];
    assert_eq!(baseline["fits"], false, "{baseline}");
    let first = &baseline["first_new_oom"];
    let message = first["message"].as_str().unwrap();
    assert!(message.starts_with("CUDA out of memory."), "{message}");
    let best = tuning["best_fitting"].as_str().unwrap();
    assert_eq!(tuning["winner"]["settings"], best);
    assert_eq!(tuning["winner"]["new_ooms"], 0);

    // The same replays as stats makes on that device.
    let device = (190u64 << 20).to_string();
    assert_eq!(stats_peak_and_ooms(&convnet, &["--device-total", &device]).1, baseline["ooms"].as_u64().unwrap());
    assert_eq!(stats_peak_and_ooms(&convnet, &["--device-total", &device, "--config", best]).1, 0);

    let out = cachalot(&["tune", "--device-total", "190MiB", "--top", "3", &convnet]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout
            .contains(&format!("fits on a device of 199,229,440 B (190.00 MiB): with PYTORCH_CUDA_ALLOC_CONF={best}"))
    );
    let entry = first["index"].as_u64().unwrap();
    assert!(
        stdout.contains(&format!("  the trace's own settings do not: first OOM at entry {entry}: {message}\n")),
        "{stdout}"
    );
}

#[test]
fn a_device_nothing_fits_on_names_both_first_ooms() {
    let out = cachalot(&["tune", "--device-total", "150MiB", "--top", "1", &trace("convnet_train")]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("does not fit on a device of 157,286,400 B (150.00 MiB): every candidate runs out of memory\n")
    );
    assert!(stdout.contains("  the trace's own settings: first OOM at entry "), "{stdout}");
    assert!(stdout.contains("  the best candidate ("), "{stdout}");
}

#[test]
fn bad_input_exits_2() {
    let not_a_pickle = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/small.ops");
    let out = cachalot(&["tune", not_a_pickle]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("small.ops: not a PyTorch snapshot pickle"), "{}", text(&out.stderr));
    for args in [
        ["tune", "--objective", "speed", "x.pickle"],
        ["tune", "--device-total", "lots", "x.pickle"],
        ["tune", "--top", "0", "x.pickle"],
        ["tune", "--device-total", "0", "x.pickle"],
    ] {
        let out = cachalot(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
    }
    let out = cachalot(&["tune", "no-such-trace.pickle"]);
    assert_eq!(out.status.code(), Some(2));
}

/// A device size no device has is an error naming the limit, not a panic in the replay.
#[test]
fn an_impossible_device_total_is_an_error() {
    for command in ["tune", "replay", "stats"] {
        let out = cachalot(&[command, &trace("seeds"), "--device-total", "18446744073709551615"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(stderr.contains("larger than any device (at most 1 EiB"), "{command}: {stderr}");
        assert!(!stderr.contains("panicked"), "{command}: {stderr}");
    }
}

#[test]
fn own_policy_is_set_beside_the_ranking_not_in_it() {
    let multistream = trace("multistream");
    let tuning = tune_json(&[&multistream]);
    let own = &tuning["own_policy"];
    assert_eq!(own["settings"], "policy:cachalot", "{own}");
    assert_eq!(own["pytorch_setting"], false);
    assert!(own["memory_allocated"].as_str().unwrap().starts_with("memory_allocated() differs"), "{own}");
    // What it saves, against the trace's own settings and against PyTorch's best.
    let peak = |c: &Value| c["peak_reserved"].as_i64().unwrap();
    for (field, against) in
        [("peak_reserved_saving", &tuning["baseline"]), ("peak_reserved_saving_against_winner", &tuning["winner"])]
    {
        let saving = &own[field];
        assert_eq!(saving["bytes"].as_i64(), Some(peak(against) - peak(own)), "{field}: {own}");
        let percent = (peak(against) - peak(own)) as f64 * 100.0 / peak(against) as f64;
        assert!((saving["percent"].as_f64().unwrap() - percent).abs() < 1e-9, "{field}: {own}");
    }
    let ranked = tuning["ranked"].as_array().unwrap();
    assert!(ranked.iter().all(|c| !c["settings"].as_str().unwrap().contains("policy")), "{tuning}");
    let (peak, ooms) = stats_peak_and_ooms(&multistream, &["--config", "policy:cachalot"]);
    assert_eq!(own["peak_reserved"].as_u64(), Some(peak));
    assert_eq!(own["ooms"].as_u64(), Some(ooms));
    assert!(peak < tuning["winner"]["peak_reserved"].as_u64().unwrap(), "{tuning}");

    let out = cachalot(&["tune", "--top", "1", &multistream]);
    let table = text(&out.stdout);
    assert!(table.contains("cachalot's own policy, policy:cachalot (not a PyTorch setting"), "{table}");
    let saved = |field: &str| {
        let (bytes, percent) = (own[field]["bytes"].as_u64().unwrap(), own[field]["percent"].as_f64().unwrap());
        format!("saves {} B ({percent:.1}%)", group_digits(bytes))
    };
    let expected = format!(
        "  peak reserved {} B ({:.2}x peak allocated): {} against the trace's own settings, {} against PyTorch's best\n",
        group_digits(peak),
        own["reserved_per_allocated"].as_f64().unwrap(),
        saved("peak_reserved_saving"),
        saved("peak_reserved_saving_against_winner"),
    );
    assert!(table.contains(&expected), "{expected}{table}");
    assert!(table.contains("  memory_allocated() differs from PyTorch's under it: remainders of 512 B"), "{table}");
    // It makes more device calls than the trace's own settings here (PyTorch's defaults give
    // nothing back; fewer than PyTorch's best, which gives back under its memory fraction), and
    // says what they cost on a GPU.
    let calls = |c: &Value| c["device_allocs"].as_u64().unwrap() + c["device_frees"].as_u64().unwrap();
    assert!(calls(own) > calls(&tuning["baseline"]), "{tuning}");
    assert!(table.contains("on a GPU each map or unmap costs driver calls per 2 MiB page"), "{table}");

    // The flag of before is the default; --no-own-policy ranks PyTorch's settings alone.
    assert_eq!(tune_json(&["--own-policy", &multistream])["own_policy"]["peak_reserved"], own["peak_reserved"]);
    let pytorch_only = tune_json(&["--no-own-policy", &multistream]);
    assert!(pytorch_only["own_policy"].is_null(), "{pytorch_only}");
    let settings =
        |t: &Value| t["ranked"].as_array().unwrap().iter().map(|c| c["settings"].clone()).collect::<Vec<_>>();
    assert_eq!(settings(&pytorch_only), settings(&tuning));
    assert!(tune_json(&["--no-own-policy", "--own-policy", &multistream])["own_policy"].is_object(), "the last wins");
    let out = cachalot(&["tune", "--no-own-policy", "--top", "1", &multistream]);
    assert!(!text(&out.stdout).contains("cachalot's own policy"), "{}", text(&out.stdout));
}

#[test]
fn a_policy_in_the_traces_settings_stays_out_of_the_pytorch_candidates() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("tune-policy-in-settings");
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("multistream.pickle");
    std::fs::copy(trace("multistream"), &copy).unwrap();
    let expected_path = std::path::PathBuf::from(trace("multistream").replace(".pickle", ".expected.json"));
    let mut expected: Value = serde_json::from_slice(&std::fs::read(expected_path).unwrap()).unwrap();
    expected["PYTORCH_CUDA_ALLOC_CONF"] = "policy:cachalot,max_split_size_mb:64".into();
    std::fs::write(dir.join("multistream.expected.json"), expected.to_string()).unwrap();
    let copy = copy.to_str().unwrap();

    let tuning = tune_json(&[copy]);
    assert_eq!(tuning["dropped"], serde_json::json!(["policy:cachalot"]), "{tuning}");
    assert_eq!(tuning["baseline"]["settings"], "max_split_size_mb:64", "{tuning}");
    let ranked = tuning["ranked"].as_array().unwrap();
    assert!(ranked.iter().all(|c| !c["settings"].as_str().unwrap().contains("policy")), "{tuning}");
    assert!(!tuning["winner_line"].as_str().unwrap().contains("policy"), "{tuning}");
    // The trace's own setting, policy included, is replayed beside the ranking without asking.
    let own = &tuning["own_policy"];
    assert_eq!(own["settings"], "max_split_size_mb:64,policy:cachalot", "{own}");
    let (peak, _) = stats_peak_and_ooms(&trace("multistream"), &["--config", "max_split_size_mb:64,policy:cachalot"]);
    assert_eq!(own["peak_reserved"].as_u64(), Some(peak));

    let out = cachalot(&["tune", "--top", "1", copy]);
    let table = text(&out.stdout);
    assert!(table.contains("note: policy:cachalot left out of the trace's settings and every candidate"), "{table}");
    assert!(
        table.contains("cachalot's own policy, max_split_size_mb:64,policy:cachalot (not a PyTorch setting"),
        "{table}"
    );
}
