//! WGSL compute kernels.
//!
//! Every storage binding is `read_write`: wgpu tracks usage per whole buffer, and one buffer
//! bound read-only and read-write in the same dispatch is a validation error even for
//! disjoint ranges; operands are blocks of shared segments, so they often share a buffer.
//!
//! The element-wise, loss and optimiser modules start with [`COMMON`] (the `Params` uniform,
//! the 256-invocation workgroup, the 2-D grid index and the normal CDF): build them with
//! [`module_source`]. The matrix product takes its tile shape as constants: build it with
//! [`MatmulTile::source`]. Tables of bindings and parameters are at the top of each file.

/// Shared declarations of the non-matmul modules.
pub const COMMON: &str = include_str!("../wgsl/common.wgsl");
/// Tiled, vectorised matrix product with bias and accumulation; entry point `main`.
pub const MATMUL: &str = include_str!("../wgsl/matmul.wgsl");
/// Fill, copy, ReLU and GELU forward and backward, bias add, column sums.
pub const ELEMENTWISE: &str = include_str!("../wgsl/elementwise.wgsl");
/// Mean squared error and its gradient.
pub const MSE: &str = include_str!("../wgsl/mse.wgsl");
/// Softmax cross-entropy over class indices, with its gradient.
pub const CROSS_ENTROPY: &str = include_str!("../wgsl/cross_entropy.wgsl");
/// SGD and Adam steps.
pub const OPTIM: &str = include_str!("../wgsl/optim.wgsl");

/// Invocations per workgroup of the element-wise, loss and optimiser kernels.
pub const WORKGROUP: u32 = 256;

/// Size in bytes of the `Params` uniform of [`COMMON`]: `n, rows, cols, base: u32` then
/// `f0, f1: vec4<f32>`.
pub const PARAMS_BYTES: u64 = 48;

/// Size in bytes of the matmul's `Params` uniform: `m, n, k: u32, beta: f32`.
pub const MATMUL_PARAMS_BYTES: u64 = 16;

/// The modules that start with [`COMMON`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Module {
    /// [`ELEMENTWISE`]: bindings `x, y, z` (storage) then the uniform.
    Elementwise,
    /// [`MSE`]: bindings `pred, target, grad, loss` then the uniform.
    Mse,
    /// [`CROSS_ENTROPY`]: bindings `logits, targets, grad, row_loss, loss` then the uniform.
    CrossEntropy,
    /// [`OPTIM`]: bindings `param, grad, exp_avg, exp_avg_sq` then the uniform.
    Optim,
}

impl Module {
    /// Every module.
    pub const ALL: [Module; 4] = [Module::Elementwise, Module::Mse, Module::CrossEntropy, Module::Optim];

    /// The module's own text (without [`COMMON`]).
    pub fn body(self) -> &'static str {
        match self {
            Module::Elementwise => ELEMENTWISE,
            Module::Mse => MSE,
            Module::CrossEntropy => CROSS_ENTROPY,
            Module::Optim => OPTIM,
        }
    }

    /// Storage bindings `0..n`; the uniform is binding `n`.
    pub fn storage_bindings(self) -> u32 {
        match self {
            Module::Elementwise => 3,
            Module::Mse | Module::Optim => 4,
            Module::CrossEntropy => 5,
        }
    }

    /// The module's entry points.
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            Module::Elementwise => &[
                "fill",
                "copy",
                "relu_forward",
                "relu_backward",
                "gelu_forward",
                "gelu_backward",
                "add_bias",
                "sum_rows",
            ],
            Module::Mse => &["mse_loss", "mse_grad"],
            Module::CrossEntropy => &["xent_rows", "xent_mean"],
            Module::Optim => &["sgd_step", "adam_step"],
        }
    }
}

/// The full source of a module: [`COMMON`] followed by the module.
pub fn module_source(module: Module) -> String {
    format!("{COMMON}\n{}", module.body())
}

