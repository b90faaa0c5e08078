//! Every WGSL kernel against its CPU reference (`cachalot_shaders::cpu`) on fresh random
//! inputs, at several shapes including ones that are not multiples of the tile or of 4.
//! Runs on any wgpu adapter (Mesa's lavapipe on CI); skips without one unless
//! `CACHALOT_REQUIRE_GPU` is set.

mod common;

use cachalot_core::StreamId;
use cachalot_shaders::cpu::{self, elementwise_relative_error};
use cachalot_shaders::ops::{
    Activation, ActivationBackward, ActivationForward, AdamStep, CrossEntropy, Matmul, Mse, SgdStep, SumRows,
};
use cachalot_shaders::wgsl::MatmulTile;
use cachalot_shaders::{Adam, MatmulShape, Sgd};
use cachalot_wgpu::{KernelError, Kernels, WgpuConfig};
use common::{assert_close, poisoned, read, upload};

/// Products in every layout, with and without bias and accumulation, on both tiles: sizes
/// below, at and past a tile, odd ones (the element-by-element path) and one 512³.
#[test]
fn matmul_matches_cpu_in_every_layout() {
    let Some(context) = common::context() else { return };
    let mut allocator = common::allocator(&context);
    let mut rng = common::rng();
    let shapes = [
        (1, 1, 1),
        (7, 5, 3),
        (64, 64, 64),
        (65, 33, 17),
        (128, 128, 128),
        (129, 127, 255),
        (100, 260, 36),
        (512, 512, 512),
    ];
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        for (trans_a, trans_b) in [(false, false), (false, true), (true, false)] {
            let shape = MatmulShape { m, n, k, trans_a, trans_b };
            // Alternate the tile so both run at every kind of size; the big one uses the default pick.
            let tile = match (i + trans_a as usize + 2 * trans_b as usize) % 3 {
                0 => Some(MatmulTile::LARGE),
                1 => Some(MatmulTile::SMALL),
                _ => None,
            };
            let kernels = Kernels::new(context.clone()).with_matmul_tile(if m == 512 { None } else { tile });
            let (ea, eb, ec) = shape.elements();
            let a_host = rng.vec(ea as usize, -1.0, 1.0);
            let b_host = rng.vec(eb as usize, -1.0, 1.0);
            let c_host = rng.vec(ec as usize, -1.0, 1.0);
            let bias_host = rng.vec(n as usize, -1.0, 1.0);
            let (with_bias, beta) = match i % 3 {
                0 => (false, 0.0),
                1 => (true, 0.0),
                _ => (true, 1.0),
            };
            let a = upload(&kernels, &mut allocator, &a_host);
            let b = upload(&kernels, &mut allocator, &b_host);
            let c = if beta == 0.0 {
                poisoned(&kernels, &mut allocator, ec as usize)
            } else {
                upload(&kernels, &mut allocator, &c_host)
            };
            let bias = upload(&kernels, &mut allocator, &bias_host);
            let mut batch = kernels.batch(&mut allocator);
            batch.matmul(Matmul { a: &a, b: &b, c: &c, shape, beta, bias: with_bias.then_some(&bias) }).unwrap();
            batch.submit().unwrap();
            let got = read(&kernels, &mut allocator, &c, ec as usize);
            let mut want = c_host.clone();
            cpu::matmul(&a_host, &b_host, &mut want, shape, beta, with_bias.then_some(&bias_host[..]));
            assert_close(&format!("{shape:?} beta {beta} bias {with_bias} tile {tile:?}"), &got, &want);
            for x in [a, b, c, bias] {
                allocator.free(x).unwrap();
            }
        }
    }
}

