//! Kernel correctness against the CPU references of `cachalot-shaders` (relative error below
//! 1e-4 in f32), shapes that are not multiples of anything, cuBLAS/cuBLASLt products, and
//! PyTorch 2.11's workspace allocations.

use cachalot_core::{AllocatorConfig, CachingAllocator, StreamId, TraceAction};
use cachalot_cuda::{CudaBackend, CudaError, CudaKernels, DeviceSpan, WorkspaceKind, WorkspaceSizes};
use cachalot_shaders::cpu::{self, Rng, elementwise_relative_error, relative_error};
use cachalot_shaders::ops::{
    Activation, ActivationBackward, ActivationForward, AdamStep, CrossEntropy, Matmul, Mse, SgdStep, SumRows,
};
use cachalot_shaders::{Adam, MatmulShape, Sgd};

use crate::common;

const TOLERANCE: f64 = 1e-4;

/// Allocates `data.len()` f32 on `stream` and uploads `data`.
fn upload(
    allocator: &mut CachingAllocator<CudaBackend>,
    kernels: &CudaKernels,
    stream: StreamId,
    data: &[f32],
) -> cachalot_core::Allocation {
    let a = allocator.malloc((data.len().max(1) * 4) as u64, stream).expect("malloc");
    kernels.upload(stream, &a, data).expect("upload");
    a
}

fn read(kernels: &CudaKernels, stream: StreamId, a: &cachalot_core::Allocation, n: usize) -> Vec<f32> {
    kernels.read(stream, a, n).expect("read")
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    let error = elementwise_relative_error(got, want, 1e-3);
    assert!(error < TOLERANCE, "{what}: relative error {error:e}");
}

