//! What a recorded run's `expected.json` says beside its trace (the capture scripts of
//! `testdata/traces` and `scripts/conformance` write it): the settings, device and memory
//! fraction the replay is set up with, the program's calls that leave no trace entry, and the
//! end state `--check` compares against.

use std::collections::BTreeMap;

use cachalot_core::size::MAX_REQUEST;

use super::{CallKind, ProgramCall};
use crate::pool_calls::PoolCall;

/// What the recorded run's `expected.json` says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpectedRun {
    /// `PYTORCH_CUDA_ALLOC_CONF`.
    pub settings: String,
    /// The memory fraction, if one was set.
    pub memory_fraction: Option<f64>,
    /// `total_memory` of the device.
    pub device_total: Option<u64>,
    /// `memory_stats()` at the end.
    pub memory_stats: BTreeMap<String, i64>,
    /// `memory_summary()` at the end.
    pub memory_summary: Option<String>,
    /// Labelled marks, with OOM messages where one was raised.
    pub marks: Vec<ExpectedMark>,
    /// Every `empty_cache` and stats reset of the program, where the capture listed them.
    pub calls: Option<Vec<ProgramCall>>,
}

/// A mark of [`ExpectedRun`].
#[derive(Clone, Debug, PartialEq)]
pub struct ExpectedMark {
    /// Label.
    pub label: String,
    /// `memory_allocated()` there.
    pub allocated: Option<u64>,
    /// `memory_reserved()` there.
    pub reserved: Option<u64>,
    /// The OOM message caught there.
    pub message: Option<String>,
}

impl ExpectedRun {
    /// The `NAME.expected.json` beside a trace `NAME.pickle`, if there is one; an error names
    /// that file and what is wrong with it.
    pub fn beside(trace: &std::path::Path) -> Result<Option<Self>, String> {
        Self::beside_device(trace, 0)
    }