/// `nn.Linear` forward and backward (input, weight and bias gradients, overwrite and
/// accumulate) through the matmul variants and the column sum.
#[test]
fn linear_forward_and_backward_match_cpu() {
    let Some(context) = common::context() else { return };
    let kernels = Kernels::new(context.clone());
    let mut allocator = common::allocator(&context);
    let mut rng = common::rng();
    for (batch_size, inputs, outputs) in [(1, 1, 1), (33, 70, 45), (64, 128, 10), (130, 3, 257)] {
        let (b, i, o) = (batch_size as usize, inputs as usize, outputs as usize);
        let x_host = rng.vec(b * i, -1.0, 1.0);
        let w_host = rng.vec(o * i, -0.5, 0.5);
        let bias_host = rng.vec(o, -0.5, 0.5);
        let dy_host = rng.vec(b * o, -1.0, 1.0);
        let old_dw = rng.vec(o * i, -1.0, 1.0);
        let old_db = rng.vec(o, -1.0, 1.0);
        let x = upload(&kernels, &mut allocator, &x_host);
        let w = upload(&kernels, &mut allocator, &w_host);
        let bias = upload(&kernels, &mut allocator, &bias_host);
        let dy = upload(&kernels, &mut allocator, &dy_host);
        let y = poisoned(&kernels, &mut allocator, b * o);
        let dx = poisoned(&kernels, &mut allocator, b * i);
        let dw = poisoned(&kernels, &mut allocator, o * i);
        let db = poisoned(&kernels, &mut allocator, o);
        let dw_acc = upload(&kernels, &mut allocator, &old_dw);
        let db_acc = upload(&kernels, &mut allocator, &old_db);

        let mut batch = kernels.batch(&mut allocator);
        batch.linear_forward(&x, &w, Some(&bias), &y, batch_size, inputs, outputs).unwrap();
        batch.linear_backward(&x, &w, &dy, Some(&dx), &dw, Some(&db), batch_size, inputs, outputs, false).unwrap();
        batch.linear_backward(&x, &w, &dy, None, &dw_acc, Some(&db_acc), batch_size, inputs, outputs, true).unwrap();
        batch.submit().unwrap();

        let mut y_want = vec![0.0; b * o];
        cpu::linear_forward(&x_host, &w_host, Some(&bias_host), &mut y_want, batch_size, inputs, outputs);
        let (mut dx_want, mut dw_want, mut db_want) = (vec![0.0; b * i], vec![0.0; o * i], vec![0.0; o]);
        cpu::linear_backward(
            &x_host,
            &w_host,
            &dy_host,
            &mut dx_want,
            &mut dw_want,
            Some(&mut db_want),
            batch_size,
            inputs,
            outputs,
        );
        let shape = format!("linear {batch_size}x{inputs}->{outputs}");
        assert_close(&format!("{shape} y"), &read(&kernels, &mut allocator, &y, b * o), &y_want);
        assert_close(&format!("{shape} dx"), &read(&kernels, &mut allocator, &dx, b * i), &dx_want);
        assert_close(&format!("{shape} dw"), &read(&kernels, &mut allocator, &dw, o * i), &dw_want);
        assert_close(&format!("{shape} db"), &read(&kernels, &mut allocator, &db, o), &db_want);
        let dw_acc_want: Vec<f32> = old_dw.iter().zip(&dw_want).map(|(a, b)| a + b).collect();
        let db_acc_want: Vec<f32> = old_db.iter().zip(&db_want).map(|(a, b)| a + b).collect();
        assert_close(&format!("{shape} dw accumulated"), &read(&kernels, &mut allocator, &dw_acc, o * i), &dw_acc_want);
        assert_close(&format!("{shape} db accumulated"), &read(&kernels, &mut allocator, &db_acc, o), &db_acc_want);
        for a in [x, w, bias, dy, y, dx, dw, db, dw_acc, db_acc] {
            allocator.free(a).unwrap();
        }
    }
}

/// ReLU and GELU forward and backward, element by element (GELU over its tails too).
#[test]
fn activations_match_cpu() {
    let Some(context) = common::context() else { return };
    let kernels = Kernels::new(context.clone());
    let mut allocator = common::allocator(&context);
    let mut rng = common::rng();
    for n in [1usize, 255, 1000, 70_001] {
        let x_host = rng.vec(n, -8.0, 8.0);
        let dy_host = rng.vec(n, -1.0, 1.0);
        let x = upload(&kernels, &mut allocator, &x_host);
        let dy = upload(&kernels, &mut allocator, &dy_host);
        let outputs: Vec<_> = (0..4).map(|_| poisoned(&kernels, &mut allocator, n)).collect();
        let mut batch = kernels.batch(&mut allocator);
        let count = n as u64;
        for (act, y, dx) in [(Activation::Relu, &outputs[0], &outputs[1]), (Activation::Gelu, &outputs[2], &outputs[3])]
        {
            batch.activation(ActivationForward { act, x: &x, y, n: count }).unwrap();
            batch.activation_backward(ActivationBackward { act, x: &x, dy: &dy, dx, n: count }).unwrap();
        }
        batch.submit().unwrap();
        let mut want = vec![vec![0.0; n]; 4];
        cpu::relu_forward(&x_host, &mut want[0]);
        cpu::relu_backward(&x_host, &dy_host, &mut want[1]);
        cpu::gelu_forward(&x_host, &mut want[2]);
        cpu::gelu_backward(&x_host, &dy_host, &mut want[3]);
        for (name, (output, want)) in ["relu", "relu backward", "gelu"].iter().zip(outputs.iter().zip(&want)) {
            let got = read(&kernels, &mut allocator, output, n);
            // Element-wise relative error; the floor covers GELU's far tail (|y| < 1e-12).
            let error = elementwise_relative_error(&got, want, 1e-12);
            assert!(error < 1e-4, "{name} over {n}: relative error {error:e}");
        }
        // GELU's derivative Phi(x) + x phi(x) crosses zero near x = -0.75, where its two
        // terms cancel: measure each element against the size of its terms instead.
        let got = read(&kernels, &mut allocator, &outputs[3], n);
        for i in 0..n {
            let x = x_host[i] as f64;
            let terms = cpu::normal_cdf(x) + x.abs() * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            let scale = dy_host[i].abs() as f64 * terms;
            let error = (got[i] as f64 - want[3][i] as f64).abs();
            assert!(error <= 1e-4 * scale + 1e-30, "gelu backward at x = {x}: got {}, want {}", got[i], want[3][i]);
        }
        for a in outputs.into_iter().chain([x, dy]) {
            allocator.free(a).unwrap();
        }
    }
}

