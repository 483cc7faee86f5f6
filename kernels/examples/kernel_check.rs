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

use std::error::Error;
use std::fmt::Write as _;
use std::ops::Range;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use half::{bf16, f16};
use modelshare_kernels::reference::{self, splitmix64};
use modelshare_kernels::{KernelCache, WeightDtype, checksum, gemv, sys};

type Res<T> = Result<T, Box<dyn Error>>;

/// Per element, |y − ref| ≤ TOLERANCE_EPS · ε(f32) · √cols · Σ|w·x|: f32 accumulation error
/// grows like √cols relative to the sum of the magnitudes (a norm-relative test is
/// ill-conditioned for a single long row whose terms nearly cancel). A dropped element of a
/// 4097-column row (≈2.4e-4 of Σ|w·x|) is ~4× over this bound.
const TOLERANCE_EPS: f64 = 8.0;
const TIMED_RUNS: usize = 50;
const WARMUP_RUNS: usize = 5;
/// Elements past the end of y, poisoned with a sentinel that must survive.
const Y_GUARD: usize = 64;
const GUARD_BITS: u32 = 0x7fc0_dead;

struct GemvCase {
    dtype: WeightDtype,
    rows: usize,
    cols: usize,
    /// Elements W starts past a 256-byte aligned allocation.
    w_offset: usize,
    /// Floats x starts past a 256-byte aligned allocation.
    x_offset: usize,
    timed: bool,
}

struct GemvResult {
    dtype: WeightDtype,
    rows: usize,
    cols: usize,
    w_offset: usize,
    x_offset: usize,
    /// The layout the launcher picked.
    layout: String,
    rel_err: f64,
    unwritten: usize,
    guard_hit: usize,
    ok: bool,
    median_us: Option<f64>,
    gbps: Option<f64>,
}

struct Ms64Result {
    len: usize,
    offset: usize,
    gpu: u64,
    cpu: u64,
    gbps: Option<f64>,
}

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

/// The gemv cases of every dtype: odd and large shapes, offset buffers, and the timed ones.
fn gemv_cases() -> Vec<GemvCase> {
    let mut cases = Vec::new();
    for dtype in [WeightDtype::F32, WeightDtype::F16, WeightDtype::BF16] {
        let case = |rows, cols, w_offset, x_offset, timed| GemvCase {
            dtype,
            rows,
            cols,
            w_offset,
            x_offset,
            timed,
        };
        for (rows, cols) in [
            (1, 1),
            (1, 7),
            (3, 5),
            (1, 4097),
            (1, 1 << 20),
            (7, 4096),
            (33, 4097),
            (4097, 33),
            (1000, 1024),
            (5000, 4097),
            (4096, 4096),
            (5, 0),
        ] {
            cases.push(case(rows, cols, 0, 0, false));
        }
        cases.push(case(257, 4099, 1, 1, false));
        cases.push(case(4500, 999, 3, 2, false));
        cases.push(case(1, 100_000, 1, 3, false));
        // Timed: the large shapes, plus a few of the other layouts' (see GemvLayout).
        match dtype {
            WeightDtype::F32 => {
                cases.push(case(4096, 4096, 0, 0, true));
                cases.push(case(8192, 16384, 0, 0, true));
            }
            WeightDtype::F16 | WeightDtype::BF16 => {
                cases.push(case(4096, 4096, 0, 0, true));
                cases.push(case(11008, 4096, 0, 0, true));
                cases.push(case(2048, 16384, 0, 0, true));
                cases.push(case(8192, 8199, 0, 0, true));
                cases.push(case(8192, 8192, 0, 0, true));
                cases.push(case(16384, 16384, 0, 0, true));
            }
        }
    }
    cases
}

/// One line of the gemv table.
fn print_gemv(r: &GemvResult) {
    println!(
        "gemv {:>4} {:>5}x{:<7} w+{} x+{} {:<11} rel_err {:.2e}  unwritten {}  guard {}  {}{}",
        r.dtype.name(),
        r.rows,
        r.cols,
        r.w_offset,
        r.x_offset,
        r.layout,
        r.rel_err,
        r.unwritten,
        r.guard_hit,
        if r.ok { "ok" } else { "MISMATCH" },
        r.median_us
            .zip(r.gbps)
            .map(|(us, g)| format!("  {us:.1} us  {g:.0} GB/s"))
            .unwrap_or_default()
    );
}

