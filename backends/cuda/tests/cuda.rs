//! The CUDA backend's integration tests, in one binary so that the device machine gets one
//! small executable (`scripts/dev/device-cuda.sh` builds and carries it).
//!
//! Every GPU test skips (prints why and passes) only when no CUDA device is usable and
//! `CACHALOT_REQUIRE_CUDA` is unset; with it set, a missing GPU fails them. Run them one at a
//! time on the device (`--test-threads=1`): several fill large parts of the GPU.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

#[path = "cuda/common.rs"]
mod common;
#[path = "cuda/cross_stream.rs"]
mod cross_stream;
#[path = "cuda/expandable.rs"]
mod expandable;
#[path = "cuda/integrity.rs"]
mod integrity;
#[path = "cuda/kernels.rs"]
mod kernels;
#[path = "cuda/no_cuda.rs"]
mod no_cuda;
#[path = "cuda/seeds.rs"]
mod seeds;
