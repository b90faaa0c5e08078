// Tiled, vectorised f32 matrix product with an optional bias and accumulation:
//
//     C[m, n] = sum_k op(A)[m, k] * op(B)[k, n]  (+ beta * C[m, n])  (+ bias[n])
//
// op(A) is A ([M, K] row-major) or, with TRANS_A, the transpose of A stored as [K, M];
// op(B) is B ([K, N] row-major) or, with TRANS_B, the transpose of B stored as [N, K].
// The linear layer uses NT for its forward pass (x · Wᵀ + b), NN for the input gradient
// (dy · W) and TN for the weight gradient (dyᵀ · x).
//
// The runner prepends the tile shape as constants:
//     const BM: u32;  // rows of C per workgroup (multiple of 16)
//     const BN: u32;  // columns of C per workgroup (multiple of 16)
//     const BK: u32;  // depth of one shared-memory tile (multiple of 4)
// Each invocation computes an 8 x 8 register block of C, as two 4-row groups BM/2 apart and
// two 4-column groups BN/2 apart, so that neighbouring invocations read neighbouring vec4s of
// shared memory. Shared memory is double-buffered: the next tile is fetched from global
// memory into registers while the current one is multiplied, so one barrier per tile suffices.
//
// Every binding is read_write: wgpu rejects one buffer bound read-only and read-write in the
// same dispatch even for disjoint ranges, and A, B and C are often blocks of one segment.
// Operands are declared as vec4 arrays; with VEC the vectorised axis of every operand has a
// multiple of 4 elements and tiles move as whole vec4s, otherwise element by element.

override TRANS_A: bool = false;
override TRANS_B: bool = false;
override HAS_BIAS: bool = false;
override VEC: bool = true;

struct Params {
    m: u32,
    n: u32,
    k: u32,
    // Scale of the existing C (0: overwrite, 1: accumulate, e.g. into a gradient).
    beta: f32,
}

@group(0) @binding(0) var<storage, read_write> a: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> b: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> c: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> bias: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> p: Params;

const WG_X: u32 = BN / 8u;
const WG_Y: u32 = BM / 8u;
const THREADS: u32 = WG_X * WG_Y;
// Row strides of the shared tiles in vec4s. One vec4 of padding when the tile is stored
// transposed (element by element), so the four scalar stores of one invocation and those of
// its neighbours fall in different banks.
const A_STRIDE: u32 = BM / 4u + 1u;
const B_STRIDE: u32 = BN / 4u + 1u;
const A_TILE: u32 = BK * A_STRIDE;
const B_TILE: u32 = BK * B_STRIDE;
// vec4s of one global tile, and how many each invocation moves.
const A_VECS: u32 = BM * BK / 4u;
const B_VECS: u32 = BN * BK / 4u;
const A_PER_THREAD: u32 = (A_VECS + THREADS - 1u) / THREADS;
const B_PER_THREAD: u32 = (B_VECS + THREADS - 1u) / THREADS;

var<workgroup> a_tile: array<vec4<f32>, 2u * A_TILE>;
var<workgroup> b_tile: array<vec4<f32>, 2u * B_TILE>;

// Element (row, col) of a [rows, cols] row-major operand as one f32 (bounds-checked).
fn a_elem(row: u32, col: u32, rows: u32, cols: u32) -> f32 {
    if (row < rows && col < cols) {
        let i = row * cols + col;
        return a[i >> 2u][i & 3u];
    }
    return 0.0;
}

fn b_elem(row: u32, col: u32, rows: u32, cols: u32) -> f32 {
    if (row < rows && col < cols) {
        let i = row * cols + col;
        return b[i >> 2u][i & 3u];
    }
    return 0.0;
}

// Four consecutive elements (row, col..col+4) of the stored A / B, zero outside.
fn a_vec(row: u32, col: u32, rows: u32, cols: u32) -> vec4<f32> {
    if (VEC) {
        if (row < rows && col < cols) {
            return a[(row * cols + col) >> 2u];
        }
        return vec4<f32>(0.0);
    }
    return vec4<f32>(a_elem(row, col, rows, cols), a_elem(row, col + 1u, rows, cols),
                     a_elem(row, col + 2u, rows, cols), a_elem(row, col + 3u, rows, cols));
}

fn b_vec(row: u32, col: u32, rows: u32, cols: u32) -> vec4<f32> {
    if (VEC) {
        if (row < rows && col < cols) {
            return b[(row * cols + col) >> 2u];
        }
        return vec4<f32>(0.0);
    }
    return vec4<f32>(b_elem(row, col, rows, cols), b_elem(row, col + 1u, rows, cols),
                     b_elem(row, col + 2u, rows, cols), b_elem(row, col + 3u, rows, cols));
}

