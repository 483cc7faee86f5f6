//! cuBLAS matrix products on raw device pointers: the encoder's linear layers and its
//! attention's batched products.
//!
//! cuBLAS is column-major; the matrices here are row-major. A row-major `M [r, c]` read
//! column-major is `Mᵀ [c, r]`, so a row-major `C = A·op(B)` is computed as the
//! column-major `Cᵀ = op(B)ᵀ·Aᵀ`: the operands swapped, no data moved.
//!
//! Every product accumulates in f32 (`CUBLAS_COMPUTE_32F`, default math mode): f16 and
//! bf16 run on tensor cores, f32 stays plain f32 (no TF32). [`Blas`] owns its handle and a
//! workspace set with `cublasSetWorkspace`, so the calls allocate nothing and can be
//! captured in a CUDA graph.

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use cudarc::cublas::result::{self, CublasError};
use cudarc::cublas::sys::{
    self, cublasComputeType_t, cublasGemmAlgo_t, cublasMath_t, cublasOperation_t, cudaDataType,
};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::error::KernelError;
use crate::gemv::{WeightDtype, check_range, overlaps};
use crate::sys::cublas_available;

/// cuBLAS's workspace: NVIDIA recommends 32 MiB on Hopper (4 MiB before it).
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle bound to one stream. `Send`, not `Sync`: use it from one thread at a
/// time (the worker's device thread).
pub struct Blas {
    handle: sys::cublasHandle_t,
    /// Kept alive as long as the handle, which enqueues on it.
    stream: Arc<CudaStream>,
    /// Given to cuBLAS; freed after the handle is destroyed (fields drop after `drop`).
    workspace: Option<CudaSlice<u8>>,
}

// SAFETY: a cuBLAS handle is not tied to the thread that created it; `Blas` is not `Sync`,
// so it is used from one thread at a time, and each call binds the stream's context to the
// calling thread first.
unsafe impl Send for Blas {}

impl fmt::Debug for Blas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blas")
            .field("handle", &self.handle)
            .field("stream", &self.stream.cu_stream())
            .field("workspace_bytes", &WORKSPACE_BYTES)
            .finish()
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        let handle = std::mem::replace(&mut self.handle, std::ptr::null_mut());
        if !handle.is_null() {
            // Best effort: never panic in drop; a failure here leaks the handle only.
            let _ = self.stream.context().bind_to_thread();
            // SAFETY: the handle came from `create_handle` and is destroyed once (it was
            // just replaced with null); nothing else holds it.
            let _ = unsafe { result::destroy_handle(handle) };
        }
    }
}

/// Arguments of [`Blas::batched_matmul`]: for `i` in `0..batch`,
/// `C_i [m, n] = alpha · A_i [m, k] · op(B_i)`, all row-major, with `B_i` `[n, k]` (used
/// transposed) when `b_transposed`, else `[k, n]`. `A_i` starts `i · stride_a` elements
/// after `a`, and so on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchedMatmul {
    /// First A matrix.
    pub a: u64,
    /// First B matrix.
    pub b: u64,
    /// First C matrix (written, never read).
    pub c: u64,
    /// Rows of A and C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// Columns of A, the summed dimension.
    pub k: usize,
    /// Matrices.
    pub batch: usize,
    /// Elements between consecutive A matrices (0: one A for every product).
    pub stride_a: usize,
    /// Elements between consecutive B matrices (0: one B for every product).
    pub stride_b: usize,
    /// Elements between consecutive C matrices, at least `m · n` when `batch > 1`.
    pub stride_c: usize,
    /// B is `[n, k]` and used transposed (attention scores `Q·Kᵀ`), else `[k, n]`.
    pub b_transposed: bool,
    /// Scales the product (e.g. `1/√head_dim`).
    pub alpha: f32,
}