/// Tile shape of the matrix product: each workgroup computes a `bm × bn` block of `C`
/// through `bk`-deep shared-memory tiles, each invocation an 8 × 8 register block, so a
/// workgroup has `(bn / 8) × (bm / 8)` invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulTile {
    /// Rows of `C` per workgroup (a multiple of 16).
    pub bm: u32,
    /// Columns of `C` per workgroup (a multiple of 16).
    pub bn: u32,
    /// Depth of a shared-memory tile (a multiple of 4).
    pub bk: u32,
}

impl MatmulTile {
    /// 128 × 128 × 8, 256 invocations: for matrices that fill the GPU with such tiles.
    pub const LARGE: MatmulTile = MatmulTile { bm: 128, bn: 128, bk: 8 };
    /// 64 × 64 × 8, 64 invocations: more workgroups for small products, and it fits the
    /// WebGPU default of 16 KiB of workgroup memory.
    pub const SMALL: MatmulTile = MatmulTile { bm: 64, bn: 64, bk: 8 };

    /// `(x, y)` invocations of a workgroup.
    pub fn workgroup_size(&self) -> (u32, u32) {
        (self.bn / 8, self.bm / 8)
    }

    /// Invocations per workgroup.
    pub fn invocations(&self) -> u32 {
        (self.bn / 8) * (self.bm / 8)
    }

    /// Workgroup memory in bytes: two buffers of each padded tile.
    pub fn shared_bytes(&self) -> u64 {
        let a = self.bk as u64 * (self.bm as u64 / 4 + 1) * 16;
        let b = self.bk as u64 * (self.bn as u64 / 4 + 1) * 16;
        2 * (a + b)
    }

    /// Workgroups `(x, y)` covering an `m × n` output.
    pub fn workgroups(&self, m: u32, n: u32) -> (u32, u32) {
        (n.div_ceil(self.bn), m.div_ceil(self.bm))
    }

    /// Whether the shape is one the kernel supports.
    pub fn is_valid(&self) -> bool {
        self.bm >= 16
            && self.bm.is_multiple_of(16)
            && self.bn >= 16
            && self.bn.is_multiple_of(16)
            && self.bk >= 4
            && self.bk.is_multiple_of(4)
    }

    /// The matmul source with this tile shape.
    pub fn source(&self) -> String {
        format!("const BM: u32 = {}u;\nconst BN: u32 = {}u;\nconst BK: u32 = {}u;\n{MATMUL}", self.bm, self.bn, self.bk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(source: &str) -> naga::Module {
        let module = match naga::front::wgsl::parse_str(source) {
            Ok(module) => module,
            Err(error) => panic!("{}", error.emit_to_string(source)),
        };
        let mut validator =
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
        if let Err(error) = validator.validate(&module) {
            panic!("{}", error.emit_to_string(source));
        }
        module
    }

    fn entry_points(module: &naga::Module) -> Vec<String> {
        module.entry_points.iter().map(|e| e.name.clone()).collect()
    }

    #[test]
    fn every_module_parses_and_validates_with_its_entry_points() {
        for module in Module::ALL {
            let parsed = validate(&module_source(module));
            let mut found = entry_points(&parsed);
            found.sort();
            let mut expected: Vec<String> = module.entry_points().iter().map(|s| s.to_string()).collect();
            expected.sort();
            assert_eq!(found, expected, "{module:?}");
        }
    }

    #[test]
    fn matmul_validates_for_both_tiles() {
        for tile in [MatmulTile::LARGE, MatmulTile::SMALL] {
            assert!(tile.is_valid());
            let parsed = validate(&tile.source());
            assert_eq!(entry_points(&parsed), ["main"]);
        }
        assert!(MatmulTile::SMALL.shared_bytes() <= 16384);
        assert_eq!(MatmulTile::LARGE.invocations(), 256);
    }

    #[test]
    fn every_storage_binding_is_read_write() {
        for source in [MATMUL, ELEMENTWISE, MSE, CROSS_ENTROPY, OPTIM] {
            assert!(source.contains("var<storage, read_write>"));
            assert!(!source.contains("var<storage, read>"), "read-only bindings conflict with read_write ones");
            assert!(!source.contains("var<storage>"), "the default access mode is read");
        }
    }
}
