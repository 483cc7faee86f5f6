//! The ms64 launcher (`cuda/checksum.cu`): the checksum of device bytes, to compare with the
//! manifest's value that [`crate::reference::ms64`] computed on the host.

use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use crate::compile::{CHECKSUM_SOURCE, KernelCache};
use crate::error::KernelError;
use crate::gemv::check_range;
use crate::reference::MS64_LEN_MUL;

const BLOCK_THREADS: u32 = 256;
/// Loads in flight per thread in the kernel's main loop (`MS_UNROLL`).
const UNROLL: u64 = 4;
const BLOCKS_PER_SM: u64 = 8;

/// Blocks for an ms64 of `len` bytes at `ptr` on a device of `multiprocessors` SMs: enough
/// for one trip of the unrolled loop per thread, at most `BLOCKS_PER_SM` per SM.
pub fn ms64_blocks(ptr: u64, len: u64, multiprocessors: u32) -> u32 {
    let words = len / 8;
    // 16-byte aligned data is read two words per load.
    let items = if ptr.is_multiple_of(16) {
        words / 2
    } else {
        words
    };
    let cap = u64::from(multiprocessors.max(1)) * BLOCKS_PER_SM;
    items
        .div_ceil(u64::from(BLOCK_THREADS) * UNROLL)
        .clamp(1, cap) as u32
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The grid is empty (an invalid launch) or larger than the device holds.
    #[test]
    fn grid_is_never_empty_nor_oversized() {
        assert_eq!(ms64_blocks(0x1000, 1, 132), 1);
        assert_eq!(ms64_blocks(0x1000, 7, 132), 1);
        assert_eq!(ms64_blocks(0x1000, 16 * 1024, 132), 1);
        assert_eq!(ms64_blocks(0x1000, 16 * 1024 + 16, 132), 2);
        assert_eq!(ms64_blocks(0x1001, 8 * 1024 + 8, 132), 2);
        assert_eq!(ms64_blocks(0x1000, 1 << 30, 132), 132 * 8);
        assert_eq!(ms64_blocks(0x1000, u64::MAX, 0), 8);
    }
}
