//! NVRTC: the options for a device and the compilation of a source to PTX.

use cudarc::nvrtc::{CompileError, CompileOptions};

use super::source::KernelSource;
use crate::error::KernelError;
use crate::sys::nvrtc_available;

/// The NVRTC options for a device of compute capability `major.minor`: its own virtual
/// architecture, C++17, and FMA contraction (NVRTC's default); no fast math, so division,
/// square roots and denormals stay IEEE.
pub fn compile_options(major: i32, minor: i32) -> Vec<String> {
    vec![
        format!("--gpu-architecture=compute_{major}{minor}"),
        "--std=c++17".to_owned(),
        "--fmad=true".to_owned(),
    ]
}

/// Compiles `source` with NVRTC and `options`, returning the PTX text.
///
/// Needs no device: only NVRTC. Its log comes back in [`KernelError::Nvrtc`].
pub fn compile_ptx(source: &KernelSource, options: &[String]) -> Result<String, KernelError> {
    nvrtc_available()?;
    let nvrtc_error = |log: String| KernelError::Nvrtc {
        kernel: source.name.to_owned(),
        log,
    };
    if source.code.contains('\0') {
        return Err(nvrtc_error("the source contains a NUL byte".into()));
    }
    let opts = CompileOptions {
        name: Some(source.name.to_owned()),
        options: options.to_vec(),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source.code, opts).map_err(|e| match e {
        CompileError::CompileError { nvrtc, log, .. } => {
            nvrtc_error(format!("{nvrtc:?}: {}", log.to_string_lossy().trim_end()))
        }
        other => nvrtc_error(format!("{other:?}")),
    })?;
    let bytes = ptx
        .as_bytes()
        .ok_or_else(|| nvrtc_error("nvrtc returned no PTX image".into()))?;
    let text = bytes.split(|b| *b == 0).next().unwrap_or_default();
    String::from_utf8(text.to_vec()).map_err(|_| nvrtc_error("nvrtc returned non-UTF-8 PTX".into()))
}