#[test]
fn elementwise_kernels_match_the_cpu_references() {
    let Some(device) = common::device("elementwise_kernels_match_the_cpu_references") else { return };
    let (mut allocator, kernels) = common::allocator_and_kernels(&device, AllocatorConfig::default());
    let s = device.new_stream().expect("stream");
    let mut rng = Rng::new(11);
    for n in [1usize, 3, 255, 256, 257, 1000, 4097, 100_003] {
        let x = rng.vec(n, -3.0, 3.0);
        let dy = rng.vec(n, -1.0, 1.0);
        let (dx_dev, x_dev, dy_dev) = (
            upload(&mut allocator, &kernels, s, &vec![0.0; n]),
            upload(&mut allocator, &kernels, s, &x),
            upload(&mut allocator, &kernels, s, &dy),
        );
        let y_dev = upload(&mut allocator, &kernels, s, &vec![0.0; n]);
        let n64 = n as u64;

        assert_eq!(read(&kernels, s, &x_dev, n), x, "upload/read round trip, n = {n}");
        kernels.fill(s, &y_dev, n64, 0.25).unwrap();
        assert!(read(&kernels, s, &y_dev, n).iter().all(|&v| v == 0.25), "fill");
        kernels.copy(s, &x_dev, &y_dev, n64).unwrap();
        assert_eq!(read(&kernels, s, &y_dev, n), x, "copy");
        kernels.scale(s, &x_dev, &y_dev, -2.5, n64).unwrap();
        assert_close("scale", &read(&kernels, s, &y_dev, n), &x.iter().map(|v| -2.5 * v).collect::<Vec<_>>());

        let mut want = vec![0.0; n];
        for act in [Activation::Relu, Activation::Gelu] {
            kernels.activation(s, ActivationForward { act, x: &x_dev, y: &y_dev, n: n64 }).unwrap();
            cpu::activation_forward(act, &x, &mut want);
            assert_close(act.forward_entry(), &read(&kernels, s, &y_dev, n), &want);
            kernels
                .activation_backward(s, ActivationBackward { act, x: &x_dev, dy: &dy_dev, dx: &dx_dev, n: n64 })
                .unwrap();
            cpu::activation_backward(act, &x, &dy, &mut want);
            assert_close(act.backward_entry(), &read(&kernels, s, &dx_dev, n), &want);
        }

        // Losses: MSE of x against dy.
        let loss = allocator.malloc(4, s).unwrap();
        kernels.mse(s, Mse { pred: &x_dev, target: &dy_dev, loss: &loss, grad: Some(&dx_dev), n: n64 }).unwrap();
        let got = read(&kernels, s, &loss, 1)[0];
        let want_loss = cpu::mse_loss(&x, &dy);
        assert!(relative_error(&[got], &[want_loss]) < TOLERANCE, "mse_loss {got} vs {want_loss}");
        cpu::mse_grad(&x, &dy, &mut want, 2.0 / n as f32);
        assert_close("mse_grad", &read(&kernels, s, &dx_dev, n), &want);

        // The two-pass sum (as a mean).
        let partials = allocator.malloc(cachalot_cuda::SUM_PARTIALS as u64 * 4, s).unwrap();
        kernels.sum(s, &x_dev, n64, &partials, &loss, 1.0 / n as f32).unwrap();
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let got = read(&kernels, s, &loss, 1)[0] as f64;
        assert!(
            (got - mean).abs() <= TOLERANCE * x.iter().fold(0.0f64, |m, &v| m.max(v.abs() as f64)),
            "mean {got} vs {mean}"
        );

        // Optimisers: SGD (plain, momentum, Nesterov with weight decay) and Adam, three steps.
        for sgd in [
            Sgd::new(0.1),
            Sgd { lr: 0.05, momentum: 0.9, dampening: 0.1, weight_decay: 0.0, nesterov: false },
            Sgd { lr: 0.05, momentum: 0.9, dampening: 0.0, weight_decay: 0.01, nesterov: true },
        ] {
            let (mut p, mut buf) = (x.clone(), vec![0.0; n]);
            let (p_dev, buf_dev) = (upload(&mut allocator, &kernels, s, &p), upload(&mut allocator, &kernels, s, &buf));
            for step in 0..3 {
                let momentum = (sgd.momentum != 0.0).then_some(&buf_dev);
                let op = SgdStep { param: &p_dev, grad: &dy_dev, momentum, n: n64, sgd, first_step: step == 0 };
                kernels.sgd_step(s, op).unwrap();
                cpu::sgd_step(&mut p, &dy, &mut buf, sgd, step == 0);
            }
            assert_close("sgd_step", &read(&kernels, s, &p_dev, n), &p);
            allocator.free(p_dev).unwrap();
            allocator.free(buf_dev).unwrap();
        }
        let adam = Adam { lr: 0.01, weight_decay: 0.001, ..Adam::default() };
        let (mut p, mut m, mut v) = (x.clone(), vec![0.0; n], vec![0.0; n]);
        let (p_dev, m_dev, v_dev) = (
            upload(&mut allocator, &kernels, s, &p),
            upload(&mut allocator, &kernels, s, &m),
            upload(&mut allocator, &kernels, s, &v),
        );
        for step in 1..=3 {
            kernels
                .adam_step(
                    s,
                    AdamStep { param: &p_dev, grad: &dy_dev, exp_avg: &m_dev, exp_avg_sq: &v_dev, n: n64, adam, step },
                )
                .unwrap();
            cpu::adam_step(&mut p, &dy, &mut m, &mut v, adam, step);
        }
        assert_close("adam_step param", &read(&kernels, s, &p_dev, n), &p);
        assert_close("adam_step exp_avg_sq", &read(&kernels, s, &v_dev, n), &v);

        for a in [dx_dev, x_dev, dy_dev, y_dev, loss, partials, p_dev, m_dev, v_dev] {
            allocator.free(a).unwrap();
        }
    }

    // Row/column kernels and cross-entropy on shapes that are not multiples of anything.
    for (rows, cols) in [(1u32, 1u32), (7, 10), (37, 13), (3, 1000), (300, 257)] {
        let n = (rows * cols) as usize;
        let x = rng.vec(n, -4.0, 4.0);
        let bias = rng.vec(cols as usize, -1.0, 1.0);
        let x_dev = upload(&mut allocator, &kernels, s, &x);
        let bias_dev = upload(&mut allocator, &kernels, s, &bias);
        kernels.add_bias(s, &x_dev, &bias_dev, rows, cols).unwrap();
        let mut want = x.clone();
        cpu::add_bias(&mut want, &bias);
        assert_close("add_bias", &read(&kernels, s, &x_dev, n), &want);

        let sums_dev = upload(&mut allocator, &kernels, s, &bias);
        kernels.sum_rows(s, SumRows { x: &x_dev, out: &sums_dev, rows, cols, accumulate: true }).unwrap();
        let mut sums = bias.clone();
        cpu::sum_rows(&want, &mut sums, rows, cols, true);
        let got = read(&kernels, s, &sums_dev, cols as usize);
        assert!(relative_error(&got, &sums) < TOLERANCE, "sum_rows {rows}x{cols}: {:e}", relative_error(&got, &sums));

        let targets: Vec<u32> = (0..rows).map(|_| rng.below(cols)).collect();
        let targets_dev = allocator.malloc(rows as u64 * 4, s).unwrap();
        kernels.upload(s, &targets_dev, &targets).unwrap();
        let (loss_dev, grad_dev) = (allocator.malloc(4, s).unwrap(), allocator.malloc(n as u64 * 4, s).unwrap());
        let before = allocator.memory_allocated();
        kernels
            .cross_entropy(
                &mut allocator,
                s,
                CrossEntropy { logits: &x_dev, targets: &targets_dev, loss: &loss_dev, grad: &grad_dev, rows, cols },
            )
            .unwrap();
        assert_eq!(allocator.memory_allocated(), before, "the scratch row goes back at once");
        let mut grad = vec![0.0; n];
        let loss = cpu::cross_entropy(&want, &targets, &mut grad, rows, cols, 1.0 / rows as f32);
        let got = read(&kernels, s, &loss_dev, 1)[0];
        assert!(relative_error(&[got], &[loss]) < TOLERANCE, "cross-entropy {got} vs {loss}");
        let got = read(&kernels, s, &grad_dev, n);
        assert!(relative_error(&got, &grad) < TOLERANCE, "cross-entropy grad: {:e}", relative_error(&got, &grad));
        for a in [x_dev, bias_dev, sums_dev, targets_dev, loss_dev, grad_dev] {
            allocator.free(a).unwrap();
        }
    }
}

