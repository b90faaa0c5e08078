//! cuBLAS and cuBLASLt on allocator memory: row-major products as column-major calls, and the
//! per-stream workspaces PyTorch 2.11 takes from its caching allocator.
//!
//! Row-major `C[m, n] = op(A) · op(B)` is column-major `Cᵀ[n, m] = op(B)ᵀ · op(A)ᵀ`, and a
//! row-major matrix read column-major *is* its transpose. So every product is one call with
//! the operands swapped: first operand `B` (transposed iff `trans_b`, leading dimension its
//! row length), second `A` (likewise), `m' = n`, `n' = m`, `ldc = n`. No data moves.
//!
//! cuBLASLt is used for products with a bias, as PyTorch's `addmm` → `gemm_and_bias` does
//! (`CUBLASLT_EPILOGUE_BIAS`: a bias of length `m' = n` added to every row of `C`). cudarc's
//! safe cuBLASLt layer allocates its own workspace with `cuMemAllocAsync` and computes in TF32,
//! so this module calls cudarc's `cublaslt::result` functions directly instead.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::Arc;

use cachalot_core::{Allocation, CachingAllocator, StreamId};
use cachalot_shaders::MatmulShape;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::CudaStream;

use super::span::Region;
use crate::backend::CudaBackend;
use crate::error::CudaError;

/// What a stream holds: its cuBLAS handle and workspace, and (after the first product with a
/// bias) its cuBLASLt handle and workspace.
pub(crate) struct StreamBlas {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
    pub workspace: Allocation,
    pub lt: Option<StreamLt>,
}

/// A stream's cuBLASLt state.
pub(crate) struct StreamLt {
    handle: LtHandle,
    pub workspace: Allocation,
    /// Algorithms chosen by the heuristic, per problem.
    algorithms: HashMap<LtKey, lt_sys::cublasLtMatmulAlgo_t>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct LtKey {
    shape: MatmulShape,
    accumulate: bool,
}

struct LtHandle(lt_sys::cublasLtHandle_t);

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: created by `lt::create_handle` and destroyed once, here.
        let _ = unsafe { lt::destroy_handle(self.0) };
    }
}

// SAFETY: a cuBLASLt handle may be used from any thread, one call at a time; `&mut self` on
// every use guarantees that.
unsafe impl Send for LtHandle {}

/// Device addresses of one product, checked against the shape.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operands {
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub bias: Option<u64>,
}

fn blas_error(call: &'static str) -> impl FnOnce(cudarc::cublas::result::CublasError) -> CudaError {
    move |e| CudaError::Blas { call, status: format!("{:?}", e.0) }
}

fn lt_error(call: &'static str) -> impl FnOnce(lt::CublasError) -> CudaError {
    move |e| CudaError::Blas { call, status: format!("{:?}", e.0) }
}

fn to_int(value: u32, what: &str) -> Result<i32, CudaError> {
    i32::try_from(value)
        .map_err(|_| CudaError::InvalidArguments(format!("{what} = {value} exceeds cuBLAS's int range")))
}