/// Fill, copy, bias add and column sums.
#[test]
fn fill_copy_and_bias_kernels_match_cpu() {
    let Some(context) = common::context() else { return };
    let kernels = Kernels::new(context.clone());
    let mut allocator = common::allocator(&context);
    let mut rng = common::rng();
    for (rows, cols) in [(1u32, 1u32), (3, 7), (100, 257), (1000, 33)] {
        let n = (rows * cols) as usize;
        let x_host = rng.vec(n, -1.0, 1.0);
        let bias_host = rng.vec(cols as usize, -1.0, 1.0);
        let old_sums = rng.vec(cols as usize, -1.0, 1.0);
        let value = rng.uniform(-5.0, 5.0);
        let x = upload(&kernels, &mut allocator, &x_host);
        let bias = upload(&kernels, &mut allocator, &bias_host);
        let filled = poisoned(&kernels, &mut allocator, n);
        let copied = poisoned(&kernels, &mut allocator, n);
        let sums = poisoned(&kernels, &mut allocator, cols as usize);
        let sums_acc = upload(&kernels, &mut allocator, &old_sums);
        let mut batch = kernels.batch(&mut allocator);
        batch.fill(&filled, n as u64, value).unwrap();
        batch.copy(&x, &copied, n as u64).unwrap();
        batch.sum_rows(SumRows { x: &x, out: &sums, rows, cols, accumulate: false }).unwrap();
        batch.sum_rows(SumRows { x: &x, out: &sums_acc, rows, cols, accumulate: true }).unwrap();
        batch.add_bias(&x, &bias, rows, cols).unwrap(); // in place, after the reads above
        batch.submit().unwrap();

        let mut want_fill = vec![0.0; n];
        cpu::fill(&mut want_fill, value);
        let mut want_sums = vec![0.0; cols as usize];
        cpu::sum_rows(&x_host, &mut want_sums, rows, cols, false);
        let mut want_acc = old_sums.clone();
        cpu::sum_rows(&x_host, &mut want_acc, rows, cols, true);
        let mut want_biased = x_host.clone();
        cpu::add_bias(&mut want_biased, &bias_host);
        assert_eq!(read(&kernels, &mut allocator, &filled, n), want_fill);
        assert_eq!(read(&kernels, &mut allocator, &copied, n), x_host);
        assert_close("sum_rows", &read(&kernels, &mut allocator, &sums, cols as usize), &want_sums);
        assert_close("sum_rows accumulated", &read(&kernels, &mut allocator, &sums_acc, cols as usize), &want_acc);
        assert_close("add_bias", &read(&kernels, &mut allocator, &x, n), &want_biased);
        for a in [x, bias, filled, copied, sums, sums_acc] {
            allocator.free(a).unwrap();
        }
    }
}

