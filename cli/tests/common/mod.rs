//! Helpers of the integration tests that run the `cachalot` binary.

#![allow(dead_code, reason = "each test crate uses its own part")]
#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs `cachalot ARGS...`.
pub fn cachalot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cachalot")).args(args).output().unwrap()
}

/// The folder of the reference PyTorch traces.
pub fn traces() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/traces/pytorch-2.11-h200")
}

/// The path of the reference trace `NAME.pickle`.
pub fn trace(name: &str) -> String {
    traces().join(format!("{name}.pickle")).display().to_string()
}

/// Output bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
