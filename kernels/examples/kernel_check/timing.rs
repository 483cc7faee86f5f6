//! Timing: gemv with CUDA events over rotating weight buffers, the device-to-device copy
//! that anchors the bandwidths, and the median.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, CudaStream};
use modelshare_kernels::{KernelCache, gemv};

use crate::error::Res;
use crate::gemv_cases::GemvCase;
use crate::host_data::par_fill;

pub const TIMED_RUNS: usize = 50;
pub const WARMUP_RUNS: usize = 5;

/// Median seconds of one gemv, timed with events, rotating through `w_ptrs`.
pub fn time_gemv(
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
pub fn d2d_bandwidth(stream: &Arc<CudaStream>) -> Res<f64> {
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

pub fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(f64::NAN)
}