/// The ms64 checks and timings, for the summary.
struct Ms64Run {
    results: Vec<Ms64Result>,
    /// The GPU's throughput on 1 GiB.
    gpu_gbps: f64,
    /// The CPU's, on one thread and on all.
    cpu1_gbps: f64,
    cpun_gbps: f64,
    /// Whether one thread and all agree.
    cpu_consistent: bool,
}

/// ms64 on the GPU against the CPU, at every length and offset of a 1 GiB random buffer
/// (filled from `seed`), then the throughput of both; prints the results.
fn check_ms64(
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

/// The disk cache, read back by a second cache over `cache_dir` (removed afterwards): whether
/// it loaded from disk without compiling.
fn check_disk_cache(
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

/// The timed table against the d2d copy, the counts, and the JSON line.
fn print_summary(
    device: &str,
    gemv_results: &[GemvResult],
    ms64: &Ms64Run,
    d2d_gbps: f64,
    disk_ok: bool,
) {
    let gpu_gbps = ms64.gpu_gbps;
    println!();
    println!("| gemv | rows x cols | layout | rel err | time (us) | GB/s | % of d2d |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for r in gemv_results.iter().filter(|r| r.gbps.is_some()) {
        let g = r.gbps.unwrap_or(0.0);
        println!(
            "| {} | {}x{} | {} | {:.1e} | {:.1} | {:.0} | {:.0}% |",
            r.dtype.name(),
            r.rows,
            r.cols,
            r.layout,
            r.rel_err,
            r.median_us.unwrap_or(0.0),
            g,
            100.0 * g / d2d_gbps
        );
    }
    println!("| d2d copy 1 GiB | | | | | {d2d_gbps:.0} | 100% |");
    println!(
        "| ms64 gpu 1 GiB | | | | | {gpu_gbps:.0} | {:.0}% |",
        100.0 * gpu_gbps / d2d_gbps
    );
    println!(
        "gemv: {}/{} ok; ms64: {}/{} ok; cache: {}",
        gemv_results.iter().filter(|r| r.ok).count(),
        gemv_results.len(),
        ms64.results.iter().filter(|r| r.gpu == r.cpu).count(),
        ms64.results.len(),
        if disk_ok { "ok" } else { "MISMATCH" }
    );
    println!(
        "{}",
        json_line(
            device,
            gemv_results,
            &ms64.results,
            d2d_gbps,
            ms64.cpu1_gbps,
            ms64.cpun_gbps
        )
    );
}

fn check_gemv(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    case: &GemvCase,
    seed: u64,
    threads: usize,
    l2_bytes: usize,
) -> Res<GemvResult> {
    let (rows, cols) = (case.rows, case.cols);
    let es = case.dtype.size_bytes();
    let HostGemv {
        x,
        w_bytes,
        reference,
        scale,
    } = host_gemv(case, seed, threads);

    let w_off = case.w_offset * es;
    let mut w_dev: CudaSlice<u8> = stream.alloc_zeros(w_bytes.len() + w_off + 16)?;
    stream.memcpy_htod(&w_bytes, &mut w_dev.slice_mut(w_off..w_off + w_bytes.len()))?;
    let mut x_dev: CudaSlice<f32> = stream.alloc_zeros(cols + case.x_offset + 4)?;
    stream.memcpy_htod(
        &x,
        &mut x_dev.slice_mut(case.x_offset..case.x_offset + cols),
    )?;
    let mut y_dev: CudaSlice<f32> = stream.alloc_zeros(rows + Y_GUARD)?;
    let mut poison = vec![f32::NAN; rows];
    poison.extend(std::iter::repeat_n(f32::from_bits(GUARD_BITS), Y_GUARD));
    stream.memcpy_htod(&poison, &mut y_dev)?;

    let w_ptr = w_dev.device_ptr(stream).0 + w_off as u64;
    let x_ptr = x_dev.device_ptr(stream).0 + 4 * case.x_offset as u64;
    let y_ptr = y_dev.device_ptr(stream).0;
    let sms = cache.device_info(stream.context())?.multiprocessors;
    let layout = match gemv::plan_gemv(case.dtype, w_ptr, x_ptr, y_ptr, rows, cols, sms)? {
        Some(plan) => match plan.layout {
            gemv::GemvLayout::Aligned { rows_per_warp } => format!("aligned/{rows_per_warp}"),
            gemv::GemvLayout::Warp => "warp".to_owned(),
            gemv::GemvLayout::Block => "block".to_owned(),
        },
        None => "none".to_owned(),
    };
    // SAFETY: w_dev, x_dev and y_dev live on this stream's device and hold rows * cols * es
    // bytes past w_ptr, cols floats past x_ptr and rows floats past y_ptr.
    unsafe { gemv::gemv(cache, stream, case.dtype, w_ptr, x_ptr, y_ptr, rows, cols) }?;
    let y = stream.clone_dtoh(&y_dev)?;
    stream.synchronize()?;

    let (unwritten, guard_hit, rel_err, ok) = verdict(&y, rows, cols, &reference, &scale);

    let (median_us, gbps) = if case.timed {
        // Enough weight buffers that together they are 3× L2: each run reads W from DRAM.
        let w_total = w_bytes.len().max(1);
        let copies = (3 * l2_bytes).div_ceil(w_total).clamp(2, 16);
        let mut extra = Vec::new();
        for _ in 1..copies {
            let mut c: CudaSlice<u8> = stream.alloc_zeros(w_dev.len())?;
            stream.memcpy_dtod(&w_dev, &mut c)?;
            extra.push(c);
        }
        let mut ptrs = vec![w_ptr];
        ptrs.extend(extra.iter().map(|c| c.device_ptr(stream).0 + w_off as u64));
        let t = time_gemv(cache, stream, case, &ptrs, x_ptr, y_ptr)?;
        let moved = (w_bytes.len() + 4 * cols + 4 * rows) as f64;
        (Some(t * 1e6), Some(moved / t / 1e9))
    } else {
        (None, None)
    };
    Ok(GemvResult {
        dtype: case.dtype,
        rows,
        cols,
        w_offset: case.w_offset,
        x_offset: case.x_offset,
        layout,
        rel_err,
        unwritten,
        guard_hit,
        ok,
        median_us,
        gbps,
    })
}

/// The host side of one gemv case: x, W as uploaded, the reference product and each row's
/// error scale.
struct HostGemv {
    x: Vec<f32>,
    w_bytes: Vec<u8>,
    reference: Vec<f32>,
    scale: Vec<f32>,
}

/// x and W for `case` (random from `seed`), W's bytes, and the reference computed from the
/// same values.
fn host_gemv(case: &GemvCase, seed: u64, threads: usize) -> HostGemv {
    let (rows, cols) = (case.rows, case.cols);
    let n = rows * cols;
    // An unrelated stream for x: W's rows must not be shifted copies of x.
    let x = par_fill(cols, splitmix64(seed ^ 0x5555), threads, unit);
    // W uploaded as bytes, and the reference computed from the same values.
    // Σ_j |w_ij · x_j| per row: the scale of row i's rounding error.
    let abs_sums = |wf: &(dyn Fn(usize) -> f32 + Sync)| -> Vec<f32> {
        par_rows(rows, threads, |r| {
            r.map(|i| {
                (0..cols)
                    .map(|j| f64::from(wf(i * cols + j)).abs() * f64::from(x[j]).abs())
                    .sum::<f64>() as f32
            })
            .collect()
        })
    };
    let (w_bytes, reference, scale): (Vec<u8>, Vec<f32>, Vec<f32>) = match case.dtype {
        WeightDtype::F32 => {
            let w = par_fill(n, seed, threads, unit);
            let y = par_rows(rows, threads, |r| {
                reference::gemv_f32(&w[r.start * cols..r.end * cols], &x, r.len(), cols)
            });
            let scale = abs_sums(&|k| w[k]);
            (par_bytes(&w, threads, |v| v.to_le_bytes()), y, scale)
        }
        WeightDtype::F16 => {
            let w = par_fill(n, seed, threads, |r| f16::from_f32(unit(r)));
            let y = par_rows(rows, threads, |r| {
                reference::gemv_f16(&w[r.start * cols..r.end * cols], &x, r.len(), cols)
            });
            let scale = abs_sums(&|k| w[k].to_f32());
            (par_bytes(&w, threads, |v| v.to_le_bytes()), y, scale)
        }
        WeightDtype::BF16 => {
            let w = par_fill(n, seed, threads, |r| bf16::from_f32(unit(r)));
            let y = par_rows(rows, threads, |r| {
                reference::gemv_bf16(&w[r.start * cols..r.end * cols], &x, r.len(), cols)
            });
            let scale = abs_sums(&|k| w[k].to_f32());
            (par_bytes(&w, threads, |v| v.to_le_bytes()), y, scale)
        }
    };
    HostGemv {
        x,
        w_bytes,
        reference,
        scale,
    }
}

/// How the device's `y` (rows values, then the guard) compares with `reference`: (unwritten
/// values, guard values hit, relative error, whether it passes).
fn verdict(
    y: &[f32],
    rows: usize,
    cols: usize,
    reference: &[f32],
    scale: &[f32],
) -> (usize, usize, f64, bool) {
    let unwritten = y[..rows].iter().filter(|v| v.is_nan()).count();
    let guard_hit = y[rows..]
        .iter()
        .filter(|v| v.to_bits() != GUARD_BITS)
        .count();
    let rel_err = rel_err(&y[..rows], reference);
    let bound = TOLERANCE_EPS * f64::from(f32::EPSILON) * (cols as f64).sqrt();
    let within = y[..rows]
        .iter()
        .zip(reference)
        .zip(scale)
        .all(|((a, b), s)| {
            (f64::from(*a) - f64::from(*b)).abs() <= bound * f64::from(*s).max(f64::MIN_POSITIVE)
        });
    let ok = unwritten == 0 && guard_hit == 0 && rel_err.is_finite() && within;
    (unwritten, guard_hit, rel_err, ok)
}

/// Median seconds of one gemv, timed with events, rotating through `w_ptrs`.
fn time_gemv(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    case: &GemvCase,
    w_ptrs: &[u64],
    x: u64,
    y: u64,
) -> Res<f64> {
    let launch = |i: usize| -> Res<()> {
        let w = w_ptrs[i % w_ptrs.len()];
        // SAFETY: every pointer in w_ptrs is a live copy of W on this stream's device.
        unsafe { gemv::gemv(cache, stream, case.dtype, w, x, y, case.rows, case.cols) }?;
        Ok(())
    };
    for i in 0..WARMUP_RUNS {
        launch(i)?;
    }
    let mut events = Vec::with_capacity(TIMED_RUNS);
    for i in 0..TIMED_RUNS {
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        launch(i)?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        events.push((start, end));
    }
    stream.synchronize()?;
    let mut times = Vec::with_capacity(TIMED_RUNS);
    for (start, end) in &events {
        times.push(f64::from(start.elapsed_ms(end)?) / 1e3);
    }
    Ok(median(&mut times))
}

/// Device-to-device copy of 1 GiB, bytes read plus written over the median time.
fn d2d_bandwidth(stream: &Arc<CudaStream>) -> Res<f64> {
    let bytes = 1usize << 30;
    let src: CudaSlice<u8> = stream.clone_htod(&par_fill(bytes, 7, 16, |r| r as u8))?;
    let mut dst: CudaSlice<u8> = stream.alloc_zeros(bytes)?;
    for _ in 0..3 {
        stream.memcpy_dtod(&src, &mut dst)?;
    }
    let mut events = Vec::new();
    for _ in 0..20 {
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        stream.memcpy_dtod(&src, &mut dst)?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        events.push((start, end));
    }
    stream.synchronize()?;
    let mut times = Vec::new();
    for (start, end) in &events {
        times.push(f64::from(start.elapsed_ms(end)?) / 1e3);
    }
    Ok(2.0 * bytes as f64 / median(&mut times) / 1e9)
}

fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Uniform in [-1, 1) from 64 random bits.
fn unit(r: u64) -> f32 {
    ((r >> 40) as f32) * (1.0 / (1u64 << 23) as f32) - 1.0
}

/// `n` values `f(splitmix64(seed + i))`, filled by `threads` threads.
fn par_fill<T: Copy + Default + Send>(
    n: usize,
    seed: u64,
    threads: usize,
    f: impl Fn(u64) -> T + Sync,
) -> Vec<T> {
    let mut out = vec![T::default(); n];
    let share = n.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (k, chunk) in out.chunks_mut(share).enumerate() {
            let f = &f;
            s.spawn(move || {
                let first = (k * share) as u64;
                for (i, v) in chunk.iter_mut().enumerate() {
                    *v = f(splitmix64(seed.wrapping_add(first + i as u64)));
                }
            });
        }
    });
    out
}

