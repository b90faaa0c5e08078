//! The runtime on the simulator: PyTorch's seeds marks and trace with the `cuda-sm90`
//! profile, the CPU kernels, the experiments, selection and compare.

use cachalot_core::AllocatorConfig;
use cachalot_runtime::comparison::{
    self, CompareOptions, Explanation, FactorKind, LossCell, LossVerdict, MarkShift, compare_runs,
};
use cachalot_runtime::experiments::{Loss, Optimizer, ops::OpsParams};
use cachalot_runtime::{
    Activation, BackendKind, BackendRequest, DeviceOptions, Experiment, MlpParams, Runtime, SimDevice, SimProfile,
    SweepParams,
};
use cachalot_shaders::MatmulShape;
use cachalot_shaders::cpu::{self, Rng};
use cachalot_trace::normalized::{EventDiff, first_difference};

use super::common;

#[test]
fn seeds_on_the_cuda_profile_gives_pytorchs_marks_and_trace() {
    // Allocations only: the marks and the trace do not depend on the numbers.
    let result = common::run(&Experiment::Seeds, common::sim(SimProfile::cuda_sm90(), false));
    assert_eq!(common::marks(&result), common::pytorch_seeds_marks(), "marks differ from PyTorch 2.11's");
    let pytorch = common::pytorch_seeds_trace();
    assert_eq!(
        first_difference(&pytorch, &result.snapshot.trace),
        EventDiff::Identical { entries: 60 },
        "the trace differs from PyTorch 2.11's (addresses as segment + offset)"
    );
}

#[test]
fn the_cuda_sm80_profile_shows_the_spec_linear_observation() {
    // `docs/allocator-rules.md` §20: with the 8.125 MiB workspace, lin(x) adds 9.515625 MiB allocated (output,
    // cuBLAS workspace in a new 20 MiB segment, 1 MiB cuBLASLt workspace in the small
    // segment) and reserved is 62 MiB.
    let result = common::run(&Experiment::Seeds, common::sim(SimProfile::cuda_sm80(), false));
    let mark = |label: &str| result.marks.iter().find(|m| m.label == label).unwrap().clone();
    let (input, output) = (mark("linear_input"), mark("linear_output"));
    assert_eq!(output.allocated - input.allocated, 9_977_856);
    assert_eq!(output.reserved, 62 << 20);
}

#[test]
fn seeds_computes_on_the_simulator() {
    // The checks (Linear of zeros = bias, x.grad = 5/n) run inside `run`.
    let result = common::run(&Experiment::Seeds, common::sim(SimProfile::wgpu(), true));
    assert_eq!(result.record.outcome.checks.len(), 2);
}

#[test]
fn tensors_free_their_blocks_when_dropped() {
    let rt = Runtime::new(common::sim(SimProfile::wgpu(), true));
    let x = rt.from_f32(&[2, 3], &[1.0, -2.0, 3.0, -4.0, 5.0, -6.0]).unwrap();
    let y = rt.activation(Activation::Relu, &x).unwrap();
    assert_eq!(rt.to_vec(&y).unwrap(), [1.0, 0.0, 3.0, 0.0, 5.0, 0.0]);
    assert_eq!(rt.memory_allocated(), 1024);
    drop(x);
    assert_eq!(rt.memory_allocated(), 512);
    drop(y);
    assert_eq!(rt.memory_allocated(), 0);
    assert_eq!(rt.memory_reserved(), 2 << 20);
    // Shapes are checked before anything is allocated.
    let a = rt.zeros(&[4, 3]).unwrap();
    let b = rt.zeros(&[4, 5]).unwrap();
    assert!(rt.linear(&a, &b, None).is_err());
    assert_eq!(rt.memory_allocated(), 1024);
    rt.finish().unwrap();
}

