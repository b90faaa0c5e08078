//! The runtime on wgpu (lavapipe on CI): seeds and training compute what the CPU computes, and
//! the allocator's events equal the simulator's `wgpu` profile, event for event.

use cachalot_runtime::comparison::{self, CompareOptions, Explanation, FactorKind, compare_runs};
use cachalot_runtime::{Experiment, SimProfile, SweepParams};
use cachalot_trace::normalized::{EventDiff, first_difference};

use super::common;
use super::sim::small_mlps;

#[test]
fn seeds_on_wgpu_equals_the_simulator_and_differs_from_pytorch_by_the_workspaces() {
    let Some(device) = common::wgpu_device() else { return };
    let wgpu = common::run(&Experiment::Seeds, device);
    let sim = common::run(&Experiment::Seeds, common::sim(SimProfile::wgpu(), false));
    assert_eq!(common::marks(&wgpu), common::marks(&sim));
    assert_eq!(
        first_difference(&wgpu.snapshot.trace, &sim.snapshot.trace),
        EventDiff::Identical { entries: sim.snapshot.trace.len() },
        "wgpu's allocator events differ from the simulator's"
    );
    // Against PyTorch: every difference is the workspaces, verified on the simulator.
    let columns = vec![comparison::load(&common::seeds_expected()).unwrap(), common::column(&wgpu, "wgpu")];
    let comparison = compare_runs(columns, CompareOptions::default());
    let why = common::describe(&comparison);
    assert!(comparison.verdict.ok(), "{why}");
    let Explanation::Tested(test) = &comparison.differences[0].explanation else { panic!("tested: {why}") };
    let reasons: Vec<FactorKind> = test.factors.iter().filter(|f| f.is_reason()).map(|f| f.factor.kind).collect();
    assert_eq!(reasons, [FactorKind::Workspaces], "{why}");
    assert!(test.unexplained.is_empty(), "verified: {why}");
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
            first_difference(&wgpu.snapshot.trace, &cpu.snapshot.trace),
            EventDiff::Identical { entries: cpu.snapshot.trace.len() },
            "{}: wgpu's allocator events differ from the simulator's",
            experiment.name()
        );
        let comparison =
            compare_runs(vec![common::column(&cpu, "cpu"), common::column(&wgpu, "wgpu")], Default::default());
        assert!(comparison.verdict.ok(), "{}", common::describe(&comparison));
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