#[test]
fn matmul_through_cublas_matches_the_cpu() {
    let Some(device) = common::device("matmul_through_cublas_matches_the_cpu") else { return };
    let (mut allocator, mut kernels) = common::allocator_and_kernels(&device, AllocatorConfig::default());
    let s = StreamId::DEFAULT;
    let mut rng = Rng::new(5);
    for (m, n, k) in [(1u32, 1u32, 1u32), (17, 33, 65), (128, 96, 200), (257, 129, 511), (5, 300, 3)] {
        for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
            for (beta, with_bias) in [(0.0f32, false), (1.0, false), (0.0, true), (1.0, true)] {
                let shape = MatmulShape { m, n, k, trans_a, trans_b };
                let (ea, eb, ec) = shape.elements();
                let a = rng.vec(ea as usize, -1.0, 1.0);
                let b = rng.vec(eb as usize, -1.0, 1.0);
                let c0 = rng.vec(ec as usize, -1.0, 1.0);
                let bias = rng.vec(n as usize, -1.0, 1.0);
                let (a_dev, b_dev, c_dev, bias_dev) = (
                    upload(&mut allocator, &kernels, s, &a),
                    upload(&mut allocator, &kernels, s, &b),
                    upload(&mut allocator, &kernels, s, &c0),
                    upload(&mut allocator, &kernels, s, &bias),
                );
                let op = Matmul { a: &a_dev, b: &b_dev, c: &c_dev, shape, beta, bias: with_bias.then_some(&bias_dev) };
                kernels.matmul(&mut allocator, s, op).unwrap();
                let mut want = c0.clone();
                cpu::matmul(&a, &b, &mut want, shape, beta, with_bias.then_some(&bias[..]));
                let got = read(&kernels, s, &c_dev, ec as usize);
                let error = relative_error(&got, &want);
                assert!(error < TOLERANCE, "{shape:?} beta {beta} bias {with_bias}: relative error {error:e}");
                for x in [a_dev, b_dev, c_dev, bias_dev] {
                    allocator.free(x).unwrap();
                }
            }
        }
    }
    // An empty product does nothing; an empty contraction gives beta·C + bias.
    let (a_dev, c_dev, bias_dev) = (
        upload(&mut allocator, &kernels, s, &[1.0; 6]),
        upload(&mut allocator, &kernels, s, &[7.0; 6]),
        upload(&mut allocator, &kernels, s, &[1.0, 2.0, 3.0]),
    );
    kernels.matmul(&mut allocator, s, Matmul::new(&a_dev, &a_dev, &c_dev, MatmulShape::nn(0, 3, 2))).unwrap();
    assert_eq!(read(&kernels, s, &c_dev, 6), vec![7.0; 6]);
    let op = Matmul { bias: Some(&bias_dev), ..Matmul::new(&a_dev, &a_dev, &c_dev, MatmulShape::nn(2, 3, 0)) };
    kernels.matmul(&mut allocator, s, op).unwrap();
    assert_eq!(read(&kernels, s, &c_dev, 6), vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    // Operands too small are refused before anything runs.
    let err = kernels.matmul(&mut allocator, s, Matmul::new(&a_dev, &a_dev, &c_dev, MatmulShape::nn(3, 3, 3)));
    assert!(matches!(err, Err(CudaError::InvalidArguments(_))), "{err:?}");
}

