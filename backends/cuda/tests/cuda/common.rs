//! What every GPU test shares: the skip rule, the device, and the paths of shared data.

#![allow(dead_code)] // each test module uses a part

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use cachalot_core::{AllocatorConfig, CachingAllocator};
use cachalot_cuda::{CudaBackend, CudaDevice, CudaKernels, cuda_required};

/// Device 0, or `None` after printing why the test is skipped. With `CACHALOT_REQUIRE_CUDA`
/// set, a missing device is a failure instead.
///
/// The reason goes straight to the process's standard error, not through `eprintln!`, which the
/// test harness captures and shows only for failures: a skip must be seen in a passing run.
pub fn device(test: &str) -> Option<Arc<CudaDevice>> {
    match CudaDevice::open(0) {
        Ok(device) => Some(device),
        Err(error) if !cuda_required() => {
            let _ = writeln!(
                std::io::stderr(),
                "skipped {test}: no usable CUDA device ({error}); set CACHALOT_REQUIRE_CUDA=1 to make this a failure"
            );
            None
        }
        Err(error) => panic!("{test}: CACHALOT_REQUIRE_CUDA is set, but no CUDA device is usable: {error}"),
    }
}

/// A fresh allocator and kernels on `device`.
pub fn allocator_and_kernels(
    device: &Arc<CudaDevice>,
    config: AllocatorConfig,
) -> (CachingAllocator<CudaBackend>, CudaKernels) {
    let backend = CudaBackend::with_device(Arc::clone(device)).expect("CUDA backend");
    let allocator = CachingAllocator::new(backend, config).expect("allocator");
    let kernels = CudaKernels::new(device).expect("NVRTC kernels");
    (allocator, kernels)
}

/// The project's shared data (`../shared` beside the checkout, or `CACHALOT_SHARED_DIR`, which
/// the device script points at the copy it carries).
pub fn shared_dir() -> PathBuf {
    match std::env::var_os("CACHALOT_SHARED_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata"),
    }
}

/// Reads the u32 error counter after all work on the device.
pub fn read_counter(device: &CudaDevice, kernels: &CudaKernels, counter: &cachalot_core::Allocation) -> u32 {
    device.synchronize().expect("synchronize");
    kernels.read::<u32>(cachalot_core::StreamId::DEFAULT, counter, 1).expect("read counter")[0]
}
