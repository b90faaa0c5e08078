//! `cachalot explain`: at the recorded out-of-memory error of `oom_probe_fraction` it names the
//! memory fraction's cap, with numbers that are the replay's own (`cachalot stats` of the same
//! trace), and a larger fraction that lets the job through; `--at` picks other requests, and a
//! request that is not one is an input error.

#![allow(clippy::unwrap_used, reason = "test")]

mod common;

use common::{cachalot, text, trace};
use serde_json::Value;

fn explain_json(args: &[&str]) -> Value {
    let out = cachalot(&[&["explain", "--json"], args].concat());
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_probes_error_is_the_fractions_cap_and_a_larger_fraction_fixes_it() {
    let probe = trace("oom_probe_fraction");
    let x = explain_json(&[&probe]);
    assert_eq!(x["main_cause"], "fraction_cap", "{x:#}");
    assert_eq!(x["failed"], true);
    assert_eq!(x["matches_recording"], true);
    // The replay's stats at the end agree with the explanation: one error, at this request.
    let out = cachalot(&["stats", "--json", &probe]);
    let stats: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["num_ooms"], 1);
    let fix = &x["fix"]["fix"];
    assert_eq!(fix["change"]["kind"], "memory_fraction", "{x:#}");
    let fraction = fix["change"]["fraction"].as_f64().unwrap();
    let allowed = x["memory"]["allowed"].as_f64().unwrap();
    let total = x["memory"]["device_total"].as_f64().unwrap();
    assert!(fraction * total > allowed, "a larger fraction: {fraction}");
    // The text says the same in its first lines.
    let out = cachalot(&["explain", &probe]);
    let lines: Vec<String> = text(&out.stdout).lines().take(3).map(str::to_owned).collect();
    assert!(lines[0].contains(&format!("entry {} ran out of memory", x["entry"])), "{lines:?}");
    assert!(lines[1].starts_with("main cause: the memory fraction's allowance"), "{lines:?}");
    assert!(lines[2].contains(&format!("set_per_process_memory_fraction({fraction})")), "{lines:?}");
}

#[test]
fn other_requests_and_bad_ones() {
    let probe = trace("oom_probe_fraction");
    let peak = explain_json(&["--at", "peak", &probe]);
    assert_eq!((peak["at"].as_str(), peak["failed"].as_bool()), (Some("peak"), Some(false)));
    assert!(peak["fix"].is_null() && peak["main_cause"].is_null());
    let entry = peak["entry"].as_u64().unwrap().to_string();
    let same = explain_json(&["--at", &entry, &probe]);
    assert_eq!(same["request"], peak["request"]);
    for bad in [&["--at", "0"][..], &["--at", "99999999"], &["--at", "soon"]] {
        let out = cachalot(&[&["explain"], bad, &[probe.as_str()]].concat());
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
    }
    let out = cachalot(&["explain", &trace("seeds")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--at peak"), "{}", text(&out.stderr));
}
