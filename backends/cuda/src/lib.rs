//! # cachalot-cuda
//!
//! The CUDA backend of cachalot (issue 4, not built yet): it will implement
//! [`cachalot_core::Backend`] with the CUDA driver through `cudarc` — segments with
//! `cuMemAlloc`/`cuMemFree`, expandable segments with the VMM API, real streams and events —
//! and run matmul/linear kernels through cuBLAS and NVRTC. Today this crate holds nothing that
//! runs.