#[test]
fn linear_layer_forward_and_backward_match_the_cpu() {
    let Some(device) = common::device("linear_layer_forward_and_backward_match_the_cpu") else { return };
    let (mut allocator, mut kernels) = common::allocator_and_kernels(&device, AllocatorConfig::default());
    let s = device.new_stream().expect("stream");
    let mut rng = Rng::new(9);
    for (batch, inputs, outputs) in [(1u32, 1u32, 1u32), (33, 70, 19), (128, 1024, 10), (257, 65, 131)] {
        let (bi, io, bo) = ((batch * inputs) as usize, (inputs * outputs) as usize, (batch * outputs) as usize);
        let x = rng.vec(bi, -1.0, 1.0);
        let w = rng.vec(io, -0.5, 0.5);
        let bias = rng.vec(outputs as usize, -1.0, 1.0);
        let dy = rng.vec(bo, -1.0, 1.0);
        let x_dev = upload(&mut allocator, &kernels, s, &x);
        let w_dev = upload(&mut allocator, &kernels, s, &w);
        let b_dev = upload(&mut allocator, &kernels, s, &bias);
        let dy_dev = upload(&mut allocator, &kernels, s, &dy);
        let y_dev = upload(&mut allocator, &kernels, s, &vec![0.0; bo]);
        kernels
            .linear_forward(
                &mut allocator,
                s,
                &x_dev,
                &w_dev,
                Some(DeviceSpan::from(&b_dev)),
                &y_dev,
                batch,
                inputs,
                outputs,
            )
            .unwrap();
        let mut y = vec![0.0; bo];
        cpu::linear_forward(&x, &w, Some(&bias), &mut y, batch, inputs, outputs);
        let got = read(&kernels, s, &y_dev, bo);
        assert!(
            relative_error(&got, &y) < TOLERANCE,
            "forward {batch}x{inputs}x{outputs}: {:e}",
            relative_error(&got, &y)
        );

        // Backward, overwriting then accumulating the weight and bias gradients.
        let dx_dev = upload(&mut allocator, &kernels, s, &vec![0.0; bi]);
        let dw_dev = upload(&mut allocator, &kernels, s, &vec![0.0; io]);
        let db_dev = upload(&mut allocator, &kernels, s, &vec![0.0; outputs as usize]);
        let (mut dx, mut dw, mut db) = (vec![0.0; bi], vec![0.0; io], vec![0.0; outputs as usize]);
        cpu::linear_backward(&x, &w, &dy, &mut dx, &mut dw, Some(&mut db), batch, inputs, outputs);
        for accumulate in [false, true] {
            kernels
                .linear_backward(
                    &mut allocator,
                    s,
                    &x_dev,
                    &w_dev,
                    &dy_dev,
                    Some(DeviceSpan::from(&dx_dev)),
                    &dw_dev,
                    Some(DeviceSpan::from(&db_dev)),
                    batch,
                    inputs,
                    outputs,
                    accumulate,
                )
                .unwrap();
            let factor = if accumulate { 2.0 } else { 1.0 };
            let scaled = |v: &[f32]| v.iter().map(|x| x * factor).collect::<Vec<f32>>();
            for (name, dev, want, len) in [
                ("dx", &dx_dev, dx.clone(), bi),
                ("dw", &dw_dev, scaled(&dw), io),
                ("db", &db_dev, scaled(&db), outputs as usize),
            ] {
                let got = read(&kernels, s, dev, len);
                let error = relative_error(&got, &want);
                assert!(error < TOLERANCE, "{name} {batch}x{inputs}x{outputs} accumulate {accumulate}: {error:e}");
            }
        }
        for a in [x_dev, w_dev, b_dev, dy_dev, y_dev, dx_dev, dw_dev, db_dev] {
            allocator.free(a).unwrap();
        }
    }
}

