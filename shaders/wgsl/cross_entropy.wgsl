// Softmax cross-entropy over class indices, PyTorch's cross_entropy(reduction='mean').
// `common.wgsl` is prepended.
//
// xent_rows: one workgroup per row b of logits [rows, cols]:
//     row_loss[b] = logsumexp(logits[b, :]) - logits[b, targets[b]]
//     grad[b, j]  = f0.x * (softmax(logits[b, :])[j] - (j == targets[b]))
//   with f0.x = 1 / rows (times the incoming gradient of the loss). A target outside
//   [0, cols) gives a NaN row loss (PyTorch raises; a kernel cannot).
// xent_mean: loss[0] = f0.x * sum_b row_loss[b], one workgroup.

@group(0) @binding(0) var<storage, read_write> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> targets: array<u32>;
@group(0) @binding(2) var<storage, read_write> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> row_loss: array<f32>;
@group(0) @binding(4) var<storage, read_write> loss: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

var<workgroup> partial: array<f32, WG>;

fn reduce_max(lid: u32, value: f32) -> f32 {
    partial[lid] = value;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            partial[lid] = max(partial[lid], partial[lid + stride]);
        }
        workgroupBarrier();
    }
    let result = partial[0];
    // Everyone has read the result before the array is used again.
    workgroupBarrier();
    return result;
}

fn reduce_sum(lid: u32, value: f32) -> f32 {
    partial[lid] = value;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            partial[lid] = partial[lid] + partial[lid + stride];
        }
        workgroupBarrier();
    }
    let result = partial[0];
    workgroupBarrier();
    return result;
}

@compute @workgroup_size(WG)
fn xent_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
             @builtin(local_invocation_id) lid: vec3<u32>) {
    // Workgroup-uniform row index; rows past the end still take part in the barriers.
    let row = wg.y * groups.x + wg.x;
    let valid = row < p.rows;
    let base = row * p.cols;

    var m = -3.402823e38;
    if (valid) {
        for (var j = lid.x; j < p.cols; j = j + WG) {
            m = max(m, logits[base + j]);
        }
    }
    m = reduce_max(lid.x, m);

    var s = 0.0;
    if (valid) {
        for (var j = lid.x; j < p.cols; j = j + WG) {
            s = s + exp(logits[base + j] - m);
        }
    }
    s = reduce_sum(lid.x, s);

    if (valid) {
        let t = targets[row];
        let inv = 1.0 / s;
        for (var j = lid.x; j < p.cols; j = j + WG) {
            let prob = exp(logits[base + j] - m) * inv;
            grad[base + j] = p.f0.x * (prob - select(0.0, 1.0, j == t));
        }
        if (lid.x == 0u) {
            if (t < p.cols) {
                row_loss[row] = log(s) + m - logits[base + t];
            } else {
                // A quiet NaN from a run-time value: as a constant expression, WGSL compilers
                // that follow the spec (Chromium's Tint) reject a NaN outright.
                row_loss[row] = bitcast<f32>(0x7fc00000u | (t & 0u));
            }
        }
    }
}

@compute @workgroup_size(WG)
fn xent_mean(@builtin(local_invocation_id) lid: vec3<u32>) {
    var acc = 0.0;
    for (var i = lid.x; i < p.rows; i = i + WG) {
        acc = acc + row_loss[i];
    }
    let total = reduce_sum(lid.x, acc);
    if (lid.x == 0u) {
        loss[0] = total * p.f0.x;
    }
}
