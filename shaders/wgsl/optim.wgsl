// Optimiser steps, element-wise over a parameter tensor, as PyTorch's single-tensor
// (foreach=False) torch.optim implementations. `common.wgsl` is prepended.
//
// sgd_step (torch.optim.SGD, maximize=False):
//     g = grad + weight_decay * param
//     if momentum != 0: buf = g on the first step, else momentum * buf + (1 - dampening) * g;
//                       g = nesterov ? g + momentum * buf : buf
//     param -= lr * g
//   f0 = (lr, momentum, dampening, weight_decay); f1.x = 1 on the first step, f1.y = 1 for
//   nesterov. exp_avg is the momentum buffer (unused without momentum).
//
// adam_step (torch.optim.Adam, amsgrad=False, maximize=False), step t counted from 1:
//     g = grad + weight_decay * param
//     exp_avg    = exp_avg + (1 - beta1) * (g - exp_avg)       (torch's lerp)
//     exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g
//     param     -= step_size * exp_avg / (sqrt(exp_avg_sq) / sqrt_bc2 + eps)
//   with step_size = lr / (1 - beta1^t) and sqrt_bc2 = sqrt(1 - beta2^t) computed on the host
//   in f64. f0 = (step_size, beta1, beta2, eps); f1 = (weight_decay, sqrt_bc2).

@group(0) @binding(0) var<storage, read_write> param: array<f32>;
@group(0) @binding(1) var<storage, read_write> grad: array<f32>;
@group(0) @binding(2) var<storage, read_write> exp_avg: array<f32>;
@group(0) @binding(3) var<storage, read_write> exp_avg_sq: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

// The gradient with L2 weight decay added, as torch.optim adds it before the update.
fn decayed_grad(i: u32, weight_decay: f32) -> f32 {
    if (weight_decay != 0.0) {
        return grad[i] + weight_decay * param[i];
    }
    return grad[i];
}

@compute @workgroup_size(WG)
fn sgd_step(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_index(wg, groups, lid);
    if (i >= p.n) {
        return;
    }
    let lr = p.f0.x;
    let momentum = p.f0.y;
    let dampening = p.f0.z;
    let weight_decay = p.f0.w;
    var g = decayed_grad(i, weight_decay);
    if (momentum != 0.0) {
        var buf = g;
        if (p.f1.x == 0.0) {
            buf = momentum * exp_avg[i] + (1.0 - dampening) * g;
        }
        exp_avg[i] = buf;
        if (p.f1.y != 0.0) {
            g = g + momentum * buf;
        } else {
            g = buf;
        }
    }
    param[i] = param[i] - lr * g;
}

@compute @workgroup_size(WG)
fn adam_step(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
             @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_index(wg, groups, lid);
    if (i >= p.n) {
        return;
    }
    let step_size = p.f0.x;
    let beta1 = p.f0.y;
    let beta2 = p.f0.z;
    let eps = p.f0.w;
    let weight_decay = p.f1.x;
    let sqrt_bc2 = p.f1.y;
    var g = decayed_grad(i, weight_decay);
    let m = exp_avg[i] + (1.0 - beta1) * (g - exp_avg[i]);
    let v = beta2 * exp_avg_sq[i] + (1.0 - beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = param[i] - step_size * m / (sqrt(v) / sqrt_bc2 + eps);
}
