//! # cachalot-shaders
//!
//! Kernel sources (WGSL and CUDA C) and CPU reference implementations for the experiments
//! (issue 5, not built yet). Today this crate holds nothing that runs.
