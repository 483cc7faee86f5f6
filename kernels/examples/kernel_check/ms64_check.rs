//! The ms64 checksum on the GPU against the CPU reference, aligned and not, and the
//! throughput of both.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaStream, DevicePtr};
use modelshare_kernels::reference;
use modelshare_kernels::{KernelCache, checksum};

use crate::error::Res;
use crate::host_data::par_fill;
use crate::timing::{WARMUP_RUNS, median};

pub struct Ms64Result {
    pub len: usize,
    pub offset: usize,
    pub gpu: u64,
    pub cpu: u64,
    pub gbps: Option<f64>,
}

/// The ms64 checks and timings, for the summary.
pub struct Ms64Run {
    pub results: Vec<Ms64Result>,
    /// The GPU's throughput on 1 GiB.
    pub gpu_gbps: f64,
    /// The CPU's, on one thread and on all.
    pub cpu1_gbps: f64,
    pub cpun_gbps: f64,
    /// Whether one thread and all agree.
    pub cpu_consistent: bool,
}

/// ms64 on the GPU against the CPU, at every length and offset of a 1 GiB random buffer
/// (filled from `seed`), then the throughput of both; prints the results.
pub fn check_ms64(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    seed: u64,
    threads: usize,
) -> Res<Ms64Run> {
    let mut ms64_results = Vec::new();
    let big = (1usize << 30) + 3;
    let host = par_fill(big + 16, seed, threads, |r| r as u8);
    let dev = stream.clone_htod(&host)?;
    let base = dev.device_ptr(stream).0;
    for len in [0usize, 1, 7, 8, 9, 15, 16, 17, 4095, 1 << 20, big] {
        for offset in [0usize, 8, 1] {
            if offset > 0 && len > (1 << 20) + 1 {
                continue;
            }
            let bytes = &host[offset..offset + len];
            let cpu = reference::ms64_parallel(bytes, threads);
            // SAFETY: `dev` holds big + 16 bytes on this stream's device and offset + len fits.
            let gpu = unsafe { checksum::ms64(cache, stream, base + offset as u64, len) }?;
            ms64_results.push(Ms64Result {
                len,
                offset,
                gpu,
                cpu,
                gbps: None,
            });
        }
    }
    // Throughput on the 1 GiB buffer: host clock around the whole call (launch, kernel,
    // copy of the 8-byte sum, synchronize).
    let mut times = Vec::new();
    for i in 0..(WARMUP_RUNS + 20) {
        let t = Instant::now();
        // SAFETY: as above.
        let gpu = unsafe { checksum::ms64(cache, stream, base, big) }?;
        if i >= WARMUP_RUNS {
            times.push(t.elapsed().as_secs_f64());
        }
        if Some(gpu) != ms64_results.iter().find(|r| r.len == big).map(|r| r.gpu) {
            return Err("ms64 of the same bytes changed between runs".into());
        }
    }
    let gpu_gbps = big as f64 / median(&mut times) / 1e9;
    if let Some(r) = ms64_results.iter_mut().find(|r| r.len == big) {
        r.gbps = Some(gpu_gbps);
    }
    let t = Instant::now();
    let cpu1 = reference::ms64(&host[..big]);
    let cpu1_gbps = big as f64 / t.elapsed().as_secs_f64() / 1e9;
    let t = Instant::now();
    let cpun = reference::ms64_parallel(&host[..big], threads);
    let cpun_gbps = big as f64 / t.elapsed().as_secs_f64() / 1e9;
    let cpu_consistent = cpu1 == cpun;
    drop(dev);
    for r in &ms64_results {
        println!(
            "ms64 len {:>10} at +{}  gpu {:016x}  cpu {:016x}  {}{}",
            r.len,
            r.offset,
            r.gpu,
            r.cpu,
            if r.gpu == r.cpu { "ok" } else { "MISMATCH" },
            r.gbps.map(|g| format!("  {g:.0} GB/s")).unwrap_or_default()
        );
    }
    println!(
        "ms64 cpu on 1 GiB: {cpu1_gbps:.1} GB/s one thread, {cpun_gbps:.1} GB/s on {threads} \
         threads{}",
        if cpu_consistent {
            ""
        } else {
            "  MISMATCH between the two"
        }
    );
    Ok(Ms64Run {
        results: ms64_results,
        gpu_gbps,
        cpu1_gbps,
        cpun_gbps,
        cpu_consistent,
    })
}
