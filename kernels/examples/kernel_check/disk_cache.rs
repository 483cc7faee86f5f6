//! The disk kernel cache, read back by a second cache.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use modelshare_kernels::KernelCache;

use crate::error::Res;

/// The disk cache, read back by a second cache over `cache_dir` (removed afterwards): whether
/// it loaded from disk without compiling.
pub fn check_disk_cache(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    cache_dir: &std::path::Path,
) -> Res<bool> {
    let before = cache.stats();
    let second = KernelCache::with_disk_dir(Some(cache_dir.to_path_buf()));
    let info = second.device_info(stream.context())?;
    for name in ["ms_gemv_f16_warp", "ms_gemv_bf16_block"] {
        second.function(
            stream.context(),
            &modelshare_kernels::compile::GEMV_SOURCE,
            name,
        )?;
    }
    let after = second.stats();
    let disk_ok = after.disk_hits == 1 && after.compiled == 0;
    println!(
        "kernel cache: first {:?}; second (same dir) {:?} -> {} (sm_{}{})",
        before,
        after,
        if disk_ok { "ok" } else { "MISMATCH" },
        info.major,
        info.minor
    );
    let _ = std::fs::remove_dir_all(cache_dir);
    Ok(disk_ok)
}