#[test]
fn workspaces_are_allocated_like_pytorch_2_11() {
    let Some(device) = common::device("workspaces_are_allocated_like_pytorch_2_11") else { return };
    let (mut allocator, kernels) = common::allocator_and_kernels(&device, AllocatorConfig::default());
    let (major, _) = device.compute_capability();
    let sizes = WorkspaceSizes::pytorch(major, None, None);
    let mut kernels = kernels.with_workspace_sizes(sizes);
    allocator.record_history(true, 100_000, &[], true);
    let (s1, s2, s3) = (StreamId::DEFAULT, device.new_stream().unwrap(), device.new_stream().unwrap());

    // nn.Linear(1024, 10) with bias on [128, 1024]: output, then the cuBLAS workspace, then
    // the separate 1 MiB cuBLASLt workspace (the stack PyTorch 2.11 recorded on an H200).
    let x = allocator.malloc(128 * 1024 * 4, s1).unwrap();
    let w = allocator.malloc(10 * 1024 * 4, s1).unwrap();
    let b = allocator.malloc(10 * 4, s1).unwrap();
    let y = allocator.malloc(128 * 10 * 4, s1).unwrap();
    kernels.fill(s1, &x, 128 * 1024, 0.01).unwrap();
    kernels.fill(s1, &w, 10 * 1024, 0.5).unwrap();
    kernels.fill(s1, &b, 10, 1.0).unwrap();
    let before = allocator.memory_allocated();
    let start = allocator.trace().len();
    kernels.linear_forward(&mut allocator, s1, &x, &w, Some(DeviceSpan::from(&b)), &y, 128, 1024, 10).unwrap();
    let allocs: Vec<u64> =
        allocator.trace()[start..].iter().filter(|e| e.action == TraceAction::Alloc).map(|e| e.size).collect();
    assert_eq!(allocs, vec![sizes.cublas, sizes.cublaslt], "cuBLAS workspace first, then cuBLASLt's");
    let ws_bytes = |a: &CachingAllocator<CudaBackend>| a.memory_allocated();
    let after_first = ws_bytes(&allocator);
    assert!(after_first >= before + sizes.cublas + sizes.cublaslt);
    assert!(read(&kernels, s1, &y, 1)[0] > 6.0, "0.01 * 0.5 * 1024 + 1 = 6.12");

    // A second forward on the same stream allocates nothing more.
    kernels.linear_forward(&mut allocator, s1, &x, &w, Some(DeviceSpan::from(&b)), &y, 128, 1024, 10).unwrap();
    assert_eq!(ws_bytes(&allocator), after_first);
    // A plain product on another stream: its own cuBLAS workspace, no cuBLASLt one.
    device.wait_stream(s2, s1).unwrap();
    let y2 = allocator.malloc(128 * 10 * 4, s2).unwrap();
    kernels.linear_forward(&mut allocator, s2, &x, &w, None, &y2, 128, 1024, 10).unwrap();
    // A forward with bias on a third stream: both.
    device.wait_stream(s3, s1).unwrap();
    let y3 = allocator.malloc(128 * 10 * 4, s3).unwrap();
    kernels.linear_forward(&mut allocator, s3, &x, &w, Some(DeviceSpan::from(&b)), &y3, 128, 1024, 10).unwrap();
    let kinds: Vec<(StreamId, WorkspaceKind, u64)> =
        kernels.workspaces().iter().map(|w| (w.stream, w.kind, w.allocation.requested_size())).collect();
    let mut want = vec![
        (s1, WorkspaceKind::Cublas, sizes.cublas),
        (s1, WorkspaceKind::CublasLt, sizes.cublaslt),
        (s2, WorkspaceKind::Cublas, sizes.cublas),
        (s3, WorkspaceKind::Cublas, sizes.cublas),
        (s3, WorkspaceKind::CublasLt, sizes.cublaslt),
    ];
    want.sort_by_key(|w| w.0);
    assert_eq!(kinds, want);
    for (stream, out) in [(s2, &y2), (s3, &y3)] {
        let got = read(&kernels, stream, out, 1280);
        assert!(got.iter().all(|&v| (v - if stream == s2 { 5.12 } else { 6.12 }).abs() < 1e-3), "{}", got[0]);
    }

    // Clearing gives the workspaces back to the cache: allocated drops, reserved stays.
    device.synchronize().unwrap();
    let reserved = allocator.memory_reserved();
    let allocated = allocator.memory_allocated();
    kernels.clear_workspaces(&mut allocator).unwrap();
    assert_eq!(allocator.memory_allocated(), allocated - 3 * sizes.cublas - 2 * sizes.cublaslt);
    assert_eq!(allocator.memory_reserved(), reserved);
    assert!(kernels.workspaces().is_empty());
    for a in [x, w, b, y, y2, y3] {
        allocator.free(a).unwrap();
    }
}
