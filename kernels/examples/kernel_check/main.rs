//! GPU self-test of modelshare-kernels, run on a machine with a GPU:
//!
//! ```text
//! cargo run --release -p modelshare-kernels --example kernel_check
//! ```
//!
//! On device 0: gemv in f32, f16 and bf16 over many shapes (odd columns, one row, unaligned
//! pointers, zero columns, and large matrices) against the f64 CPU reference on fresh random
//! inputs, with y poisoned with NaN and guarded past its end; gemv bandwidth on the large
//! shapes (CUDA events, median of 50, rotating weight buffers so that L2 holds none), with
//! the device-to-device copy bandwidth measured in the same run as the anchor; ms64 on the
//! GPU against the CPU reference, aligned and not, and its throughput; the disk kernel cache
//! read back by a second cache. Prints a table, then one JSON line. Exits 1 on any mismatch,
//! 2 if the check could not run.
//!
//! Tolerance: ‖y − ref‖ / ‖ref‖ < 1e-5 for every dtype. The reference takes the same
//! (already f16/bf16-rounded) weights exactly, in f64, so the only error is the kernel's f32
//! accumulation, about 1e-7 · √(terms per thread); 1e-5 leaves 10× room and still catches a
//! dropped head or tail element of a 4097-column row (~2e-4).
//!
//! # Layout
//!
//! - `main.rs`: the order of the checks, the verdict and the exit code.
//! - `gemv_cases.rs`: the gemv shapes, offsets and dtypes checked, and which are timed.
//! - `gemv_reference.rs`: a case's host inputs, the f64 CPU reference, and the verdict on y.
//! - `gemv_check.rs`: one gemv case on the device (poisoned y, guard), and its table line.
//! - `ms64_check.rs`: the ms64 checksum on the GPU against the CPU, and its throughput.
//! - `disk_cache.rs`: the kernel cache read back from disk by a second cache.
//! - `timing.rs`: CUDA-event timing of gemv, the d2d copy anchor, the median.
//! - `report.rs`: the timed table, the counts and the JSON line.
//! - `host_data.rs`: random host data, filled and converted on all threads.
//! - `error.rs`: the error type.

mod disk_cache;
mod error;
mod gemv_cases;
mod gemv_check;
mod gemv_reference;
mod host_data;
mod ms64_check;
mod report;
mod timing;

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUdevice_attribute;
use modelshare_kernels::reference::splitmix64;
use modelshare_kernels::{KernelCache, sys};

use crate::disk_cache::check_disk_cache;
use crate::error::Res;
use crate::gemv_cases::gemv_cases;
use crate::gemv_check::{check_gemv, print_gemv};
use crate::ms64_check::check_ms64;
use crate::report::print_summary;
use crate::timing::d2d_bandwidth;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("kernel_check: FAILED (see the table above)");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("kernel_check: could not run: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Res<bool> {
    sys::driver_available()?;
    sys::nvrtc_available()?;
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let (major, minor) = ctx.compute_capability()?;
    let sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let l2 = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
    let device = ctx.name()?;
    println!(
        "device 0: {device}, sm_{major}{minor}, {sms} SMs, L2 {} MiB",
        l2 >> 20
    );

    let cache_dir = std::env::temp_dir().join(format!("kernel_check-cache-{}", std::process::id()));
    let cache = KernelCache::with_disk_dir(Some(cache_dir.clone()));
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut next_seed = move || {
        seed = splitmix64(seed);
        seed
    };

    // --- gemv correctness (and timing on the large shapes) ---
    let cases = gemv_cases();
    let mut gemv_results = Vec::new();
    for case in &cases {
        let r = check_gemv(&cache, &stream, case, next_seed(), threads, l2)?;
        print_gemv(&r);
        gemv_results.push(r);
    }

    // --- the anchor: device-to-device copy bandwidth ---
    let d2d_gbps = d2d_bandwidth(&stream)?;
    println!("d2d copy 1 GiB: {d2d_gbps:.0} GB/s (read + write)");

    let ms64 = check_ms64(&cache, &stream, next_seed(), threads)?;
    let disk_ok = check_disk_cache(&cache, &stream, &cache_dir)?;

    // --- verdict, table, JSON ---
    let gemv_ok = gemv_results.iter().all(|r| r.ok);
    let ms64_ok = ms64.results.iter().all(|r| r.gpu == r.cpu) && ms64.cpu_consistent;
    print_summary(&device, &gemv_results, &ms64, d2d_gbps, disk_ok);
    Ok(gemv_ok && ms64_ok && disk_ok)
}
