//! The runtime on CUDA: PyTorch 2.11's seeds marks and trace, and training that agrees with
//! the CPU reference. Skipped without a CUDA device (a failure with `CACHALOT_REQUIRE_CUDA=1`).

use cachalot_runtime::{Experiment, SimProfile};
use cachalot_trace::normalized::{EventDiff, first_difference};

use super::common;
use super::sim::small_mlps;

#[test]
fn seeds_on_cuda_gives_pytorchs_marks_and_trace() {
    let Some(device) = common::cuda_device("seeds_on_cuda_gives_pytorchs_marks_and_trace") else { return };
    let workspaces = device.workspaces();
    let cuda = common::run(&Experiment::Seeds, device);
    // The simulator with this GPU's workspaces gives the same events; on a Hopper (or
    // Blackwell) GPU that is PyTorch's H200 run.
    let profile = SimProfile { workspaces, ..SimProfile::cuda_sm90() };
    let sim = common::run(&Experiment::Seeds, common::sim(profile, false));
    assert_eq!(common::marks(&cuda), common::marks(&sim));
    assert_eq!(
        first_difference(&cuda.snapshot.trace, &sim.snapshot.trace),
        EventDiff::Identical { entries: sim.snapshot.trace.len() }
    );
    if workspaces == SimProfile::cuda_sm90().workspaces {
        assert_eq!(common::marks(&cuda), common::pytorch_seeds_marks(), "marks differ from PyTorch 2.11's");
        assert_eq!(
            first_difference(&common::pytorch_seeds_trace(), &cuda.snapshot.trace),
            EventDiff::Identical { entries: 60 }
        );
    } else {
        eprintln!("note: workspaces {workspaces:?} are not the H200's; compared with the simulator only");
    }
}

#[test]
fn mlp_train_on_cuda_matches_the_cpu_reference() {
    for params in small_mlps() {
        let Some(device) = common::cuda_device("mlp_train_on_cuda_matches_the_cpu_reference") else { return };
        let experiment = Experiment::MlpTrain(params);
        let workspaces = device.workspaces();
        let cuda = common::run(&experiment, device);
        let cpu = common::run(&experiment, common::sim(SimProfile { workspaces, ..SimProfile::cuda_sm90() }, true));
        for (step, (g, w)) in cuda.record.outcome.losses.iter().zip(&cpu.record.outcome.losses).enumerate() {
            let rel = ((g - w) / w).abs();
            assert!(rel <= 1e-3, "step {step}: CUDA {g} vs CPU {w} (relative {rel:.2e})");
        }
        assert_eq!(
            first_difference(&cuda.snapshot.trace, &cpu.snapshot.trace),
            EventDiff::Identical { entries: cpu.snapshot.trace.len() }
        );
    }
}