impl StreamBlas {
    /// A cuBLAS handle on `stream` with a fresh workspace of `bytes` from the allocator
    /// (PyTorch's `setWorkspaceForHandle`: `CUDACachingAllocator::allocate(size)` on the current
    /// stream, kept for the life of the process).
    pub(crate) fn new(
        allocator: &mut CachingAllocator<CudaBackend>,
        stream_id: StreamId,
        stream: Arc<CudaStream>,
        bytes: u64,
    ) -> Result<Self, CudaError> {
        let blas = CudaBlas::new(Arc::clone(&stream)).map_err(blas_error("cublasCreate"))?;
        let workspace = allocator.malloc(bytes, stream_id)?;
        // SAFETY: the workspace is a live block of at least `bytes` bytes, used on this stream
        // only, and kept until the handle is dropped or given a new one.
        let set = unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *blas.handle(),
                workspace.address() as *mut c_void,
                bytes as usize,
            )
        };
        if let Err(e) = set.result() {
            let _ = allocator.free(workspace);
            return Err(blas_error("cublasSetWorkspace")(e));
        }
        Ok(StreamBlas { blas, stream, workspace, lt: None })
    }

    /// Creates the stream's cuBLASLt handle and its workspace of `bytes`, if not done yet.
    pub(crate) fn ensure_lt(
        &mut self,
        allocator: &mut CachingAllocator<CudaBackend>,
        stream_id: StreamId,
        bytes: u64,
    ) -> Result<(), CudaError> {
        if self.lt.is_some() {
            return Ok(());
        }
        let handle = LtHandle(lt::create_handle().map_err(lt_error("cublasLtCreate"))?);
        let workspace = allocator.malloc(bytes, stream_id)?;
        self.lt = Some(StreamLt { handle, workspace, algorithms: HashMap::new() });
        Ok(())
    }

    /// `C = op(A) · op(B) + beta · C` through `cublasSgemm`.
    pub(crate) fn gemm(&self, shape: MatmulShape, ops: Operands, beta: f32) -> Result<(), CudaError> {
        let MatmulShape { m, n, k, trans_a, trans_b } = shape;
        let (mi, ni, ki) = (to_int(m, "m")?, to_int(n, "n")?, to_int(k, "k")?);
        let op = |t: bool| {
            if t {
                cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let config = GemmConfig {
            transa: op(trans_b),
            transb: op(trans_a),
            m: ni,
            n: mi,
            k: ki,
            alpha: 1.0f32,
            // cuBLAS wants every leading dimension >= 1, even for an empty contraction.
            lda: (if trans_b { ki } else { ni }).max(1),
            ldb: (if trans_a { mi } else { ki }).max(1),
            beta,
            ldc: ni.max(1),
        };
        let (ea, eb, ec) = shape.elements();
        let stream = self.blas_stream();
        let a = Region::<f32>::new(ops.a, ea as usize, stream);
        let b = Region::<f32>::new(ops.b, eb as usize, stream);
        let mut c = Region::<f32>::new(ops.c, ec as usize, stream);
        // SAFETY: the caller checked that every operand holds its elements; the leading
        // dimensions follow from the row-major layouts (module docs).
        unsafe { self.blas.gemm(config, &b, &a, &mut c) }.map_err(blas_error("cublasSgemm"))
    }

    fn blas_stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// `C = op(A) · op(B) + beta · C + bias` through `cublasLtMatmul` with the bias epilogue,
    /// FP32 compute (no TF32, as PyTorch's default `allow_tf32 = False`).
    pub(crate) fn gemm_bias(&mut self, shape: MatmulShape, ops: Operands, beta: f32) -> Result<(), CudaError> {
        let stream = self.blas_stream().cu_stream();
        let lt = self.lt.as_mut().ok_or_else(|| CudaError::InvalidArguments("cuBLASLt is not set up".into()))?;
        let MatmulShape { m, n, k, trans_a, trans_b } = shape;
        let (m, n, k) = (u64::from(m), u64::from(n), u64::from(k));
        let f32_type = lt_sys::cudaDataType_t::CUDA_R_32F;
        // Column-major view: first operand B, second A (module docs).
        let (b_rows, b_cols) = if trans_b { (k, n) } else { (n, k) };
        let (a_rows, a_cols) = if trans_a { (m, k) } else { (k, m) };
        let first = Layout::new(f32_type, b_rows, b_cols, b_rows as i64)?;
        let second = Layout::new(f32_type, a_rows, a_cols, a_rows as i64)?;
        let out = Layout::new(f32_type, n, m, n as i64)?;
        let desc = Desc::new()?;
        desc.set(lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, &i32::from(trans_b))?;
        desc.set(lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, &i32::from(trans_a))?;
        let epilogue = lt_sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS;
        desc.set(lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
        let bias = ops.bias.ok_or_else(|| CudaError::InvalidArguments("a biased product needs a bias".into()))?;
        desc.set(lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;

        let workspace_bytes = lt.workspace.size() as usize;
        let key = LtKey { shape, accumulate: beta != 0.0 };
        let algorithm = match lt.algorithms.get(&key) {
            Some(algorithm) => *algorithm,
            None => {
                let pref = Pref::new()?;
                pref.set_workspace(workspace_bytes)?;
                // SAFETY: all descriptors are live.
                let heuristic = unsafe {
                    lt::get_matmul_algo_heuristic(lt.handle.0, desc.0, first.0, second.0, out.0, out.0, pref.0)
                }
                .map_err(lt_error("cublasLtMatmulAlgoGetHeuristic"))?;
                lt.algorithms.insert(key, heuristic.algo);
                heuristic.algo
            }
        };
        let (alpha, beta) = (1.0f32, beta);
        // SAFETY: operands checked by the caller against the shape; the workspace is a live
        // block of `workspace_bytes`; everything runs on this stream.
        unsafe {
            lt::matmul(
                lt.handle.0,
                desc.0,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                ops.b as *const c_void,
                first.0,
                ops.a as *const c_void,
                second.0,
                ops.c as *const c_void,
                out.0,
                ops.c as *mut c_void,
                out.0,
                &algorithm,
                lt.workspace.address() as *mut c_void,
                workspace_bytes,
                stream as lt_sys::cudaStream_t,
            )
        }
        .map_err(lt_error("cublasLtMatmul"))
    }
}

/// A cuBLASLt matrix layout, destroyed on drop.
struct Layout(lt_sys::cublasLtMatrixLayout_t);

impl Layout {
    fn new(data_type: lt_sys::cudaDataType, rows: u64, cols: u64, ld: i64) -> Result<Self, CudaError> {
        Ok(Layout(lt::create_matrix_layout(data_type, rows, cols, ld).map_err(lt_error("cublasLtMatrixLayoutCreate"))?))
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}

/// A cuBLASLt matmul descriptor (FP32 compute and scale), destroyed on drop.
struct Desc(lt_sys::cublasLtMatmulDesc_t);

impl Desc {
    fn new() -> Result<Self, CudaError> {
        let desc =
            lt::create_matmul_desc(lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, lt_sys::cudaDataType_t::CUDA_R_32F)
                .map_err(lt_error("cublasLtMatmulDescCreate"))?;
        Ok(Desc(desc))
    }

    fn set<T>(&self, attribute: lt_sys::cublasLtMatmulDescAttributes_t, value: &T) -> Result<(), CudaError> {
        // SAFETY: the descriptor is live; the value has the attribute's type and size.
        unsafe { lt::set_matmul_desc_attribute(self.0, attribute, value as *const T as *const c_void, size_of::<T>()) }
            .map_err(lt_error("cublasLtMatmulDescSetAttribute"))
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}

/// A cuBLASLt heuristic preference, destroyed on drop.
struct Pref(lt_sys::cublasLtMatmulPreference_t);

impl Pref {
    fn new() -> Result<Self, CudaError> {
        Ok(Pref(lt::create_matmul_pref().map_err(lt_error("cublasLtMatmulPreferenceCreate"))?))
    }

    fn set_workspace(&self, bytes: usize) -> Result<(), CudaError> {
        let bytes = bytes as u64;
        // SAFETY: the preference is live; the attribute is a uint64.
        unsafe {
            lt::set_matmul_pref_attribute(
                self.0,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&bytes) as *const u64 as *const c_void,
                size_of::<u64>(),
            )
        }
        .map_err(lt_error("cublasLtMatmulPreferenceSetAttribute"))
    }
}

impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}
