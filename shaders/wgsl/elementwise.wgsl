// Element-wise kernels over f32 tensors (flat, row-major). `common.wgsl` is prepended.
//
// | entry point   | x         | y          | z          | params                         |
// |---------------|-----------|------------|------------|--------------------------------|
// | fill          | out       | -          | -          | f0.x = value                   |
// | copy          | in        | out        | -          |                                |
// | relu_forward  | in        | out        | -          |                                |
// | relu_backward | input     | grad out   | grad in    |                                |
// | gelu_forward  | in        | out        | -          |                                |
// | gelu_backward | input     | grad out   | grad in    |                                |
// | add_bias      | [rows, cols] in place | bias [cols] | - | cols, base                |
// | sum_rows      | [rows, cols] in | out [cols] (+= with f0.x = 1) | - | rows, cols       |
//
// GELU is PyTorch's exact form x * Phi(x) (approximate='none').

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> z: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn fill(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_index(wg, groups, lid);
    if (i < p.n) {
        x[i] = p.f0.x;
    }
}

@compute @workgroup_size(WG)
fn copy(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_index(wg, groups, lid);
    if (i < p.n) {
        y[i] = x[i];
    }
}

@compute @workgroup_size(WG)
fn relu_forward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_index(wg, groups, lid);
    if (i < p.n) {
        y[i] = max(x[i], 0.0);
    }
}

@compute @workgroup_size(WG)
fn relu_backward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                 @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_index(wg, groups, lid);
    if (i < p.n) {
        // PyTorch's threshold_backward: the gradient passes where the input is > 0.
        z[i] = select(0.0, y[i], x[i] > 0.0);
    }
}

@compute @workgroup_size(WG)
fn gelu_forward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_index(wg, groups, lid);
    if (i < p.n) {
        let v = x[i];
        y[i] = v * phi(v);
    }
}

@compute @workgroup_size(WG)
fn gelu_backward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                 @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_index(wg, groups, lid);
    if (i < p.n) {
        let v = x[i];
        // d/dx x Phi(x) = Phi(x) + x phi(x), phi the normal density.
        let density = 0.39894228040143268 * exp(-0.5 * v * v);
        z[i] = y[i] * (phi(v) + v * density);
    }
}

@compute @workgroup_size(WG)
fn add_bias(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = flat_index(wg, groups, lid);
    if (i < p.n) {
        x[i] = x[i] + y[(p.base + i) % p.cols];
    }
}

// Column sums of a [rows, cols] matrix (the bias gradient of a linear layer): one invocation
// per column walks the rows, so neighbouring invocations read neighbouring addresses and the
// sum has the same order on every run.
@compute @workgroup_size(WG)
fn sum_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
            @builtin(local_invocation_id) lid: vec3<u32>) {
    let j = flat_index(wg, groups, lid);
    if (j < p.cols) {
        var acc = 0.0;
        for (var r = 0u; r < p.rows; r = r + 1u) {
            acc = acc + x[r * p.cols + j];
        }
        if (p.f0.x != 0.0) {
            acc = acc + y[j];
        }
        y[j] = acc;
    }
}
