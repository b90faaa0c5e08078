//! The runtime on wgpu (lavapipe on CI): seeds and training compute what the CPU computes, and
//! the allocator's events equal the simulator's `wgpu` profile, event for event.

use cachalot_runtime::compare::{self, CompareOptions};
use cachalot_runtime::trace::{self, TraceComparison};
use cachalot_runtime::{Experiment, SimProfile, SweepParams};

use super::common;
use super::sim::small_mlps;

#[test]
fn seeds_on_wgpu_equals_the_simulator_and_differs_from_pytorch_by_the_workspaces() {
    let Some(device) = common::wgpu_device() else { return };
    let wgpu = common::run(&Experiment::Seeds, device);
    let sim = common::run(&Experiment::Seeds, common::sim(SimProfile::wgpu(), false));
    assert_eq!(common::marks(&wgpu), common::marks(&sim));
    assert_eq!(
        trace::compare(&wgpu.snapshot.trace, &sim.snapshot.trace),
        TraceComparison::Identical { entries: sim.snapshot.trace.len() },
        "wgpu's allocator events differ from the simulator's"
    );
    // Against PyTorch: every difference is the workspaces, verified on the simulator.
    let columns = [compare::load(&common::seeds_expected()).unwrap(), common::column(&wgpu, "wgpu")];
    let report = compare::compare(&columns, CompareOptions::default());
    assert!(report.ok(), "{}", report.text);
    assert!(report.text.contains("reason: cuBLAS/cuBLASLt workspaces"), "{}", report.text);
    assert!(report.text.contains("verified"), "{}", report.text);
}

#[test]
fn mlp_train_on_wgpu_matches_the_cpu_reference_and_the_simulators_events() {
    let Some(_) = common::wgpu_context() else { return };
    for params in small_mlps() {
        let experiment = Experiment::MlpTrain(params);
        let wgpu = common::run(&experiment, common::wgpu_device().unwrap());
        let cpu = common::run(&experiment, common::sim(SimProfile::wgpu(), true));
        let (got, want) = (&wgpu.record.outcome.losses, &cpu.record.outcome.losses);
        assert_eq!(got.len(), want.len());
        for (step, (g, w)) in got.iter().zip(want).enumerate() {
            let rel = ((g - w) / w).abs();
            assert!(rel <= 1e-3, "step {step}: wgpu {g} vs CPU {w} (relative {rel:.2e})");
        }
        assert_eq!(
            trace::compare(&wgpu.snapshot.trace, &cpu.snapshot.trace),
            TraceComparison::Identical { entries: cpu.snapshot.trace.len() },
            "{}: wgpu's allocator events differ from the simulator's",
            experiment.name()
        );
        let report =
            compare::compare(&[common::column(&cpu, "cpu"), common::column(&wgpu, "wgpu")], Default::default());
        assert!(report.ok(), "{}", report.text);
    }
}

#[test]
fn matmul_sweep_on_wgpu_is_checked_against_the_cpu() {
    let Some(device) = common::wgpu_device() else { return };
    let params =
        SweepParams { shapes: vec![(1, 1, 1), (33, 17, 65), (128, 96, 64), (5, 300, 200)], ..SweepParams::default() };
    let result = common::run(&Experiment::MatmulSweep(params), device);
    assert_eq!(result.record.outcome.checks.len(), 12);
    assert!(result.record.outcome.checks.iter().all(|c| c.detail.starts_with("relative error")));
}
