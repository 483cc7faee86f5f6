//! Whether the CUDA libraries cudarc loads at run time can be found, asked before the first
//! call that would load them (cudarc panics when a library it needs is missing).

use std::sync::OnceLock;

use crate::error::KernelError;

/// `Ok` if the CUDA driver library (`libcuda.so`) can be loaded.
///
/// Call this before `CudaContext::new`: cudarc panics when the driver is missing, this
/// returns [`KernelError::LibraryMissing`] naming the library instead. The answer is
/// looked up once per process.
pub fn driver_available() -> Result<(), KernelError> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to dlopen the library under its candidate
    // names and drops what it opened; it calls no function of the library.
    let present = *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(missing(
            "cuda",
            "is the NVIDIA driver installed? set LD_LIBRARY_PATH to the directory holding \
             libcuda.so.1 (e.g. /usr/lib/x86_64-linux-gnu or /usr/local/nvidia/lib64)",
        ))
    }
}

/// `Ok` if NVRTC (`libnvrtc.so`) can be loaded; it is needed only to compile a kernel that
/// is in no cache.
pub fn nvrtc_available() -> Result<(), KernelError> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: as in `driver_available`: a dlopen probe that calls nothing in the library.
    let present = *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(missing(
            "nvrtc",
            "install the CUDA toolkit's NVRTC and set LD_LIBRARY_PATH to the directory holding \
             it (e.g. /usr/local/cuda/lib64)",
        ))
    }
}

/// `Ok` if cuBLAS (`libcublas.so`) can be loaded; [`crate::blas::Blas::new`] asks this
/// first (cudarc panics on the first cuBLAS call when the library is missing).
pub fn cublas_available() -> Result<(), KernelError> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: as in `driver_available`: a dlopen probe that calls nothing in the library.
    let present = *PRESENT.get_or_init(|| unsafe { cudarc::cublas::sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(missing(
            "cublas",
            "install the CUDA toolkit's cuBLAS (libcublas and libcublasLt) and set \
             LD_LIBRARY_PATH to the directory holding it (e.g. /usr/local/cuda/lib64)",
        ))
    }
}

fn missing(name: &str, hint: &str) -> KernelError {
    let candidates = cudarc::get_lib_name_candidates(name);
    let library = candidates
        .first()
        .cloned()
        .unwrap_or_else(|| format!("lib{name}.so"));
    KernelError::LibraryMissing {
        library,
        hint: format!("{hint}; names tried: {}", candidates.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A missing library panics or gives an error that does not name it.
    #[test]
    fn missing_libraries_are_named_errors() {
        for (check, name) in [
            (driver_available as fn() -> Result<(), KernelError>, "cuda"),
            (nvrtc_available, "nvrtc"),
            (cublas_available, "cublas"),
        ] {
            match check() {
                Ok(()) => {}
                Err(KernelError::LibraryMissing { library, hint }) => {
                    assert!(library.contains(name), "{library}");
                    assert!(hint.contains("LD_LIBRARY_PATH"), "{hint}");
                }
                Err(other) => panic!("unexpected error {other}"),
            }
        }
    }
}