/// MSE loss and gradient; softmax cross-entropy loss and gradient, with a NaN for a target
/// out of range.
#[test]
fn losses_match_cpu() {
    let Some(context) = common::context() else { return };
    let kernels = Kernels::new(context.clone());
    let mut allocator = common::allocator(&context);
    let mut rng = common::rng();
    for n in [1usize, 1000, 100_003] {
        let pred_host = rng.vec(n, -2.0, 2.0);
        let target_host = rng.vec(n, -2.0, 2.0);
        let pred = upload(&kernels, &mut allocator, &pred_host);
        let target = upload(&kernels, &mut allocator, &target_host);
        let loss = poisoned(&kernels, &mut allocator, 1);
        let grad = poisoned(&kernels, &mut allocator, n);
        let mut batch = kernels.batch(&mut allocator);
        batch.mse(Mse { pred: &pred, target: &target, loss: &loss, grad: Some(&grad), n: n as u64 }).unwrap();
        batch.submit().unwrap();
        let want_loss = cpu::mse_loss(&pred_host, &target_host);
        let mut want_grad = vec![0.0; n];
        cpu::mse_grad(&pred_host, &target_host, &mut want_grad, 2.0 / n as f32);
        assert_close(&format!("mse over {n}"), &read(&kernels, &mut allocator, &loss, 1), &[want_loss]);
        assert_close(&format!("mse grad over {n}"), &read(&kernels, &mut allocator, &grad, n), &want_grad);
        for a in [pred, target, loss, grad] {
            allocator.free(a).unwrap();
        }
    }

    for (rows, cols) in [(1u32, 1u32), (5, 10), (3, 300), (64, 1000), (300, 7)] {
        let n = (rows * cols) as usize;
        let logits_host = rng.vec(n, -5.0, 5.0);
        let mut targets_host: Vec<u32> = (0..rows).map(|_| rng.below(cols)).collect();
        let logits = upload(&kernels, &mut allocator, &logits_host);
        let targets = allocator.malloc(rows as u64 * 4, StreamId::DEFAULT).unwrap();
        let loss = poisoned(&kernels, &mut allocator, 1);
        let grad = poisoned(&kernels, &mut allocator, n);
        let mut batch = kernels.batch(&mut allocator);
        batch.upload_u32(&targets, &targets_host).unwrap();
        batch
            .cross_entropy(CrossEntropy { logits: &logits, targets: &targets, loss: &loss, grad: &grad, rows, cols })
            .unwrap();
        batch.submit().unwrap();
        let mut want_grad = vec![0.0; n];
        let want_loss = cpu::cross_entropy(&logits_host, &targets_host, &mut want_grad, rows, cols, 1.0 / rows as f32);
        let shape = format!("cross-entropy {rows}x{cols}");
        assert_close(&shape, &read(&kernels, &mut allocator, &loss, 1), &[want_loss]);
        assert_close(&format!("{shape} grad"), &read(&kernels, &mut allocator, &grad, n), &want_grad);

        // A class index out of range poisons the loss, as PyTorch's error would stop it.
        targets_host[0] = cols;
        let mut batch = kernels.batch(&mut allocator);
        batch.upload_u32(&targets, &targets_host).unwrap();
        batch
            .cross_entropy(CrossEntropy { logits: &logits, targets: &targets, loss: &loss, grad: &grad, rows, cols })
            .unwrap();
        batch.submit().unwrap();
        assert!(read(&kernels, &mut allocator, &loss, 1)[0].is_nan(), "{shape}: a bad target must give NaN");
        for a in [logits, targets, loss, grad] {
            allocator.free(a).unwrap();
        }
    }
}

