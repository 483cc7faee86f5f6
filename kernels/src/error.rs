//! The crate's one error type.

use cudarc::cublas::result::CublasError;
use cudarc::driver::DriverError;

/// What can go wrong compiling, loading or launching a kernel.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A CUDA shared library (the driver, NVRTC or cuBLAS) could not be loaded.
    #[error("the CUDA library '{library}' could not be loaded: {hint}")]
    LibraryMissing {
        /// The library looked for, e.g. `libnvrtc.so`.
        library: String,
        /// What to do about it.
        hint: String,
    },
    /// NVRTC refused a kernel source; `log` is NVRTC's program log.
    #[error("nvrtc failed to compile kernel '{kernel}': {log}")]
    Nvrtc {
        /// The kernel source's name, e.g. `gemv.cu`.
        kernel: String,
        /// NVRTC's log (or its error when there is no log).
        log: String,
    },
    /// A CUDA driver call failed.
    #[error("cuda driver call failed: {0}")]
    Driver(#[from] DriverError),
    /// A cuBLAS call failed; `call` names it, e.g. `cublasGemmEx`.
    #[error("cublas call {call} failed: {status}")]
    Cublas {
        /// The cuBLAS function.
        call: &'static str,
        /// Its status.
        #[source]
        status: CublasError,
    },
    /// A launcher was given sizes or pointers it cannot use.
    #[error("bad argument: {what}")]
    BadArgument {
        /// Which argument, and why.
        what: String,
    },
}

impl KernelError {
    pub(crate) fn bad(what: impl Into<String>) -> Self {
        Self::BadArgument { what: what.into() }
    }
}
