//! What the checks run in: the device (kernel cache, stream, cuBLAS), one shape's context,
//! the LayerNorm ε, and the error type.

use std::error::Error;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use modelshare_kernels::{Blas, KernelCache, WeightDtype};

use crate::shape::Shape;

/// Why the check could not run (`main` prints it and exits 2).
pub type Res<T> = Result<T, Box<dyn Error>>;

/// The LayerNorm ε of every check.
pub const EPS: f32 = 1e-12;

/// The device the checks run on: the kernel cache, the stream and cuBLAS on it.
pub struct Env {
    pub cache: KernelCache,
    pub stream: Arc<CudaStream>,
    pub blas: Blas,
}

/// What each piece check of one shape takes: the environment, the dtype, the shape and its
/// label.
pub struct Pieces<'a> {
    pub env: &'a Env,
    pub dtype: WeightDtype,
    pub s: &'a Shape,
    pub label: String,
}