#[test]
fn the_simulator_computes_what_the_cpu_reference_computes() {
    let rt = Runtime::new(common::sim(SimProfile::cuda_sm90(), true));
    let mut rng = Rng::new(3);
    let (batch, inputs, outputs) = (7, 13, 5);
    let xh = rng.vec(batch * inputs, -1.0, 1.0);
    let wh = rng.vec(outputs * inputs, -1.0, 1.0);
    let bh = rng.vec(outputs, -1.0, 1.0);
    let dyh = rng.vec(batch * outputs, -1.0, 1.0);
    let x = rt.from_f32(&[batch, inputs], &xh).unwrap();
    let w = rt.from_f32(&[outputs, inputs], &wh).unwrap();
    let b = rt.from_f32(&[outputs], &bh).unwrap();
    let dy = rt.from_f32(&[batch, outputs], &dyh).unwrap();
    let y = rt.linear(&x, &w, Some(&b)).unwrap();
    let mut want = vec![0.0; batch * outputs];
    cpu::linear_forward(&xh, &wh, Some(&bh), &mut want, batch as u32, inputs as u32, outputs as u32);
    assert_eq!(rt.to_vec(&y).unwrap(), want);
    let grads = rt.linear_backward(&x, &w, &dy, true, true).unwrap();
    let (mut dx, mut dw, mut db) = (vec![0.0; batch * inputs], vec![0.0; outputs * inputs], vec![0.0; outputs]);
    cpu::linear_backward(&xh, &wh, &dyh, &mut dx, &mut dw, Some(&mut db), batch as u32, inputs as u32, outputs as u32);
    assert_eq!(rt.to_vec(grads.dx.as_ref().unwrap()).unwrap(), dx);
    assert_eq!(rt.to_vec(&grads.dw).unwrap(), dw);
    assert_eq!(rt.to_vec(grads.db.as_ref().unwrap()).unwrap(), db);
    let m = rt.mean(&y).unwrap();
    let mean = want.iter().map(|&v| v as f64).sum::<f64>() / want.len() as f64;
    assert!((rt.to_vec(&m).unwrap()[0] as f64 - mean).abs() < 1e-6);
    let c = rt.matmul(&x, &w, MatmulShape::nt(batch as u32, outputs as u32, inputs as u32)).unwrap();
    let mut want_c = vec![0.0; batch * outputs];
    cpu::matmul(&xh, &wh, &mut want_c, MatmulShape::nt(batch as u32, outputs as u32, inputs as u32), 0.0, None);
    assert_eq!(rt.to_vec(&c).unwrap(), want_c);
}

/// A small training run of each optimiser, loss and activation.
pub fn small_mlps() -> Vec<MlpParams> {
    vec![
        MlpParams { widths: vec![32, 64, 48, 10], steps: 4, batches: vec![16, 24, 8], ..MlpParams::default() },
        MlpParams {
            widths: vec![24, 40, 6],
            steps: 3,
            batches: vec![12, 20],
            optimizer: Optimizer::Sgd,
            lr: 0.05,
            momentum: 0.9,
            activation: Activation::Gelu,
            loss: Loss::Mse,
            seed: 7,
        },
    ]
}

#[test]
fn mlp_train_learns_on_the_simulator() {
    let params = MlpParams { widths: vec![16, 64, 4], steps: 30, batches: vec![64], lr: 1e-2, ..MlpParams::default() };
    let result = common::run(&Experiment::MlpTrain(params), common::sim(SimProfile::cuda_sm90(), true));
    let losses = &result.record.outcome.losses;
    assert_eq!(losses.len(), 30);
    assert!(losses.iter().all(|l| l.is_finite()));
    assert!(losses[29] < losses[0] * 0.8, "the loss does not go down: {losses:?}");
    for params in small_mlps() {
        let result = common::run(&Experiment::MlpTrain(params.clone()), common::sim(SimProfile::wgpu(), true));
        assert_eq!(result.record.outcome.losses.len(), params.steps as usize);
        assert_eq!(result.snapshot.timings.len(), params.steps as usize);
    }
}

#[test]
fn matmul_sweep_checks_every_layout_on_the_simulator() {
    let params = SweepParams { shapes: vec![(17, 9, 33), (64, 64, 64)], ..SweepParams::default() };
    let result = common::run(&Experiment::MatmulSweep(params), common::sim(SimProfile::cuda_sm90(), true));
    assert_eq!(result.record.outcome.checks.len(), 6);
    assert_eq!(result.marks.len(), 6);
    // The first product allocated the cuBLAS workspace, which stays; the mark also holds the
    // product's operands (17x33, 33x9 and 17x9 f32: blocks of 2560, 1536 and 1024 bytes).
    assert_eq!(result.marks[0].allocated, 33_554_432 + 5120);
}