/// One checked cuBLAS product, column-major, in cuBLAS's own terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Gemm {
    trans_a: bool,
    trans_b: bool,
    m: i32,
    n: i32,
    k: i32,
    a: u64,
    lda: i32,
    stride_a: i64,
    b: u64,
    ldb: i32,
    stride_b: i64,
    c: u64,
    ldc: i32,
    stride_c: i64,
    batch: i32,
}

fn int(what: &str, v: usize) -> Result<i32, KernelError> {
    i32::try_from(v)
        .map_err(|_| KernelError::bad(format!("{what} = {v} does not fit cuBLAS's int")))
}

/// Bytes spanned by `batch` matrices of `elems` elements `stride` apart, checked.
fn extent(
    what: &str,
    batch: usize,
    stride: usize,
    elems: u64,
    es: u64,
) -> Result<u64, KernelError> {
    let span = (batch as u64 - 1)
        .checked_mul(stride as u64)
        .and_then(|s| s.checked_add(elems))
        .and_then(|e| e.checked_mul(es))
        .filter(|b| *b <= i64::MAX as u64);
    span.ok_or_else(|| KernelError::bad(format!("{what}: {batch} matrices overflow 64-bit sizes")))
}

/// Checks a row-major batched product and swaps it into cuBLAS's column-major terms.
/// `Ok(None)`: nothing to compute.
fn plan_batched(dtype: WeightDtype, p: &BatchedMatmul) -> Result<Option<Gemm>, KernelError> {
    if p.m == 0 || p.n == 0 || p.batch == 0 {
        return Ok(None);
    }
    if p.k == 0 {
        return Err(KernelError::bad("matmul with k = 0"));
    }
    if !p.alpha.is_finite() {
        return Err(KernelError::bad(format!(
            "matmul alpha {} is not finite",
            p.alpha
        )));
    }
    let (m, n, k) = (int("m", p.m)?, int("n", p.n)?, int("k", p.k)?);
    let batch = int("batch", p.batch)?;
    let mn = (p.m as u64) * (p.n as u64);
    if p.batch > 1 && (p.stride_c as u64) < mn {
        return Err(KernelError::bad(format!(
            "matmul stride_c {} is less than m·n = {mn}: the outputs would overlap",
            p.stride_c
        )));
    }
    let es = dtype.size_bytes() as u64;
    let a_bytes = extent("a", p.batch, p.stride_a, (p.m as u64) * (p.k as u64), es)?;
    let b_bytes = extent("b", p.batch, p.stride_b, (p.n as u64) * (p.k as u64), es)?;
    let c_bytes = extent("c", p.batch, p.stride_c, mn, es)?;
    check_range("matmul a", p.a, a_bytes, es)?;
    check_range("matmul b", p.b, b_bytes, es)?;
    check_range("matmul c", p.c, c_bytes, es)?;
    if overlaps(p.c, c_bytes, p.a, a_bytes) || overlaps(p.c, c_bytes, p.b, b_bytes) {
        return Err(KernelError::bad(format!(
            "matmul output c at {:#x} ({c_bytes} bytes) overlaps an input",
            p.c
        )));
    }
    let stride = |what, s: usize| {
        i64::try_from(s).map_err(|_| KernelError::bad(format!("{what} {s} overflows")))
    };
    // Cᵀ [n, m] = op(B)ᵀ · Aᵀ. Aᵀ is `a` as it lies (k×m, ld k). B [n, k] lies as Bᵀ
    // (k×n, ld k), transposed back; B [k, n] lies as Bᵀ (n×k, ld n), used as it lies.
    Ok(Some(Gemm {
        trans_a: p.b_transposed,
        trans_b: false,
        m: n,
        n: m,
        k,
        a: p.b,
        lda: if p.b_transposed { k } else { n },
        stride_a: stride("stride_b", p.stride_b)?,
        b: p.a,
        ldb: k,
        stride_b: stride("stride_a", p.stride_a)?,
        c: p.c,
        ldc: n,
        stride_c: stride("stride_c", p.stride_c)?,
        batch,
    }))
}

