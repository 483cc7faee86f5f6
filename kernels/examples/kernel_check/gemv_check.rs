//! One gemv case on the device: y poisoned with NaN and guarded past its end, the launch, the
//! verdict, the timing of the large shapes, and its line of the table.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use modelshare_kernels::{KernelCache, WeightDtype, gemv};

use crate::error::Res;
use crate::gemv_cases::GemvCase;
use crate::gemv_reference::{GUARD_BITS, HostGemv, Y_GUARD, host_gemv, verdict};
use crate::timing::time_gemv;

pub struct GemvResult {
    pub dtype: WeightDtype,
    pub rows: usize,
    pub cols: usize,
    pub w_offset: usize,
    pub x_offset: usize,
    /// The layout the launcher picked.
    pub layout: String,
    pub rel_err: f64,
    pub unwritten: usize,
    pub guard_hit: usize,
    pub ok: bool,
    pub median_us: Option<f64>,
    pub gbps: Option<f64>,
}

/// One line of the gemv table.
pub fn print_gemv(r: &GemvResult) {
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

pub fn check_gemv(
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