    /// What was recorded for device `device` of a trace `NAME.pickle`, if anything was: device
    /// 0's run is `NAME.expected.json`, device N's `NAME.deviceN.expected.json`, as
    /// `scripts/conformance/capture_devices.py` writes them for a process on two GPUs.
    pub fn beside_device(trace: &std::path::Path, device: usize) -> Result<Option<Self>, String> {
        let name = trace.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let stem = name.strip_suffix(".pickle").unwrap_or(&name);
        let path = match device {
            0 => trace.with_file_name(format!("{stem}.expected.json")),
            n => trace.with_file_name(format!("{stem}.device{n}.expected.json")),
        };
        if !path.exists() {
            return Ok(None);
        }
        let bytes = crate::input::read(&path).map_err(|e| format!("{}: {}", path.display(), e.reason()))?;
        Self::from_json(&bytes).map(Some).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses an `expected.json` written by `shared/traces/capture.py`; errors name the field.
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let object = value.as_object().ok_or("expected a JSON object at the top level")?;
        let number = |key: &str| -> Result<Option<f64>, String> {
            match object.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::Number(n)) => Ok(n.as_f64()),
                Some(serde_json::Value::String(s)) => {
                    s.parse().map(Some).map_err(|_| format!("{key}: '{s}' is not a number"))
                }
                Some(other) => Err(format!("{key}: expected a number, found {other}")),
            }
        };
        let mut run = ExpectedRun {
            settings: match object.get("PYTORCH_CUDA_ALLOC_CONF") {
                None | Some(serde_json::Value::Null) => String::new(),
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(other) => return Err(format!("PYTORCH_CUDA_ALLOC_CONF: expected a string, found {other}")),
            },
            memory_fraction: number("memory_fraction")?
                .map(|f| match (0.0..=1.0).contains(&f) {
                    true => Ok(f),
                    false => Err(format!("memory_fraction: {f} is not within [0, 1]")),
                })
                .transpose()?,
            device_total: number("device_total_bytes")?.map(device_total_bytes).transpose()?,
            ..ExpectedRun::default()
        };
        if let Some(stats) = object.get("memory_stats") {
            let stats = stats.as_object().ok_or("memory_stats: expected an object")?;
            for (key, value) in stats {
                let v = value.as_i64().ok_or_else(|| format!("memory_stats.{key}: expected an integer"))?;
                run.memory_stats.insert(key.clone(), v);
            }
        }
        run.memory_summary = object.get("memory_summary").and_then(|s| s.as_str()).map(str::to_owned);
        if let Some(marks) = object.get("marks") {
            let marks = marks.as_array().ok_or("marks: expected a list")?;
            for (i, mark) in marks.iter().enumerate() {
                let label = mark.get("label").and_then(|l| l.as_str()).ok_or(format!("marks[{i}].label: missing"))?;
                run.marks.push(ExpectedMark {
                    label: label.to_owned(),
                    allocated: mark.get("allocated").and_then(|v| v.as_u64()),
                    reserved: mark.get("reserved").and_then(|v| v.as_u64()),
                    message: mark.get("message").and_then(|v| v.as_str()).map(str::to_owned),
                });
            }
        }
        if let Some(calls) = object.get("calls") {
            let calls = calls.as_array().ok_or("calls: expected a list")?;
            let mut parsed = Vec::with_capacity(calls.len());
            for (i, c) in calls.iter().enumerate() {
                let name = c.get("call").and_then(|v| v.as_str()).ok_or(format!("calls[{i}].call: missing"))?;
                let call = match PoolCall::parse(name, c, i)? {
                    Some(pool_call) => CallKind::Pool(pool_call),
                    None => CallKind::parse(name).ok_or(format!(
                        "calls[{i}].call: '{name}' is not one of empty_cache, reset_peak_memory_stats, \
                         reset_accumulated_memory_stats, {}",
                        crate::pool_calls::POOL_CALL_NAMES.join(", ")
                    ))?,
                };
                let at = c
                    .get("trace_len")
                    .and_then(|v| v.as_u64())
                    .ok_or(format!("calls[{i}].trace_len: expected a non-negative integer"))?;
                parsed.push(ProgramCall { call, at: at as usize });
            }
            run.calls = Some(parsed);
        }
        Ok(run)
    }
}

/// `device_total_bytes` of an `expected.json`: a whole number of bytes from 1 to 1 EiB. A
/// negative, fractional, NaN or larger value is an error instead of a cast that would make it 0
/// or saturate.
fn device_total_bytes(total: f64) -> Result<u64, String> {
    // MAX_REQUEST is a power of two, exactly representable as f64.
    if total.is_finite() && total >= 1.0 && total <= MAX_REQUEST as f64 && total.fract() == 0.0 {
        Ok(total as u64)
    } else {
        Err(format!("device_total_bytes: {total} is not a whole number of bytes from 1 to 1 EiB ({MAX_REQUEST})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `device_total_bytes` and `memory_fraction` out of range are errors naming the field,
    /// where a cast once made -1 and NaN a device of 0 bytes.
    #[test]
    fn expected_values_out_of_range_are_named() {
        for (json, field) in [
            (r#"{"device_total_bytes": -1}"#, "device_total_bytes"),
            (r#"{"device_total_bytes": "NaN"}"#, "device_total_bytes"),
            (r#"{"device_total_bytes": 1.5}"#, "device_total_bytes"),
            (r#"{"device_total_bytes": 1e30}"#, "device_total_bytes"),
            (r#"{"memory_fraction": 7}"#, "memory_fraction"),
            (r#"{"memory_fraction": "NaN"}"#, "memory_fraction"),
        ] {
            let err = ExpectedRun::from_json(json.as_bytes()).unwrap_err();
            assert!(err.starts_with(field), "{json}: {err}");
        }
        let run = ExpectedRun::from_json(br#"{"device_total_bytes": 150754820096, "memory_fraction": 0.5}"#).unwrap();
        assert_eq!((run.device_total, run.memory_fraction), (Some(150_754_820_096), Some(0.5)));
    }
}