#[test]
fn the_ops_experiment_replays_an_op_file() {
    let path = std::env::temp_dir().join(format!("cachalot-runtime-test-{}.ops", std::process::id()));
    std::fs::write(&path, "# test\na 0 4\na 1 3000000\na 2 25165824 7\nf 1\na 3 1000\nf 0\n").unwrap();
    let experiment = Experiment::Ops(OpsParams { path: path.display().to_string(), mark_every: 2, ops_per_second: 0 });
    let on_cuda = common::run(&experiment, common::sim(SimProfile::cuda_sm90(), false));
    let on_queue = common::run(&experiment, common::sim(SimProfile::wgpu(), false));
    let _ = std::fs::remove_file(&path);
    let labels: Vec<&str> = on_cuda.marks.iter().map(|m| m.label.as_str()).collect();
    assert_eq!(labels, ["op 2", "op 4", "op 6", "end", "freed", "empty"]);
    let end = &on_cuda.marks[3];
    assert_eq!((end.allocated, end.reserved), (25_165_824 + 1024, (24 << 20) + (2 << 20) + (20 << 20)));
    // No kernels, so nothing is recorded on a queue: both disciplines give the same events.
    assert!(matches!(first_difference(&on_cuda.snapshot.trace, &on_queue.snapshot.trace), EventDiff::Identical { .. }));
    assert_eq!(on_cuda.marks.last().map(|m| m.reserved), Some(0));
}

#[test]
fn auto_selection_says_what_it_took_and_why() {
    let options = DeviceOptions { backend: BackendRequest::Auto, ..DeviceOptions::default() };
    let (device, selection) = cachalot_runtime::open(&options).unwrap();
    assert_eq!(device.kind(), selection.backend);
    assert!(selection.lines.last().unwrap().contains("taken"), "{:?}", selection.lines);
    assert!(selection.lines[0].starts_with("cuda: "), "{:?}", selection.lines);
    if selection.backend != BackendKind::Cuda {
        assert!(selection.lines[0].contains("not usable"), "{:?}", selection.lines);
    }
    let sim = DeviceOptions { backend: BackendRequest::Sim, profile: Some("nope".into()), ..DeviceOptions::default() };
    assert!(cachalot_runtime::open(&sim).is_err());
    let bad = DeviceOptions { backend: BackendRequest::Sim, config: "bogus:1".into(), ..DeviceOptions::default() };
    assert!(cachalot_runtime::open(&bad).is_err());
}

