//! Behaviour without CUDA: construction is an error, never a panic, and
//! `CACHALOT_REQUIRE_CUDA=1` turns the GPU tests' skips into failures.

use std::panic::catch_unwind;
use std::process::Command;

use cachalot_core::AllocatorConfig;
use cachalot_cuda::{CudaBackend, CudaDevice, CudaError, caching_allocator, cuda_required, device_count, probe};

#[test]
fn construction_without_cuda_is_an_error_not_a_panic() {
    let outcome = catch_unwind(|| CudaBackend::new(0).map(drop)).expect("CudaBackend::new must never panic");
    let usable = outcome.is_ok();
    match outcome {
        Ok(()) => println!("a CUDA device is usable here: {}", probe(0).expect("probe")),
        Err(error) => {
            let text = error.to_string();
            assert!(
                matches!(
                    error,
                    CudaError::LibraryMissing { .. } | CudaError::NoDevice { .. } | CudaError::Driver { .. }
                ),
                "{text}"
            );
            assert!(text.contains("libcuda") || text.contains("no CUDA device") || text.contains("failed"), "{text}");
            println!("as expected without a GPU: {text}");
        }
    }
    // Every other entry point answers the same way, without panicking.
    let again = catch_unwind(|| {
        (
            probe(0).is_ok(),
            caching_allocator(0, AllocatorConfig::default()).is_ok(),
            CudaDevice::open(0).is_ok(),
            device_count().map_or(0, |n| n),
        )
    })
    .expect("no entry point may panic");
    assert_eq!((again.0, again.1, again.2), (usable, usable, usable));
    assert_eq!(again.3 > 0, usable);
    // A device that does not exist is an error on every machine.
    let missing = catch_unwind(|| CudaDevice::open(4096).map(drop)).expect("no panic");
    assert!(missing.is_err());
}

#[test]
fn require_cuda_turns_a_skip_into_a_failure() {
    if CudaDevice::open(0).is_ok() {
        println!("a CUDA device is usable here: the GPU tests run, nothing to skip");
        return;
    }
    if cuda_required() {
        panic!("CACHALOT_REQUIRE_CUDA is set, but no CUDA device is usable");
    }
    // Run one GPU test of this very binary twice: unset, it skips and passes; set, it fails.
    let exe = std::env::current_exe().expect("test binary");
    let run = |require: bool| {
        let mut command = Command::new(&exe);
        command.args(["--exact", "kernels::elementwise_kernels_match_the_cpu_references", "--nocapture"]);
        command.env_remove("CACHALOT_REQUIRE_CUDA").env_remove("CACHALOT_REQUIRE_GPU");
        if require {
            command.env("CACHALOT_REQUIRE_CUDA", "1");
        }
        let output = command.output().expect("run the test binary");
        let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
        (output.status.success(), text)
    };
    let (passed, text) = run(false);
    assert!(passed && text.contains("skipped") && text.contains("1 passed"), "without the variable: {text}");
    let (passed, text) = run(true);
    assert!(!passed && text.contains("CACHALOT_REQUIRE_CUDA is set") && text.contains("1 failed"), "with it: {text}");
}