// Where the v-th vec4 of a tile stored with `row_vecs` vec4s a row starts: (row, column).
fn tile_at(v: u32, row_vecs: u32) -> vec2<u32> {
    return vec2<u32>(v / row_vecs, (v % row_vecs) * 4u);
}

// Fetches the j-th vec4 this invocation moves of the A tile starting at depth k0.
fn fetch_a(v: u32, m0: u32, k0: u32) -> vec4<f32> {
    if (TRANS_A) {
        // Stored [K, M]: the tile is BK rows of BM/4 vec4s along M.
        let at = tile_at(v, BM / 4u);
        return a_vec(k0 + at.x, m0 + at.y, p.k, p.m);
    }
    // Stored [M, K]: BM rows of BK/4 vec4s along K.
    let at = tile_at(v, BK / 4u);
    return a_vec(m0 + at.x, k0 + at.y, p.m, p.k);
}

fn fetch_b(v: u32, n0: u32, k0: u32) -> vec4<f32> {
    if (TRANS_B) {
        // Stored [N, K]: BN rows of BK/4 vec4s along K.
        let at = tile_at(v, BK / 4u);
        return b_vec(n0 + at.x, k0 + at.y, p.n, p.k);
    }
    // Stored [K, N]: BK rows of BN/4 vec4s along N.
    let at = tile_at(v, BN / 4u);
    return b_vec(k0 + at.x, n0 + at.y, p.k, p.n);
}

// Stores a fetched vec4 into shared tile `buf` as [k][m] (A) or [k][n] (B).
fn store_a(buf: u32, v: u32, x: vec4<f32>) {
    let base = buf * A_TILE;
    if (TRANS_A) {
        let r = v / (BM / 4u);
        let cv = v % (BM / 4u);
        a_tile[base + r * A_STRIDE + cv] = x;
    } else {
        let m = v / (BK / 4u);
        let k = (v % (BK / 4u)) * 4u;
        let col = m >> 2u;
        let lane = m & 3u;
        a_tile[base + k * A_STRIDE + col][lane] = x.x;
        a_tile[base + (k + 1u) * A_STRIDE + col][lane] = x.y;
        a_tile[base + (k + 2u) * A_STRIDE + col][lane] = x.z;
        a_tile[base + (k + 3u) * A_STRIDE + col][lane] = x.w;
    }
}

fn store_b(buf: u32, v: u32, x: vec4<f32>) {
    let base = buf * B_TILE;
    if (TRANS_B) {
        let n = v / (BK / 4u);
        let k = (v % (BK / 4u)) * 4u;
        let col = n >> 2u;
        let lane = n & 3u;
        b_tile[base + k * B_STRIDE + col][lane] = x.x;
        b_tile[base + (k + 1u) * B_STRIDE + col][lane] = x.y;
        b_tile[base + (k + 2u) * B_STRIDE + col][lane] = x.z;
        b_tile[base + (k + 3u) * B_STRIDE + col][lane] = x.w;
    } else {
        let r = v / (BN / 4u);
        let cv = v % (BN / 4u);
        b_tile[base + r * B_STRIDE + cv] = x;
    }
}

// Writes four results of row `row` starting at column `col`, applying beta and the bias.
fn store_c(row: u32, col: u32, value: vec4<f32>) {
    if (row >= p.m || col >= p.n) {
        return;
    }
    if (VEC) {
        let i = (row * p.n + col) >> 2u;
        var out = value;
        if (p.beta != 0.0) {
            out = fma(vec4<f32>(p.beta), c[i], out);
        }
        if (HAS_BIAS) {
            out = out + bias[col >> 2u];
        }
        c[i] = out;
        return;
    }
    for (var j = 0u; j < 4u; j = j + 1u) {
        let cj = col + j;
        if (cj < p.n) {
            let i = row * p.n + cj;
            var out = value[j];
            if (p.beta != 0.0) {
                out = fma(p.beta, c[i >> 2u][i & 3u], out);
            }
            if (HAS_BIAS) {
                out = out + bias[cj >> 2u][cj & 3u];
            }
            c[i >> 2u][i & 3u] = out;
        }
    }
}

