//! The `seeds` workload of the reference traces, run for real on the GPU: every
//! `memory_allocated()` / `memory_reserved()` mark equals PyTorch 2.11's on an H200
//! (`shared/traces/pytorch-2.11-h200/seeds.expected.json`), and the trace has PyTorch's
//! actions and sizes in PyTorch's order, cuBLAS and cuBLASLt workspaces included.

use cachalot_core::{AllocatorConfig, StreamId, TraceAction};
use cachalot_cuda::{DeviceSpan, WorkspaceSizes};
use cachalot_shaders::cpu::Rng;

use crate::common;

/// `(action, size)` of every entry of `seeds.pickle`'s trace (PyTorch 2.11, H200), in order.
const PYTORCH_TRACE: &[(&str, u64)] = &[
    ("segment_alloc", 2097152),
    ("alloc", 4),
    ("free_requested", 4),
    ("free_completed", 4),
    ("segment_free", 2097152),
    ("segment_alloc", 44040192),
    ("alloc", 43008000),
    ("free_requested", 43008000),
    ("free_completed", 43008000),
    ("segment_free", 44040192),
    ("segment_alloc", 2097152),
    ("alloc", 40960),
    ("alloc", 40),
    ("segment_alloc", 41943040),
    ("alloc", 41943040),
    ("alloc", 409600),
    ("segment_alloc", 33554432),
    ("alloc", 33554432),
    ("alloc", 1048576),
    ("free_requested", 41943040),
    ("free_completed", 41943040),
    ("free_requested", 40960),
    ("free_completed", 40960),
    ("free_requested", 40),
    ("free_completed", 40),
    ("free_requested", 409600),
    ("free_completed", 409600),
    ("segment_free", 41943040),
    ("segment_alloc", 268435456),
    ("alloc", 268435456),
    ("segment_alloc", 268435456),
    ("alloc", 268435456),
    ("alloc", 4),
    ("alloc", 2112),
    ("alloc", 4),
    ("free_requested", 4),
    ("free_completed", 4),
    ("free_requested", 2112),
    ("free_completed", 2112),
    ("alloc", 4),
    ("segment_alloc", 268435456),
    ("alloc", 268435456),
    ("segment_alloc", 268435456),
    ("alloc", 268435456),
    ("free_requested", 268435456),
    ("free_completed", 268435456),
    ("free_requested", 4),
    ("free_completed", 4),
    ("free_requested", 4),
    ("free_completed", 4),
    ("free_requested", 268435456),
    ("free_completed", 268435456),
    ("free_requested", 268435456),
    ("free_completed", 268435456),
    ("free_requested", 268435456),
    ("free_completed", 268435456),
    ("segment_free", 268435456),
    ("segment_free", 268435456),
    ("segment_free", 268435456),
    ("segment_free", 268435456),
];

fn expected_marks() -> Vec<(String, u64, u64)> {
    let path = common::shared_dir().join("traces/pytorch-2.11-h200/seeds.expected.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (set CACHALOT_SHARED_DIR to the shared folder)", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).expect("seeds.expected.json");
    json["marks"]
        .as_array()
        .expect("marks")
        .iter()
        .map(|m| {
            let label = m["label"].as_str().expect("label").to_string();
            (label, m["allocated"].as_u64().expect("allocated"), m["reserved"].as_u64().expect("reserved"))
        })
        .collect()
}

