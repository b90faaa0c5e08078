//! The runtime's integration tests, one binary (one link of wgpu and cudarc):
//! `sim` runs everywhere; `wgpu` needs an adapter (lavapipe on CI: a missing adapter skips,
//! or fails with `CACHALOT_REQUIRE_GPU=1`); `cuda` needs a CUDA device (skips, or fails with
//! `CACHALOT_REQUIRE_CUDA=1`).

#![allow(clippy::unwrap_used, reason = "tests: a failed unwrap is a failed test")]

mod runtime {
    pub mod common;
    mod cuda;
    mod sim;
    mod wgpu;
}
