//! The ms64 checksum kernel launched over many ranges of an allocation, with one
//! synchronization for them all.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DriverError};

use super::common::check;
use super::memory::DeviceMemory;
use crate::error::{DeviceError, Result};

/// Launches `ms64_sum` once per range of `mem` (`(offset, len, blocks)`), each summing into its
/// own word of one device buffer, all on `stream`, then waits once and returns the words (one
/// synchronization for a whole manifest, not one per tensor).
pub fn launch_ms64_many(
    stream: &Arc<CudaStream>,
    func: &cudarc::driver::CudaFunction,
    mem: &DeviceMemory,
    ranges: &[(u64, u64, u32)],
) -> Result<Vec<u64>> {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    let kernel = |e: DriverError| DeviceError::Kernel(format!("ms64: {e}"));
    if ranges.is_empty() {
        return Ok(Vec::new());
    }
    let mut sums = stream.alloc_zeros::<u64>(ranges.len()).map_err(kernel)?;
    for (i, &(offset, len, blocks)) in ranges.iter().enumerate() {
        let n = usize::try_from(len).map_err(|_| DeviceError::OutOfRange {
            op: "checksum",
            offset,
            len,
            arena_len: mem.len,
        })?;
        check("checksum", offset, n, mem.len)?;
        if len == 0 {
            continue;
        }
        let ptr = mem.ptr + offset;
        let cfg = LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (crate::checksum::BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut sum = sums.slice_mut(i..i + 1);
        let mut launch = stream.launch_builder(func);
        launch.arg(&ptr).arg(&len).arg(&mut sum);
        // SAFETY: the arguments match `ms64_sum(const unsigned char*, unsigned long long,
        // unsigned long long*)`; `sum` is one live element of an allocation on this stream, and
        // the range `[ptr, ptr + len)` lies inside the live allocation `mem` (checked above).
        unsafe { launch.launch(cfg) }.map_err(kernel)?;
    }
    let host = stream.clone_dtoh(&sums).map_err(kernel)?;
    stream.synchronize().map_err(kernel)?;
    if host.len() != ranges.len() {
        return Err(DeviceError::Kernel(
            "ms64: the device returned a short sum buffer".into(),
        ));
    }
    Ok(host)
}