/// The bytes of `values`, each as `f` writes it, converted by `threads` threads.
fn par_bytes<T: Sync, const N: usize>(
    values: &[T],
    threads: usize,
    f: impl Fn(&T) -> [u8; N] + Sync,
) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * N];
    let share = values.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (dst, src) in out.chunks_mut(share * N).zip(values.chunks(share)) {
            let f = &f;
            s.spawn(move || {
                for (d, v) in dst.chunks_exact_mut(N).zip(src) {
                    d.copy_from_slice(&f(v));
                }
            });
        }
    });
    out
}

/// `f` over row ranges on `threads` threads, concatenated.
fn par_rows(rows: usize, threads: usize, f: impl Fn(Range<usize>) -> Vec<f32> + Sync) -> Vec<f32> {
    let share = rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..rows)
            .step_by(share)
            .map(|start| {
                let f = &f;
                s.spawn(move || f(start..(start + share).min(rows)))
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

fn rel_err(y: &[f32], reference: &[f32]) -> f64 {
    if y.len() != reference.len() {
        return f64::INFINITY;
    }
    let mut diff = 0.0f64;
    let mut norm = 0.0f64;
    for (a, b) in y.iter().zip(reference) {
        let (a, b) = (f64::from(*a), f64::from(*b));
        diff += (a - b) * (a - b);
        norm += b * b;
    }
    if norm == 0.0 {
        diff.sqrt()
    } else {
        (diff / norm).sqrt()
    }
}

fn json_line(
    device: &str,
    gemv: &[GemvResult],
    ms64: &[Ms64Result],
    d2d_gbps: f64,
    cpu1_gbps: f64,
    cpun_gbps: f64,
) -> String {
    let num = |v: Option<f64>| v.map_or("null".to_owned(), |v| format!("{v:.3}"));
    let mut s = String::new();
    let _ = write!(
        s,
        "{{\"device\": \"{}\", \"gemv\": [",
        device.replace('"', "'")
    );
    for (i, r) in gemv.iter().enumerate() {
        let _ = write!(
            s,
            "{}{{\"dtype\": \"{}\", \"rows\": {}, \"cols\": {}, \"w_offset\": {}, \"x_offset\": {}, \
             \"layout\": \"{}\", \"rel_err\": {:e}, \"unwritten\": {}, \"ok\": {}, \"median_us\": {}, \"gbps\": {}}}",
            if i == 0 { "" } else { ", " },
            r.dtype.name(),
            r.rows,
            r.cols,
            r.w_offset,
            r.x_offset,
            r.layout,
            if r.rel_err.is_finite() {
                r.rel_err
            } else {
                -1.0
            },
            r.unwritten + r.guard_hit,
            r.ok,
            num(r.median_us),
            num(r.gbps)
        );
    }
    s.push_str("], \"ms64\": [");
    for (i, r) in ms64.iter().enumerate() {
        let _ = write!(
            s,
            "{}{{\"len\": {}, \"offset\": {}, \"gpu\": \"{:016x}\", \"cpu\": \"{:016x}\", \"ok\": {}, \"gbps\": {}}}",
            if i == 0 { "" } else { ", " },
            r.len,
            r.offset,
            r.gpu,
            r.cpu,
            r.gpu == r.cpu,
            num(r.gbps)
        );
    }
    let _ = write!(
        s,
        "], \"d2d_gbps\": {d2d_gbps:.1}, \"ms64_cpu_gbps_1thread\": {cpu1_gbps:.2}, \
         \"ms64_cpu_gbps_parallel\": {cpun_gbps:.2}}}"
    );
    s
}
