//! The ms64 launcher (`modelshare_device::checksum::CUDA_SOURCE`): the checksum of device bytes, to compare with the
//! manifest's value that [`crate::reference::ms64`] computed on the host.

use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use crate::compile::{CHECKSUM_SOURCE, KernelCache};
use crate::error::KernelError;
use crate::gemv::check_range;
use crate::reference::MS64_LEN_MUL;

pub use modelshare_device::checksum::{BLOCK_THREADS, ms64_blocks};

/// The ms64 of the `len` bytes at device pointer `ptr`, computed on `stream`'s device.
///
/// Enqueues the kernel on `stream`, waits for it (a stream synchronize) and returns the sum.
/// Equal to [`crate::reference::ms64`] of the same bytes; `len == 0` gives 0 without touching
/// the device. Any alignment of `ptr` works; 16-byte aligned data is read fastest.
///
/// # Safety
///
/// `ptr` must be a device pointer valid on `stream`'s device for `len` bytes, readable until
/// the kernel completes, and nothing may write those bytes while it runs.
pub unsafe fn ms64(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    ptr: u64,
    len: usize,
) -> Result<u64, KernelError> {
    if len == 0 {
        return Ok(0);
    }
    let len = len as u64;
    check_range("ms64 input", ptr, len, 1)?;
    let ctx = stream.context();
    let info = cache.device_info(ctx)?;
    let f = cache.function(ctx, &CHECKSUM_SOURCE, "ms64_sum")?;
    let mut sum = stream.alloc_zeros::<u64>(1)?;
    let cfg = LaunchConfig {
        grid_dim: (ms64_blocks(ptr, len, info.multiprocessors), 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = stream.launch_builder(&f);
    launch.arg(&ptr).arg(&len).arg(&mut sum);
    // SAFETY: the arguments match `ms64_sum(const unsigned char*, unsigned long long,
    // unsigned long long*)`; `sum` is a live one-element device allocation on this stream,
    // and the caller promised `ptr` is valid for `len` bytes on this stream's device.
    unsafe { launch.launch(cfg) }?;
    let host = stream.clone_dtoh(&sum)?;
    stream.synchronize()?;
    let words = host.first().copied().ok_or_else(|| {
        KernelError::bad("ms64: the device returned an empty sum buffer".to_owned())
    })?;
    Ok(len.wrapping_mul(MS64_LEN_MUL).wrapping_add(words))
}