/// A linear layer `y [rows, out] = x [rows, in] · w [out, in]ᵀ` as a one-matrix product.
fn linear_as_batched(
    x: u64,
    w: u64,
    y: u64,
    rows: usize,
    in_features: usize,
    out_features: usize,
) -> BatchedMatmul {
    BatchedMatmul {
        a: x,
        b: w,
        c: y,
        m: rows,
        n: out_features,
        k: in_features,
        batch: 1,
        stride_a: 0,
        stride_b: 0,
        stride_c: 0,
        b_transposed: true,
        alpha: 1.0,
    }
}

fn data_type(dtype: WeightDtype) -> cudaDataType {
    match dtype {
        WeightDtype::F32 => cudaDataType::CUDA_R_32F,
        WeightDtype::F16 => cudaDataType::CUDA_R_16F,
        WeightDtype::BF16 => cudaDataType::CUDA_R_16BF,
    }
}

fn op(transposed: bool) -> cublasOperation_t {
    if transposed {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

fn failed(call: &'static str) -> impl FnOnce(CublasError) -> KernelError {
    move |status| KernelError::Cublas { call, status }
}

impl Blas {
    /// A handle enqueuing on `stream`, with its own workspace (allocated here, once).
    ///
    /// Fails with [`KernelError::LibraryMissing`] naming libcublas when cuBLAS cannot be
    /// loaded (where cudarc would panic).
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, KernelError> {
        cublas_available()?;
        stream.context().bind_to_thread()?;
        let handle = result::create_handle().map_err(failed("cublasCreate_v2"))?;
        // From here on, drop destroys the handle on any error.
        let mut blas = Self {
            handle,
            stream,
            workspace: None,
        };
        // SAFETY: the handle is live and the stream belongs to the bound context; `blas`
        // keeps the stream alive as long as the handle.
        unsafe { result::set_stream(blas.handle, blas.stream.cu_stream() as sys::cudaStream_t) }
            .map_err(failed("cublasSetStream_v2"))?;
        let workspace = blas.stream.alloc_zeros::<u8>(WORKSPACE_BYTES)?;
        let (ptr, guard) = workspace.device_ptr(&blas.stream);
        // SAFETY: `workspace` holds WORKSPACE_BYTES on the handle's stream's device and is
        // freed only after the handle is destroyed (see the field's note).
        unsafe { sys::cublasSetWorkspace_v2(blas.handle, ptr as *mut c_void, WORKSPACE_BYTES) }
            .result()
            .map_err(failed("cublasSetWorkspace_v2"))?;
        drop(guard);
        blas.workspace = Some(workspace);
        // SAFETY: a live handle; the default math mode uses tensor cores for f16/bf16 and
        // no TF32 for f32.
        unsafe { sys::cublasSetMathMode(blas.handle, cublasMath_t::CUBLAS_DEFAULT_MATH) }
            .result()
            .map_err(failed("cublasSetMathMode"))?;
        Ok(blas)
    }

    /// The stream the products are enqueued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Enqueues `y [rows, out] = x [rows, in] · w [out, in]ᵀ`, all row-major and of `dtype`,
    /// accumulated in f32: a linear layer without its bias (PyTorch's weight layout).
    /// `rows == 0` or `out_features == 0` is a no-op; `in_features == 0` is an error.
    ///
    /// # Safety
    ///
    /// `x`, `w` and `y` must be valid on the stream's device for `rows·in`, `out·in` and
    /// `rows·out` elements until the product completes; nothing else may write `x` or `w`,
    /// or touch `y`, while it runs.
    #[allow(clippy::too_many_arguments)] // The operation's own parameters, as in cuBLAS.
    pub unsafe fn linear(
        &self,
        dtype: WeightDtype,
        x: u64,
        w: u64,
        y: u64,
        rows: usize,
        in_features: usize,
        out_features: usize,
    ) -> Result<(), KernelError> {
        let p = linear_as_batched(x, w, y, rows, in_features, out_features);
        let Some(g) = plan_batched(dtype, &p)? else {
            return Ok(());
        };
        // SAFETY: plan_batched checked the sizes and pointers; the caller promised the
        // memory.
        unsafe { self.gemm(dtype, &g, 1.0) }
    }

    /// Enqueues the products of `p` (see [`BatchedMatmul`]), all of `dtype`, accumulated in
    /// f32. `m`, `n` or `batch` 0 is a no-op; `k == 0` is an error.
    ///
    /// # Safety
    ///
    /// The `batch` matrices of A, B and C (at their strides) must be valid on the stream's
    /// device until the products complete; nothing else may write A or B, or touch C, while
    /// they run.
    pub unsafe fn batched_matmul(
        &self,
        dtype: WeightDtype,
        p: &BatchedMatmul,
    ) -> Result<(), KernelError> {
        let Some(g) = plan_batched(dtype, p)? else {
            return Ok(());
        };
        // SAFETY: as in `linear`.
        unsafe { self.gemm(dtype, &g, p.alpha) }
    }

    /// # Safety
    ///
    /// `g` checked by `plan_batched` and its memory valid as the public callers promise.
    unsafe fn gemm(&self, dtype: WeightDtype, g: &Gemm, alpha: f32) -> Result<(), KernelError> {
        self.stream.context().bind_to_thread()?;
        let ty = data_type(dtype);
        let beta = 0.0f32;
        let alpha_ptr = (&alpha as *const f32).cast::<c_void>();
        let beta_ptr = (&beta as *const f32).cast::<c_void>();
        let compute = cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let algo = cublasGemmAlgo_t::CUBLAS_GEMM_DFALT;
        if g.batch == 1 {
            // SAFETY: a live handle; alpha and beta are f32 on the host (the default
            // pointer mode) as CUBLAS_COMPUTE_32F wants; the operands' sizes and leading
            // dimensions are plan_batched's, and the caller promised their memory.
            unsafe {
                result::gemm_ex(
                    self.handle,
                    op(g.trans_a),
                    op(g.trans_b),
                    g.m,
                    g.n,
                    g.k,
                    alpha_ptr,
                    g.a as *const c_void,
                    ty,
                    g.lda,
                    g.b as *const c_void,
                    ty,
                    g.ldb,
                    beta_ptr,
                    g.c as *mut c_void,
                    ty,
                    g.ldc,
                    compute,
                    algo,
                )
            }
            .map_err(failed("cublasGemmEx"))
        } else {
            // SAFETY: as above, with the strides plan_batched checked.
            unsafe {
                result::gemm_strided_batched_ex(
                    self.handle,
                    op(g.trans_a),
                    op(g.trans_b),
                    g.m,
                    g.n,
                    g.k,
                    alpha_ptr,
                    g.a as *const c_void,
                    ty,
                    g.lda,
                    g.stride_a,
                    g.b as *const c_void,
                    ty,
                    g.ldb,
                    g.stride_b,
                    beta_ptr,
                    g.c as *mut c_void,
                    ty,
                    g.ldc,
                    g.stride_c,
                    g.batch,
                    compute,
                    algo,
                )
            }
            .map_err(failed("cublasGemmStridedBatchedEx"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 0x7f00_0000_0000;
    const B: u64 = 0x7f10_0000_0000;
    const C: u64 = 0x7f20_0000_0000;

    fn scores() -> BatchedMatmul {
        // Attention scores: Q [s, d] · K [s, d]ᵀ per (batch, head).
        BatchedMatmul {
            a: A,
            b: B,
            c: C,
            m: 64,
            n: 64,
            k: 32,
            batch: 24,
            stride_a: 64 * 32,
            stride_b: 64 * 32,
            stride_c: 64 * 64,
            b_transposed: true,
            alpha: 0.125,
        }
    }

    /// The row-major to column-major swap gets an operand, a transpose or a leading
    /// dimension wrong.
    #[test]
    fn row_major_swap() {
        let g = plan_batched(WeightDtype::F16, &scores())
            .expect("plan")
            .expect("some");
        assert_eq!((g.trans_a, g.trans_b), (true, false));
        assert_eq!((g.m, g.n, g.k), (64, 64, 32));
        assert_eq!((g.a, g.lda, g.b, g.ldb, g.c, g.ldc), (B, 32, A, 32, C, 64));
        assert_eq!(
            (g.stride_a, g.stride_b, g.stride_c, g.batch),
            (2048, 2048, 4096, 24)
        );

        // Context: P [s, s] · V [s, d]: m = s, n = d, k = s, B not transposed.
        let ctx = BatchedMatmul {
            n: 32,
            k: 64,
            stride_a: 64 * 64,
            stride_b: 64 * 32,
            stride_c: 64 * 32,
            b_transposed: false,
            alpha: 1.0,
            ..scores()
        };
        let g = plan_batched(WeightDtype::F16, &ctx)
            .expect("plan")
            .expect("some");
        assert_eq!((g.trans_a, g.trans_b), (false, false));
        assert_eq!((g.m, g.n, g.k), (32, 64, 64));
        assert_eq!((g.lda, g.ldb, g.ldc), (32, 64, 32));

        // Linear: y [rows, out] = x [rows, in] · w [out, in]ᵀ → Yᵀ = W · Xᵀ.
        let lin = linear_as_batched(A, B, C, 100, 384, 1536);
        let g = plan_batched(WeightDtype::BF16, &lin)
            .expect("plan")
            .expect("some");
        assert_eq!((g.trans_a, g.trans_b), (true, false));
        assert_eq!((g.m, g.n, g.k), (1536, 100, 384));
        assert_eq!(
            (g.a, g.lda, g.b, g.ldb, g.ldc, g.batch),
            (B, 384, A, 384, 1536, 1)
        );
    }

    /// Bad sizes or pointers reach cuBLAS instead of an error.
    #[test]
    fn bad_arguments_are_errors() {
        let plan = |p: BatchedMatmul| plan_batched(WeightDtype::F32, &p);
        assert!(plan(scores()).is_ok());
        assert_eq!(
            plan(BatchedMatmul { m: 0, ..scores() }).expect("plan"),
            None
        );
        assert_eq!(
            plan(BatchedMatmul {
                batch: 0,
                ..scores()
            })
            .expect("plan"),
            None
        );
        assert!(plan(BatchedMatmul { k: 0, ..scores() }).is_err());
        assert!(
            plan(BatchedMatmul {
                m: 1 << 31,
                ..scores()
            })
            .is_err()
        );
        assert!(
            plan(BatchedMatmul {
                alpha: f32::NAN,
                ..scores()
            })
            .is_err()
        );
        assert!(plan(BatchedMatmul { a: 0, ..scores() }).is_err());
        assert!(
            plan(BatchedMatmul {
                b: B + 2,
                ..scores()
            })
            .is_err()
        );
        assert!(
            plan(BatchedMatmul {
                stride_c: 64 * 63,
                ..scores()
            })
            .is_err()
        );
        assert!(
            plan(BatchedMatmul {
                c: A + 64,
                ..scores()
            })
            .is_err(),
            "c inside a"
        );
        assert!(
            plan(BatchedMatmul {
                stride_a: usize::MAX,
                ..scores()
            })
            .is_err()
        );
        // Broadcast inputs (stride 0) are fine; one matrix needs no output stride.
        assert!(
            plan(BatchedMatmul {
                stride_b: 0,
                ..scores()
            })
            .is_ok()
        );
        assert!(
            plan(BatchedMatmul {
                batch: 1,
                stride_c: 0,
                ..scores()
            })
            .is_ok()
        );
        // f16 needs only 2-byte alignment.
        assert!(
            plan_batched(
                WeightDtype::F16,
                &BatchedMatmul {
                    b: B + 2,
                    ..scores()
                }
            )
            .is_ok()
        );
    }
}