#[test]
fn compare_explains_the_workspaces_and_verifies_it() {
    let cuda = common::run(&Experiment::Seeds, common::sim(SimProfile::cuda_sm90(), false));
    let queue = common::run(&Experiment::Seeds, common::sim(SimProfile::wgpu(), false));
    let columns = vec![
        comparison::load(&common::seeds_expected()).unwrap(),
        common::column(&cuda, "cuda"),
        common::column(&queue, "queue"),
    ];
    let comparison = compare_runs(columns, CompareOptions::default());
    let why = common::describe(&comparison);
    assert!(comparison.verdict.ok(), "{why}");
    // The cuda profile gives PyTorch's marks; the queue profile differs by the workspaces alone.
    let [difference] = &comparison.differences[..] else { panic!("one run differs: {why}") };
    assert_eq!(difference.column, 2, "{why}");
    let Explanation::Tested(test) = &difference.explanation else { panic!("tested on the simulator: {why}") };
    assert_eq!(test.experiment, "seeds");
    assert!(test.unexplained.is_empty() && test.remaining.is_empty(), "verified: {why}");
    let reasons: Vec<FactorKind> = test.factors.iter().filter(|f| f.is_reason()).map(|f| f.factor.kind).collect();
    assert_eq!(reasons, [FactorKind::Workspaces], "{why}");
    let linear_output =
        MarkShift { labels: vec!["linear_output".into()], allocated: -34_603_008, reserved: -33_554_432 };
    assert!(test.factors[0].shifts.contains(&linear_output), "{why}");
    // PyTorch's recorded trace (seeds.pickle beside the expected.json) against the runs.
    let events = comparison.events.as_ref().unwrap();
    let pytorch_vs_cuda = events.pairs.iter().find(|p| (p.first, p.second) == (0, 1)).unwrap();
    assert_eq!(pytorch_vs_cuda.diff, EventDiff::Identical { entries: 60 }, "{why}");

    // A difference no factor accounts for stays unexplained and fails the comparison.
    let mut tampered = common::column(&cuda, "tampered");
    tampered.marks[3].allocated += 512;
    let label = tampered.marks[3].label.clone();
    let comparison = compare_runs(vec![common::column(&cuda, "cuda"), tampered], CompareOptions::default());
    let why = common::describe(&comparison);
    assert_eq!(comparison.verdict.unexplained, 1, "{why}");
    assert!(!comparison.verdict.ok());
    let Explanation::Tested(test) = &comparison.differences[0].explanation else { panic!("tested: {why}") };
    assert!(test.factors.is_empty(), "no factor differs: {why}");
    assert_eq!(test.unexplained, std::slice::from_ref(&label));
    assert_eq!(test.remaining, [MarkShift { labels: vec![label], allocated: 512, reserved: 0 }]);

    // Without verification the same difference is named, untested.
    let mut tampered = common::column(&queue, "tampered");
    tampered.marks[3].allocated += 512;
    let options = CompareOptions { verify: false, ..CompareOptions::default() };
    let comparison = compare_runs(vec![common::column(&cuda, "cuda"), tampered], options);
    let why = common::describe(&comparison);
    let Explanation::Untested { failed_rerun: None, factors, unexplained } = &comparison.differences[0].explanation
    else {
        panic!("untested: {why}")
    };
    assert!(factors.iter().any(|f| f.kind == FactorKind::Workspaces), "{why}");
    assert_eq!(comparison.verdict.unexplained, unexplained.len());
    assert!(comparison.events.as_ref().unwrap().reproductions.is_empty(), "{why}");
}

/// The paced comparison (the browser's: a pause before each rerun on the simulator, each pause
/// pending once as a page's next frame is) pauses once per rerun and gives the comparison
/// `compare_runs` gives; an expected.json read from bytes (an upload) is the column `load` reads
/// from the file, less PyTorch's trace beside it.
#[test]
fn the_paced_comparison_pauses_before_each_rerun_and_agrees() {
    use std::task::{Context, Poll, Waker};

    let queue = common::run(&Experiment::Seeds, common::sim(SimProfile::wgpu(), false));
    let path = common::seeds_expected();
    let uploaded =
        comparison::from_expected_json("seeds.expected.json".into(), &std::fs::read(&path).unwrap()).unwrap();
    let mut loaded = comparison::load(&path).unwrap();
    assert!(loaded.trace.is_some() && uploaded.trace.is_none());
    loaded.trace = None;
    assert_eq!(format!("{uploaded:?}"), format!("{loaded:?}"));
    let bad = comparison::from_expected_json("x.json".into(), b"{\"format\": 1}").unwrap_err();
    assert!(bad.contains("no 'marks'"), "{bad}");

    let columns = vec![uploaded, common::column(&queue, "queue")];
    let whole = compare_runs(columns.clone(), CompareOptions::default());
    let mut steps = Vec::new();
    let mut polls = 0;
    let paced = {
        let future = comparison::compare_runs_paced(columns, CompareOptions::default(), |what| {
            steps.push(what);
            let mut paused = false;
            std::future::poll_fn(
                move |_| {
                    if std::mem::replace(&mut paused, true) { Poll::Ready(()) } else { Poll::Pending }
                },
            )
        });
        let mut future = std::pin::pin!(future);
        loop {
            polls += 1;
            if let Poll::Ready(c) = future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                break c;
            }
        }
    };
    // The baseline, then each differing factor, then the queue run's events against the
    // simulator: a rerun after each pause.
    let Some(Explanation::Tested(test)) = paced.differences.first().map(|d| &d.explanation) else {
        panic!("tested: {}", common::describe(&paced))
    };
    assert_eq!(steps.len(), 1 + test.factors.len() + 1, "{steps:?}");
    assert_eq!(polls, steps.len() + 1);
    assert!(steps[0].starts_with("seeds with seeds.expected.json's factors"), "{steps:?}");
    assert_eq!(common::describe(&paced), common::describe(&whole));
    assert_eq!(paced.marks, whole.marks);
    assert!(paced.verdict.ok(), "{}", common::describe(&paced));
}

