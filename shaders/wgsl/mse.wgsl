// Mean squared error, PyTorch's mse_loss(reduction='mean'). `common.wgsl` is prepended.
//
// mse_loss: loss[0] = f0.x * sum_i (pred[i] - expected[i])^2, with f0.x = 1 / n. One
//           workgroup: each invocation sums a strided slice, then a tree in shared memory.
// mse_grad: grad[i] = f0.x * (pred[i] - expected[i]), with f0.x = 2 / n (times the incoming
//           gradient of the loss); element-wise, any number of workgroups.

@group(0) @binding(0) var<storage, read_write> pred: array<f32>;
@group(0) @binding(1) var<storage, read_write> expected: array<f32>;
@group(0) @binding(2) var<storage, read_write> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> loss: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn mse_loss(@builtin(local_invocation_id) lid: vec3<u32>) {
    var acc = 0.0;
    for (var i = lid.x; i < p.n; i = i + WG) {
        let d = pred[i] - expected[i];
        acc = fma(d, d, acc);
    }
    partial[lid.x] = acc;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid.x < stride) {
            partial[lid.x] = partial[lid.x] + partial[lid.x + stride];
        }
        workgroupBarrier();
    }
    if (lid.x == 0u) {
        loss[0] = partial[0] * p.f0.x;
    }
}

@compute @workgroup_size(WG)
fn mse_grad(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_index(wg, groups, lid);
    if (i < p.n) {
        grad[i] = p.f0.x * (pred[i] - expected[i]);
    }
}