@compute @workgroup_size(WG_X, WG_Y, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let tx = lid.x;
    let ty = lid.y;
    let tid = ty * WG_X + tx;
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    let tiles = (p.k + BK - 1u) / BK;

    // The 8 x 8 register block: c{row}{half}, half 0 = columns tx*4.., half 1 = BN/2 + tx*4..
    var c00 = vec4<f32>(0.0); var c01 = vec4<f32>(0.0);
    var c10 = vec4<f32>(0.0); var c11 = vec4<f32>(0.0);
    var c20 = vec4<f32>(0.0); var c21 = vec4<f32>(0.0);
    var c30 = vec4<f32>(0.0); var c31 = vec4<f32>(0.0);
    var c40 = vec4<f32>(0.0); var c41 = vec4<f32>(0.0);
    var c50 = vec4<f32>(0.0); var c51 = vec4<f32>(0.0);
    var c60 = vec4<f32>(0.0); var c61 = vec4<f32>(0.0);
    var c70 = vec4<f32>(0.0); var c71 = vec4<f32>(0.0);

    // Registers holding the next global tile while the current one is multiplied.
    var a_next: array<vec4<f32>, A_PER_THREAD>;
    var b_next: array<vec4<f32>, B_PER_THREAD>;

    // Tile 0 into buffer 0.
    for (var j = 0u; j < A_PER_THREAD; j = j + 1u) {
        let v = tid + j * THREADS;
        if (v < A_VECS) {
            store_a(0u, v, fetch_a(v, m0, 0u));
        }
    }
    for (var j = 0u; j < B_PER_THREAD; j = j + 1u) {
        let v = tid + j * THREADS;
        if (v < B_VECS) {
            store_b(0u, v, fetch_b(v, n0, 0u));
        }
    }
    workgroupBarrier();

    for (var t = 0u; t < tiles; t = t + 1u) {
        let cur = t & 1u;
        let more = t + 1u < tiles;
        if (more) {
            let k0 = (t + 1u) * BK;
            for (var j = 0u; j < A_PER_THREAD; j = j + 1u) {
                let v = tid + j * THREADS;
                if (v < A_VECS) {
                    a_next[j] = fetch_a(v, m0, k0);
                }
            }
            for (var j = 0u; j < B_PER_THREAD; j = j + 1u) {
                let v = tid + j * THREADS;
                if (v < B_VECS) {
                    b_next[j] = fetch_b(v, n0, k0);
                }
            }
        }

        let a_base = cur * A_TILE;
        let b_base = cur * B_TILE;
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            let a0 = a_tile[a_base + kk * A_STRIDE + ty];
            let a1 = a_tile[a_base + kk * A_STRIDE + BM / 8u + ty];
            let b0 = b_tile[b_base + kk * B_STRIDE + tx];
            let b1 = b_tile[b_base + kk * B_STRIDE + BN / 8u + tx];
            c00 = fma(vec4<f32>(a0.x), b0, c00); c01 = fma(vec4<f32>(a0.x), b1, c01);
            c10 = fma(vec4<f32>(a0.y), b0, c10); c11 = fma(vec4<f32>(a0.y), b1, c11);
            c20 = fma(vec4<f32>(a0.z), b0, c20); c21 = fma(vec4<f32>(a0.z), b1, c21);
            c30 = fma(vec4<f32>(a0.w), b0, c30); c31 = fma(vec4<f32>(a0.w), b1, c31);
            c40 = fma(vec4<f32>(a1.x), b0, c40); c41 = fma(vec4<f32>(a1.x), b1, c41);
            c50 = fma(vec4<f32>(a1.y), b0, c50); c51 = fma(vec4<f32>(a1.y), b1, c51);
            c60 = fma(vec4<f32>(a1.z), b0, c60); c61 = fma(vec4<f32>(a1.z), b1, c61);
            c70 = fma(vec4<f32>(a1.w), b0, c70); c71 = fma(vec4<f32>(a1.w), b1, c71);
        }

        if (more) {
            let nxt = cur ^ 1u;
            for (var j = 0u; j < A_PER_THREAD; j = j + 1u) {
                let v = tid + j * THREADS;
                if (v < A_VECS) {
                    store_a(nxt, v, a_next[j]);
                }
            }
            for (var j = 0u; j < B_PER_THREAD; j = j + 1u) {
                let v = tid + j * THREADS;
                if (v < B_VECS) {
                    store_b(nxt, v, b_next[j]);
                }
            }
        }
        // The buffer just read is written again at the next iteration; the one just written
        // is read there: one barrier orders both.
        workgroupBarrier();
    }

    let r0 = m0 + ty * 4u;
    let r1 = m0 + BM / 2u + ty * 4u;
    let col0 = n0 + tx * 4u;
    let col1 = n0 + BN / 2u + tx * 4u;
    store_c(r0, col0, c00); store_c(r0, col1, c01);
    store_c(r0 + 1u, col0, c10); store_c(r0 + 1u, col1, c11);
    store_c(r0 + 2u, col0, c20); store_c(r0 + 2u, col1, c21);
    store_c(r0 + 3u, col0, c30); store_c(r0 + 3u, col1, c31);
    store_c(r1, col0, c40); store_c(r1, col1, c41);
    store_c(r1 + 1u, col0, c50); store_c(r1 + 1u, col1, c51);
    store_c(r1 + 2u, col0, c60); store_c(r1 + 2u, col1, c61);
    store_c(r1 + 3u, col0, c70); store_c(r1 + 3u, col1, c71);
}
