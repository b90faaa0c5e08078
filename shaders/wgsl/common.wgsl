// Shared by the element-wise, loss and optimiser kernels (the runner prepends it).
//
// Every storage binding is read_write: wgpu rejects one buffer bound read-only and read-write
// in the same dispatch even for disjoint ranges, and the operands are blocks of shared
// segments. Unused bindings of an entry point are bound to any valid range by the runner.

struct Params {
    // Elements in this dispatch (a chunk of the tensor when it exceeds a binding).
    n: u32,
    rows: u32,
    cols: u32,
    // Index of this chunk's first element in the whole tensor.
    base: u32,
    f0: vec4<f32>,
    f1: vec4<f32>,
}

const WG: u32 = 256u;

// Flat element index of an invocation of a 2-D grid of 1-D workgroups (a grid dimension is
// limited to 65,535 workgroups).
fn flat_index(wg: vec3<u32>, groups: vec3<u32>, lid: vec3<u32>) -> u32 {
    return (wg.y * groups.x + wg.x) * WG + lid.x;
}

// Complementary error function for z >= 0 with a relative error below 1.2e-7 everywhere
// (Numerical Recipes' erfcc, a Chebyshev fit), so the Gaussian tails keep their precision.
fn erfc_pos(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
        + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    return t * exp(-z * z + poly);
}

// Standard normal CDF.
fn phi(x: f32) -> f32 {
    let z = abs(x) * 0.70710678118654752;
    let tail = 0.5 * erfc_pos(z);
    return select(tail, 1.0 - tail, x >= 0.0);
}
