//! Shared by the GPU tests: getting a device (or skipping), allocators, uploads, readbacks.

#![allow(dead_code)] // each test binary uses its own subset

use std::io::Write;
use std::sync::{Arc, OnceLock};

use cachalot_core::{Allocation, AllocatorConfig, CachingAllocator, StreamId};
use cachalot_shaders::cpu::Rng;
use cachalot_wgpu::{Kernels, WgpuBackend, WgpuConfig, WgpuContext, WgpuError};

/// Whether `CACHALOT_REQUIRE_GPU` asks for a failure instead of a skip (set, and not "0").
fn gpu_required() -> bool {
    std::env::var("CACHALOT_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A context with `config`, or `None` (after saying so) when no adapter exists and
/// `CACHALOT_REQUIRE_GPU` is unset. With it set, a missing adapter fails the test.
pub fn context_with(config: WgpuConfig) -> Option<Arc<WgpuContext>> {
    match WgpuContext::request_blocking(config) {
        Ok(context) => Some(context),
        Err(WgpuError::NoAdapter(reason)) if !gpu_required() => {
            // Straight to stderr: the test harness captures print macros of passing tests.
            let _ = writeln!(
                std::io::stderr(),
                "skipped: no wgpu adapter ({reason}); install mesa-vulkan-drivers, or set CACHALOT_REQUIRE_GPU=1 to fail"
            );
            None
        }
        Err(error) => panic!("no usable wgpu device (CACHALOT_REQUIRE_GPU is set or the device failed): {error}"),
    }
}

/// One context per test binary with the default configuration (kernels compile once).
pub fn context() -> Option<Arc<WgpuContext>> {
    static SHARED: OnceLock<Option<Arc<WgpuContext>>> = OnceLock::new();
    SHARED.get_or_init(|| context_with(WgpuConfig::default())).clone()
}

/// A fresh allocator with the default (PyTorch) configuration over `context`.
pub fn allocator(context: &Arc<WgpuContext>) -> CachingAllocator<WgpuBackend> {
    cachalot_wgpu::caching_allocator(context, AllocatorConfig::default()).expect("allocator")
}

/// A generator seeded from the clock; the seed goes to the test's output.
pub fn rng() -> Rng {
    let (rng, seed) = Rng::from_time();
    println!("random seed {seed}");
    rng
}

/// A new allocation holding `data`.
pub fn upload(kernels: &Kernels, allocator: &mut CachingAllocator<WgpuBackend>, data: &[f32]) -> Allocation {
    let allocation = allocator.malloc((data.len() as u64 * 4).max(1), StreamId::DEFAULT).expect("malloc");
    kernels.upload_f32(allocator, &allocation, data).expect("upload");
    allocation
}

/// A new allocation of `n` f32 filled with NaN, so unwritten outputs show.
pub fn poisoned(kernels: &Kernels, allocator: &mut CachingAllocator<WgpuBackend>, n: usize) -> Allocation {
    upload(kernels, allocator, &vec![f32::NAN; n])
}

/// The first `n` f32 of `allocation`.
pub fn read(
    kernels: &Kernels,
    allocator: &mut CachingAllocator<WgpuBackend>,
    allocation: &Allocation,
    n: usize,
) -> Vec<f32> {
    kernels.read_f32(allocator, allocation, n).expect("readback").wait_f32().expect("wait")
}

/// Asserts a relative error below 1e-4 (f32 against the f64-accumulated reference).
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    let error = cachalot_shaders::cpu::relative_error(got, want);
    assert!(
        error < 1e-4,
        "{what}: relative error {error:e} (first values got {:?}, want {:?})",
        &got[..got.len().min(4)],
        &want[..want.len().min(4)]
    );
}