#[test]
fn seeds_workload_matches_pytorch_marks_and_trace() {
    let Some(device) = common::device("seeds_workload_matches_pytorch_marks_and_trace") else { return };
    let expected = expected_marks();
    let (mut a, kernels) = common::allocator_and_kernels(&device, AllocatorConfig::default());
    // The H200 run used the Hopper sizes; on another architecture use them too, so that the
    // comparison stays meaningful (the rule itself is tested in `kernels`).
    let (major, _) = device.compute_capability();
    let rule_major = if matches!(major, 9 | 10 | 12) { major } else { 9 };
    if rule_major != major {
        eprintln!("note: compute capability {major}.x; using the Hopper workspace sizes of the H200 reference run");
    }
    let mut k = kernels.with_workspace_sizes(WorkspaceSizes::pytorch(rule_major, None, None));
    a.record_history(true, 1_000_000, &[], true);
    let s = StreamId::DEFAULT; // PyTorch's current stream
    let mut rng = Rng::new(2);

    // a = torch.zeros(1).to("cuda")
    let t = a.malloc(4, s).unwrap();
    k.upload(s, &t, &[0.0f32]).unwrap();
    a.mark("tiny");
    a.free(t).unwrap();
    a.mark("tiny_del");
    a.empty_cache().unwrap();
    a.mark("tiny_empty");

    // a = torch.zeros(10240, 1050).to("cuda")
    let t = a.malloc(10240 * 1050 * 4, s).unwrap();
    k.fill(s, &t, 10240 * 1050, 0.0).unwrap();
    a.mark("10240x1050");
    a.free(t).unwrap();
    a.empty_cache().unwrap();
    a.mark("empty");

    // m = torch.nn.Linear(1024, 10).cuda()
    let w = a.malloc(10 * 1024 * 4, s).unwrap();
    let b = a.malloc(10 * 4, s).unwrap();
    k.upload(s, &w, &rng.vec(10 * 1024, -0.03, 0.03)).unwrap();
    k.upload(s, &b, &rng.vec(10, -0.03, 0.03)).unwrap();
    a.mark("linear_model");
    // d = torch.zeros(10240, 1024).to("cuda")
    let d = a.malloc(10240 * 1024 * 4, s).unwrap();
    k.fill(s, &d, 10240 * 1024, 0.0).unwrap();
    a.mark("linear_input");
    // o = m(d): the output, then (first GEMM on the stream) the cuBLAS and cuBLASLt workspaces.
    let o = a.malloc(10240 * 10 * 4, s).unwrap();
    k.linear_forward(&mut a, s, &d, &w, Some(DeviceSpan::from(&b)), &o, 10240, 1024, 10).unwrap();
    a.mark("linear_output");
    let bias: Vec<f32> = k.read(s, &b, 10).unwrap();
    let out: Vec<f32> = k.read(s, &o, 20).unwrap();
    assert_eq!(&out[..10], &bias[..], "zeros · Wᵀ + b = b");
    // del m, d, o (PyTorch freed d, then the weight, the bias and the output)
    for t in [d, w, b, o] {
        a.free(t).unwrap();
    }
    a.empty_cache().unwrap();
    a.mark("linear_empty");

    // x = torch.zeros([1, 1024, 1024, 64], requires_grad=True); y = 5 * x
    let n: u64 = 1024 * 1024 * 64;
    let x = a.malloc(n * 4, s).unwrap();
    k.fill(s, &x, n, 0.0).unwrap();
    let y = a.malloc(n * 4, s).unwrap();
    k.scale(s, &x, &y, 5.0, n).unwrap();
    a.mark("bw_y");
    // torch.mean(y): the scalar, the reduction's staging buffer and semaphore.
    let mean = a.malloc(4, s).unwrap();
    let staging = a.malloc(2112, s).unwrap();
    let semaphore = a.malloc(4, s).unwrap();
    k.fill_u32(s, &semaphore, 1, 0).unwrap();
    k.sum(s, &y, n, &staging, &mean, 1.0 / n as f32).unwrap();
    a.free(semaphore).unwrap();
    a.free(staging).unwrap();
    // .backward(): grad of the scalar, its expansion / n, and 5 · that into x.grad.
    let g = a.malloc(4, s).unwrap();
    k.fill(s, &g, 1, 1.0).unwrap();
    let gy = a.malloc(n * 4, s).unwrap();
    k.fill(s, &gy, n, 1.0 / n as f32).unwrap();
    let gx = a.malloc(n * 4, s).unwrap();
    k.scale(s, &gy, &gx, 5.0, n).unwrap();
    a.free(gy).unwrap();
    a.free(g).unwrap();
    a.free(mean).unwrap();
    a.mark("bw_after");
    let grad: Vec<f32> = k.read(s, &gx, 4).unwrap();
    assert!(grad.iter().all(|&v| (v - 5.0 / n as f32).abs() < 1e-12), "{grad:?}");
    // del x, y (x.grad goes with x)
    for t in [gx, x, y] {
        a.free(t).unwrap();
    }
    a.empty_cache().unwrap();
    a.mark("bw_empty");

    let got: Vec<(String, u64, u64)> = a.marks().iter().map(|m| (m.label.clone(), m.allocated, m.reserved)).collect();
    for (g, e) in got.iter().zip(&expected) {
        println!("{:<14} allocated {:>11} (PyTorch {:>11})  reserved {:>11} (PyTorch {:>11})", g.0, g.1, e.1, g.2, e.2);
    }
    assert_eq!(got, expected, "marks differ from PyTorch 2.11's");

    let trace: Vec<(&str, u64)> = a.trace().iter().map(|e| (e.action.name(), e.size)).collect();
    assert_eq!(trace, PYTORCH_TRACE, "trace differs from PyTorch 2.11's");
    assert!(a.trace().iter().all(|e| e.stream == s && e.action != TraceAction::Oom));
    // The 32 MiB + 1 MiB workspaces stay, as in PyTorch; the backend holds exactly `reserved`.
    assert_eq!(a.backend().device_bytes(), a.memory_reserved());
    assert_eq!(k.workspaces().len(), 2);
}
