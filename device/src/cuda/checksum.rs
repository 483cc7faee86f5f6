//! The ms64 kernel of the CUDA backend ([`crate::checksum`] defines ms64 and holds the CUDA C
//! source): compiled with NVRTC for the device's own architecture when the backend opens,
//! loaded into its context, and run on the device thread over an arena's tensors after a load.

use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::{CompileOptions, Ptx};

use super::sys;
use crate::checksum::{MS64_LEN_MUL, ms64_blocks};
use crate::error::{DeviceError, Result};

/// The compiled `ms64_sum` kernel of one context.
#[derive(Debug)]
pub(crate) struct Ms64Kernel {
    func: CudaFunction,
    multiprocessors: u32,
}

fn kernel_err(what: impl std::fmt::Display) -> DeviceError {
    DeviceError::Kernel(what.to_string())
}

impl Ms64Kernel {
    /// Compiles and loads the kernel in `ctx`. Fails (naming the library) without NVRTC.
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        if !sys::nvrtc_present() {
            return Err(DeviceError::LibraryMissing {
                library: "libnvrtc.so (CUDA NVRTC)".into(),
                hint: "install the CUDA toolkit's NVRTC and add its directory (e.g. /usr/local/cuda/lib64) to LD_LIBRARY_PATH".into(),
            });
        }
        let (major, minor) = ctx.compute_capability().map_err(kernel_err)?;
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(kernel_err)?;
        let opts = CompileOptions {
            name: Some("checksum.cu".into()),
            options: vec![
                format!("--gpu-architecture=compute_{major}{minor}"),
                "--std=c++17".into(),
            ],
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(crate::checksum::CUDA_SOURCE, opts)
            .map_err(|e| kernel_err(format!("compiling checksum.cu: {e:?}")))?;
        let ptx = ptx
            .as_bytes()
            .and_then(|b| b.split(|c| *c == 0).next())
            .and_then(|b| std::str::from_utf8(b).ok())
            .map(str::to_owned)
            .ok_or_else(|| kernel_err("nvrtc returned no PTX for checksum.cu"))?;
        let module = ctx.load_module(Ptx::from_src(ptx)).map_err(kernel_err)?;
        let func = module.load_function("ms64_sum").map_err(kernel_err)?;
        Ok(Self {
            func,
            multiprocessors: u32::try_from(sms).unwrap_or(1).max(1),
        })
    }

    /// The ms64 of each `(offset, len)` range of `mem`, computed on `stream` (waits for it once).
    pub(crate) fn run_many(
        &self,
        stream: &Arc<CudaStream>,
        mem: &sys::DeviceMemory,
        ranges: &[(u64, u64)],
    ) -> Result<Vec<u64>> {
        let launches: Vec<(u64, u64, u32)> = ranges
            .iter()
            .map(|&(offset, len)| {
                let blocks = ms64_blocks(mem.ptr() + offset, len, self.multiprocessors);
                (offset, len, blocks)
            })
            .collect();
        let words = sys::launch_ms64_many(stream, &self.func, mem, &launches)?;
        Ok(ranges
            .iter()
            .zip(words)
            .map(|(&(_, len), w)| {
                if len == 0 {
                    0
                } else {
                    len.wrapping_mul(MS64_LEN_MUL).wrapping_add(w)
                }
            })
            .collect())
    }
}