#[test]
fn compare_checks_losses_against_the_tolerance() {
    let params = small_mlps().remove(0);
    let a = common::run(&Experiment::MlpTrain(params.clone()), common::sim(SimProfile::cuda_sm90(), true));
    let b = common::run(&Experiment::MlpTrain(params), common::sim(SimProfile::wgpu(), true));
    let (ca, mut cb) = (common::column(&a, "a"), common::column(&b, "b"));
    let comparison = compare_runs(vec![ca.clone(), cb.clone()], CompareOptions::default());
    let why = common::describe(&comparison);
    assert!(comparison.verdict.ok(), "{why}");
    let losses = comparison.losses.as_ref().unwrap();
    assert_eq!(losses.verdicts, [LossVerdict { column: 1, largest_relative: 0.0, agrees: true }], "{why}");
    cb.losses[1] *= 1.01;
    let comparison = compare_runs(vec![ca, cb], CompareOptions::default());
    let why = common::describe(&comparison);
    assert_eq!(comparison.verdict.loss_failures, 1, "{why}");
    let losses = comparison.losses.as_ref().unwrap();
    assert!(matches!(losses.steps[1][1], LossCell::Compared { over_tolerance: true, .. }), "{why}");
    assert!(!losses.verdicts[0].agrees, "{why}");
}

#[test]
fn expandable_segments_run_on_the_simulator() {
    let device =
        SimDevice::new(SimProfile::cuda_sm90(), AllocatorConfig::parse("expandable_segments:True").unwrap(), true)
            .unwrap();
    let params = small_mlps().remove(0);
    let result = common::run(&Experiment::MlpTrain(params.clone()), Box::new(device));
    let plain = common::run(&Experiment::MlpTrain(params), common::sim(SimProfile::cuda_sm90(), true));
    assert_eq!(result.record.outcome.losses, plain.record.outcome.losses);
    assert!(result.snapshot.trace.iter().any(|e| e.action == cachalot_core::TraceAction::SegmentMap));
}

/// Every allocation of an experiment names the operation, the experiment's line that called it
/// (found by `#[track_caller]`, not a line of the runtime) and the phase; workspaces add their
/// own innermost frame.
#[test]
fn every_allocation_records_the_experiments_call_site() {
    use cachalot_core::TraceAction;
    use cachalot_runtime::runtime::{CALLER_FRAME, RUNTIME_FILE, WORKSPACE_FRAME};
    for experiment in [Experiment::Seeds, Experiment::MlpTrain(small_mlps().remove(0))] {
        let result = common::run(&experiment, common::sim(SimProfile::cuda_sm90(), false));
        let snapshot = &result.snapshot;
        let table = snapshot.context_table();
        let mut callers = std::collections::BTreeSet::new();
        let mut workspaces = 0;
        for e in snapshot.trace.iter().filter(|e| e.action == TraceAction::Alloc) {
            let frames = table.frames(e.context.expect("every allocation has a stack"));
            let inner = usize::from(&*frames[0].name == WORKSPACE_FRAME || frames.len() == 4);
            workspaces += usize::from(&*frames[0].name == WORKSPACE_FRAME);
            assert_eq!(frames.len(), 3 + inner, "{frames:?}");
            assert_eq!(&*frames[inner].filename, RUNTIME_FILE, "the operation: {frames:?}");
            let caller = &frames[inner + 1];
            assert_eq!(&*caller.name, CALLER_FRAME);
            assert!(caller.filename.contains("experiments") && caller.line > 0, "a line of the experiment: {caller:?}");
            callers.insert((caller.filename.to_string(), caller.line));
        }
        assert!(callers.len() > 3, "{}: distinct call sites {callers:?}", experiment.name());
        assert!(workspaces > 0, "{}: the cuBLAS workspaces are named", experiment.name());
    }
}