/// SGD (plain, momentum, Nesterov, weight decay) and Adam over several steps.
#[test]
fn optimiser_steps_match_cpu() {
    let Some(context) = common::context() else { return };
    let kernels = Kernels::new(context.clone());
    let mut allocator = common::allocator(&context);
    let mut rng = common::rng();
    let sgds = [
        Sgd::new(0.1),
        Sgd { lr: 0.05, momentum: 0.9, dampening: 0.1, weight_decay: 0.01, nesterov: false },
        Sgd { lr: 0.05, momentum: 0.9, dampening: 0.0, weight_decay: 0.0, nesterov: true },
    ];
    for n in [1usize, 1000, 65_537] {
        for sgd in sgds {
            let mut param_host = rng.vec(n, -1.0, 1.0);
            let mut buf_host = vec![0.0; n];
            let param = upload(&kernels, &mut allocator, &param_host);
            let buf = poisoned(&kernels, &mut allocator, n);
            for step in 0..3 {
                let grad_host = rng.vec(n, -1.0, 1.0);
                let grad = upload(&kernels, &mut allocator, &grad_host);
                let mut batch = kernels.batch(&mut allocator);
                let momentum = (sgd.momentum != 0.0).then_some(&buf);
                batch
                    .sgd_step(SgdStep { param: &param, grad: &grad, momentum, n: n as u64, sgd, first_step: step == 0 })
                    .unwrap();
                batch.submit().unwrap();
                allocator.free(grad).unwrap();
                cpu::sgd_step(&mut param_host, &grad_host, &mut buf_host, sgd, step == 0);
            }
            assert_close(&format!("{sgd:?} over {n}"), &read(&kernels, &mut allocator, &param, n), &param_host);
            allocator.free(param).unwrap();
            allocator.free(buf).unwrap();
        }

        let adam = Adam { lr: 0.01, weight_decay: 0.001, ..Adam::default() };
        let mut param_host = rng.vec(n, -1.0, 1.0);
        let (mut m_host, mut v_host) = (vec![0.0; n], vec![0.0; n]);
        let param = upload(&kernels, &mut allocator, &param_host);
        let m = upload(&kernels, &mut allocator, &m_host);
        let v = upload(&kernels, &mut allocator, &v_host);
        for step in 1..=3 {
            let grad_host = rng.vec(n, -1.0, 1.0);
            let grad = upload(&kernels, &mut allocator, &grad_host);
            let mut batch = kernels.batch(&mut allocator);
            batch
                .adam_step(AdamStep {
                    param: &param,
                    grad: &grad,
                    exp_avg: &m,
                    exp_avg_sq: &v,
                    n: n as u64,
                    adam,
                    step,
                })
                .unwrap();
            batch.submit().unwrap();
            allocator.free(grad).unwrap();
            cpu::adam_step(&mut param_host, &grad_host, &mut m_host, &mut v_host, adam, step);
        }
        assert_close(&format!("adam over {n}"), &read(&kernels, &mut allocator, &param, n), &param_host);
        assert_close(&format!("adam exp_avg over {n}"), &read(&kernels, &mut allocator, &m, n), &m_host);
        assert_close(&format!("adam exp_avg_sq over {n}"), &read(&kernels, &mut allocator, &v, n), &v_host);
        for a in [param, m, v] {
            allocator.free(a).unwrap();
        }
    }
}

/// A device whose bindings hold 4 KiB: element-wise kernels and the column sum split larger
/// tensors into chunks (offsets stay aligned, `add_bias` keeps its column phase), while the
/// matmul, which cannot, fails with an error that names the limit.
#[test]
fn large_tensors_run_in_chunks_or_name_the_binding_limit() {
    let Some(probe) = common::context() else { return };
    let mut limits = probe.limits().clone();
    limits.max_storage_buffer_binding_size = 4096;
    let Some(context) = common::context_with(WgpuConfig { limits: Some(limits), ..WgpuConfig::default() }) else {
        return;
    };
    let kernels = Kernels::new(context.clone());
    let mut allocator = common::allocator(&context);
    let mut rng = common::rng();
    let (rows, cols) = (100u32, 37u32); // 3,700 elements: 14,800 bytes, four chunks
    let n = (rows * cols) as usize;
    let x_host = rng.vec(n, -3.0, 3.0);
    let bias_host = rng.vec(cols as usize, -1.0, 1.0);
    let x = upload(&kernels, &mut allocator, &x_host);
    let bias = upload(&kernels, &mut allocator, &bias_host);
    let y = poisoned(&kernels, &mut allocator, n);
    let mut batch = kernels.batch(&mut allocator);
    batch.activation(ActivationForward { act: Activation::Gelu, x: &x, y: &y, n: n as u64 }).unwrap();
    batch.add_bias(&y, &bias, rows, cols).unwrap();
    batch.submit().unwrap();
    let mut want = vec![0.0; n];
    cpu::gelu_forward(&x_host, &mut want);
    cpu::add_bias(&mut want, &bias_host);
    assert_close("chunked gelu + add_bias", &read(&kernels, &mut allocator, &y, n), &want);

    // The column sums of x (14,800 bytes) in chunks of whole rows, added up in `out`.
    let sums = poisoned(&kernels, &mut allocator, cols as usize);
    let mut batch = kernels.batch(&mut allocator);
    batch.sum_rows(SumRows { x: &x, out: &sums, rows, cols, accumulate: false }).unwrap();
    batch.submit().unwrap();
    let mut want_sums = vec![0.0; cols as usize];
    cpu::sum_rows(&x_host, &mut want_sums, rows, cols, false);
    assert_close("chunked sum_rows", &read(&kernels, &mut allocator, &sums, cols as usize), &want_sums);
    allocator.free(sums).unwrap();

    let mut batch = kernels.batch(&mut allocator);
    let error = batch.matmul(Matmul::new(&x, &x, &y, MatmulShape::nn(rows, rows, cols))).unwrap_err();
    assert!(matches!(error, KernelError::BindingTooLarge { limit: 4096, .. }), "{error:?}");
    assert!(error.to_string().contains("max_storage_buffer_binding_size"), "{error}");
    drop(batch);
    for a in [x, bias, y] {
        allocator.free(a).unwrap();
    }
}
