//! Tuning lab for the gemv kernels, run on a GPU machine:
//!
//! ```text
//! cargo run --release -p modelshare-kernels --example gemv_lab
//! ```
//!
//! Times variants of the gemv kernel on large shapes (CUDA events, median of 50, weight
//! buffers rotated so that L2 holds none) next to the production launch and the
//! device-to-device copy bandwidth, and checks each variant's output against the production
//! kernel's. Variants: rows per warp (`R`, x reused across R rows), 16-byte loads in flight
//! per lane and row (`U`), grid uncapped or one wave of resident blocks. Lab kernels assume
//! 16-byte aligned rows (cols a multiple of 8) — the shapes here are.
//!
//! # Notes (H100 80GB HBM3, driver 580, CUDA 13.0; d2d copy 2985-3004 GB/s read+write)
//!
//! First version (one warp per row, head/body/tail, U = 4, grid capped at 8 blocks/SM):
//! f32 8192x16384 2802 GB/s (94%), f16 16384² 2440 (82%), f16 8192² 2156 (72%).
//! - The cap was the biggest loss: 5-6 blocks fit per SM, so 8/SM left a partial second
//!   wave. Uncapped, the same kernel: f16 16384² 2830 (95%); f16 8192² unchanged (72%).
//! - Per 16 bytes of f16 W a lane reads 32 bytes of x (two float4 across a 1 KiB warp
//!   span): twice the L1 traffic of f32. Two rows per warp sharing each x load:
//!   R2 U2 f16 16384² 2967 (99%, one resident wave) / 2849 (95%, uncapped), 8192² 2752
//!   (92%); R2 U4 2972 (100%) / 2664 (89%); R4 U2 2984 (100%) / 2693 (90%); R4 U4 (96
//!   registers) 2942 / 2621. One row: R1 U4 2921 (98%) / 2495 (84%); R1 U8 2764 / 2602.
//! - f32: R1 U4 (32 registers, no head/tail) 2982 (100%); R2 U4 2721 (91%); R1 U8 2828.
//! - Chosen: f16/bf16 R2 U2, f32 R1 U4, as the aligned fast path of `cuda/gemv.cu`, grid
//!   one wave of resident blocks (the driver's occupancy); the general kernel stays for
//!   unaligned rows.
//! - Then, through the crate's launcher (kernel_check, d2d 3011 GB/s): f32 8192x16384 2977
//!   GB/s (99%), 4096² 2466 (82%); f16 16384² 2980 (99%), 8192² 2811 (93%), 11008x4096 2429
//!   (81%: 5504 row pairs over 5280 resident warps leave a tail of one pair), 2048x16384
//!   (block per row) 2248 (75%), 4096² (block) 1915 (64%, 17.5 us: launch and ramp), 8192x8199
//!   (unaligned rows, general kernel) 1692 (56%); bf16 within 2% of f16.

use std::error::Error;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use modelshare_kernels::compile::GEMV_SOURCE;
use modelshare_kernels::reference::splitmix64;
use modelshare_kernels::{KernelCache, KernelSource, WeightDtype, gemv};

type Res<T> = Result<T, Box<dyn Error>>;

const LAB: KernelSource = KernelSource {
    name: "gemv_lab.cu",
    code: r#"
typedef unsigned long long u64;
__device__ __forceinline__ uint4 ld16(const uint4* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
__device__ __forceinline__ void h2f(unsigned v, float& a, float& b) {
    asm("{\n\t.reg .f16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
        : "=f"(a), "=f"(b) : "r"(v));
}
struct F32 { typedef float T; enum { VEC = 4 };
  static __device__ __forceinline__ float dot(uint4 r, const float* xs) {
    return fmaf(__uint_as_float(r.z), xs[2], __uint_as_float(r.x) * xs[0])
         + fmaf(__uint_as_float(r.w), xs[3], __uint_as_float(r.y) * xs[1]);
  } };
struct F16 { typedef unsigned short T; enum { VEC = 8 };
  static __device__ __forceinline__ float dot(uint4 r, const float* xs) {
    float w[8];
    h2f(r.x, w[0], w[1]); h2f(r.y, w[2], w[3]); h2f(r.z, w[4], w[5]); h2f(r.w, w[6], w[7]);
    float s0 = w[0] * xs[0], s1 = w[1] * xs[1];
    s0 = fmaf(w[2], xs[2], s0); s1 = fmaf(w[3], xs[3], s1);
    s0 = fmaf(w[4], xs[4], s0); s1 = fmaf(w[5], xs[5], s1);
    s0 = fmaf(w[6], xs[6], s0); s1 = fmaf(w[7], xs[7], s1);
    return s0 + s1;
  } };
struct BF16 { typedef unsigned short T; enum { VEC = 8 };
  static __device__ __forceinline__ float dot(uint4 r, const float* xs) {
    float s0 = __uint_as_float(r.x << 16) * xs[0], s1 = __uint_as_float(r.x & 0xffff0000u) * xs[1];
    s0 = fmaf(__uint_as_float(r.y << 16), xs[2], s0); s1 = fmaf(__uint_as_float(r.y & 0xffff0000u), xs[3], s1);
    s0 = fmaf(__uint_as_float(r.z << 16), xs[4], s0); s1 = fmaf(__uint_as_float(r.z & 0xffff0000u), xs[5], s1);
    s0 = fmaf(__uint_as_float(r.w << 16), xs[6], s0); s1 = fmaf(__uint_as_float(r.w & 0xffff0000u), xs[7], s1);
    return s0 + s1;
  } };
template <class E, int R, int U>
__device__ __forceinline__ void lab(const typename E::T* __restrict__ w, const float* __restrict__ x,
                                    float* __restrict__ y, long long rows, int cols) {
  const int lane = threadIdx.x & 31;
  const long long wpb = blockDim.x >> 5;
  const long long groups = (rows + R - 1) / R;
  const int nvec = cols / E::VEC;
  for (long long g = blockIdx.x * wpb + (threadIdx.x >> 5); g < groups; g += gridDim.x * wpb) {
    const uint4* wr[R];
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      long long row = g * R + r; if (row >= rows) row = rows - 1;
      wr[r] = reinterpret_cast<const uint4*>(w + row * (long long)cols);
      acc[r] = 0.0f;
    }
    for (int v0 = lane; v0 < nvec; v0 += 32 * U) {
      uint4 q[U][R];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int v = v0 + u * 32;
#pragma unroll
        for (int r = 0; r < R; ++r) q[u][r] = v < nvec ? ld16(wr[r] + v) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int v = v0 + u * 32;
        if (v < nvec) {
          float xs[E::VEC];
#pragma unroll
          for (int k = 0; k < E::VEC / 4; ++k) {
            const float4 t = __ldg(reinterpret_cast<const float4*>(x + (long long)v * E::VEC) + k);
            xs[4 * k] = t.x; xs[4 * k + 1] = t.y; xs[4 * k + 2] = t.z; xs[4 * k + 3] = t.w;
          }
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r] += E::dot(q[u][r], xs);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float a = acc[r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lane == 0 && g * R + r < rows) y[g * R + r] = a;
    }
  }
}
#define LAB(E, R, U) extern "C" __global__ void __launch_bounds__(256) \
  lab_##E##_r##R##_u##U(const E::T* w, const float* x, float* y, long long rows, int cols) { lab<E, R, U>(w, x, y, rows, cols); }
LAB(F32, 1, 4) LAB(F32, 2, 4) LAB(F32, 1, 8)
LAB(F16, 1, 4) LAB(F16, 1, 8) LAB(F16, 2, 2) LAB(F16, 2, 4) LAB(F16, 4, 2) LAB(F16, 4, 4)
LAB(BF16, 1, 4) LAB(BF16, 2, 4) LAB(BF16, 4, 2)
"#,
};

/// The shapes timed, each with the lab variants tried on it.
type LabShape = (WeightDtype, usize, usize, &'static [&'static str]);

fn main() -> Res<()> {
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let cache = KernelCache::in_memory();
    let info = cache.device_info(&ctx)?;
    println!(
        "{} sm_{}{} {} SMs",
        ctx.name()?,
        info.major,
        info.minor,
        info.multiprocessors
    );
    let d2d = d2d(&stream)?;
    println!("d2d {d2d:.0} GB/s");
    let lab = Lab {
        ctx: &ctx,
        stream: &stream,
        cache: &cache,
        multiprocessors: info.multiprocessors,
        d2d,
    };
    println!("| dtype | shape | variant | regs | us | GB/s | % d2d | max rel diff |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (dtype, rows, cols, variants) in lab_shapes() {
        time_shape(&lab, dtype, rows, cols, variants)?;
    }
    Ok(())
}

/// The shapes and the variants tried on each.
fn lab_shapes() -> [LabShape; 4] {
    [
        (
            WeightDtype::F32,
            8192,
            16384,
            &["lab_F32_r1_u4", "lab_F32_r2_u4", "lab_F32_r1_u8"],
        ),
        (
            WeightDtype::F16,
            16384,
            16384,
            &[
                "lab_F16_r1_u4",
                "lab_F16_r1_u8",
                "lab_F16_r2_u2",
                "lab_F16_r2_u4",
                "lab_F16_r4_u2",
                "lab_F16_r4_u4",
            ],
        ),
        (
            WeightDtype::F16,
            8192,
            8192,
            &[
                "lab_F16_r1_u4",
                "lab_F16_r1_u8",
                "lab_F16_r2_u2",
                "lab_F16_r2_u4",
                "lab_F16_r4_u2",
                "lab_F16_r4_u4",
            ],
        ),
        (
            WeightDtype::BF16,
            16384,
            16384,
            &["lab_BF16_r1_u4", "lab_BF16_r2_u4", "lab_BF16_r4_u2"],
        ),
    ]
}

/// What every timing takes: the device, its kernel cache and SM count, and the d2d copy
/// bandwidth the results are compared with.
struct Lab<'a> {
    ctx: &'a Arc<CudaContext>,
    stream: &'a Arc<CudaStream>,
    cache: &'a KernelCache,
    multiprocessors: u32,
    d2d: f64,
}

/// One shape's device buffers (by pointer: the weight copies rotated through, x, the
/// production and the lab outputs) and the bytes one run moves.
struct Case {
    dtype: WeightDtype,
    rows: usize,
    cols: usize,
    wp: Vec<u64>,
    xp: u64,
    yp: u64,
    yl: u64,
    moved: f64,
}

/// Fills the buffers of one shape, then times the production launch, the general kernel and
/// each of `variants` on them.
fn time_shape(
    lab: &Lab<'_>,
    dtype: WeightDtype,
    rows: usize,
    cols: usize,
    variants: &[&'static str],
) -> Res<()> {
    let stream = lab.stream;
    let bytes = rows * cols * dtype.size_bytes();
    let mut seed = 99u64;
    let fill: Vec<u8> = (0..bytes / 8)
        .flat_map(|_| {
            seed = splitmix64(seed);
            // Finite f32/f16/bf16 patterns: clear the exponent's top bits of every half.
            (seed & 0x3bff_3bff_3bff_3bff).to_le_bytes()
        })
        .collect();
    let xs: Vec<f32> = (0..cols)
        .map(|i| ((i * 7919 % 1000) as f32) / 500.0 - 1.0)
        .collect();
    let mut ws: Vec<CudaSlice<u8>> = Vec::new();
    for _ in 0..(3 * 50 * 1024 * 1024usize).div_ceil(bytes).clamp(2, 8) {
        ws.push(stream.clone_htod(&fill)?);
    }
    let x = stream.clone_htod(&xs)?;
    let mut y_prod: CudaSlice<f32> = stream.alloc_zeros(rows)?;
    let mut y_lab: CudaSlice<f32> = stream.alloc_zeros(rows)?;
    let wp: Vec<u64> = ws.iter().map(|w| w.device_ptr(stream).0).collect();
    let xp = x.device_ptr(stream).0;
    let yp = y_prod.device_ptr_mut_raw(stream);
    let yl = y_lab.device_ptr_mut_raw(stream);
    let moved = (bytes + 4 * cols + 4 * rows) as f64;
    let case = Case {
        dtype,
        rows,
        cols,
        wp,
        xp,
        yp,
        yl,
        moved,
    };

    let reference = time_production(lab, &case, &y_prod)?;
    time_general_warp(lab, &case, &y_lab, &reference)?;
    for name in variants {
        time_variant(lab, &case, name, &y_lab, &reference)?;
    }
    Ok(())
}

/// Production, as launched by the crate: prints its time and gives back its output (read
/// from `y_prod`), the reference of the others.
fn time_production(lab: &Lab<'_>, case: &Case, y_prod: &CudaSlice<f32>) -> Res<Vec<f32>> {
    let (stream, cache, d2d) = (lab.stream, lab.cache, lab.d2d);
    let (dtype, rows, cols, moved) = (case.dtype, case.rows, case.cols, case.moved);
    let (xp, yp) = (case.xp, case.yp);
    let t = time(stream, &case.wp, |w| {
        // SAFETY: w, x and y are live allocations of the sizes gemv needs.
        unsafe { gemv::gemv(cache, stream, dtype, w, xp, yp, rows, cols) }.map_err(Into::into)
    })?;
    let reference = stream.clone_dtoh(y_prod)?;
    println!(
        "| {} | {rows}x{cols} | production | | {:.1} | {:.0} | {:.0}% | |",
        dtype.name(),
        t * 1e6,
        moved / t / 1e9,
        100.0 * moved / t / 1e9 / d2d
    );
    Ok(reference)
}

/// The general (any alignment) warp-per-row kernel, uncapped grid (rows / 8 blocks), its
/// output (in `y_lab`) against `reference`.
fn time_general_warp(
    lab: &Lab<'_>,
    case: &Case,
    y_lab: &CudaSlice<f32>,
    reference: &[f32],
) -> Res<()> {
    let (ctx, stream, cache, d2d) = (lab.ctx, lab.stream, lab.cache, lab.d2d);
    let (dtype, rows, cols, moved) = (case.dtype, case.rows, case.cols, case.moved);
    let (xp, yl) = (case.xp, case.yl);
    let prod_name = match dtype {
        WeightDtype::F32 => "ms_gemv_f32_warp",
        WeightDtype::F16 => "ms_gemv_f16_warp",
        WeightDtype::BF16 => "ms_gemv_bf16_warp",
    };
    let f = cache.function(ctx, &GEMV_SOURCE, prod_name)?;
    let blocks = rows.div_ceil(8) as u32;
    let t = time(stream, &case.wp, |w| {
        launch(stream, &f, blocks, w, xp, yl, rows, cols)
    })?;
    let diff = max_rel_diff(&stream.clone_dtoh(y_lab)?, reference);
    println!(
        "| {} | {rows}x{cols} | general warp, {blocks} blocks | {} | {:.1} | {:.0} | {:.0}% | {diff:.1e} |",
        dtype.name(),
        regs(&f),
        t * 1e6,
        moved / t / 1e9,
        100.0 * moved / t / 1e9 / d2d
    );
    Ok(())
}

/// The lab kernel `name`, on a grid of one block per 8·R rows and on one wave of resident
/// blocks, its output (in `y_lab`) against `reference`.
fn time_variant(
    lab: &Lab<'_>,
    case: &Case,
    name: &'static str,
    y_lab: &CudaSlice<f32>,
    reference: &[f32],
) -> Res<()> {
    let (ctx, stream, cache, d2d) = (lab.ctx, lab.stream, lab.cache, lab.d2d);
    let (dtype, rows, cols, moved) = (case.dtype, case.rows, case.cols, case.moved);
    let (xp, yl) = (case.xp, case.yl);
    let f = cache.function(ctx, &LAB, name)?;
    let r: usize = name
        .split("_r")
        .nth(1)
        .and_then(|s| s[..1].parse().ok())
        .unwrap_or(1);
    for blocks in [
        rows.div_ceil(8 * r) as u32,
        lab.multiprocessors * occupancy(&f),
    ] {
        let t = time(stream, &case.wp, |w| {
            launch(stream, &f, blocks, w, xp, yl, rows, cols)
        })?;
        let diff = max_rel_diff(&stream.clone_dtoh(y_lab)?, reference);
        println!(
            "| {} | {rows}x{cols} | {name}, {blocks} blocks | {} | {:.1} | {:.0} | {:.0}% | {diff:.1e} |",
            dtype.name(),
            regs(&f),
            t * 1e6,
            moved / t / 1e9,
            100.0 * moved / t / 1e9 / d2d
        );
    }
    Ok(())
}

trait RawMut {
    fn device_ptr_mut_raw(&mut self, stream: &Arc<CudaStream>) -> u64;
}
impl<T> RawMut for CudaSlice<T> {
    fn device_ptr_mut_raw(&mut self, stream: &Arc<CudaStream>) -> u64 {
        use cudarc::driver::DevicePtrMut;
        self.device_ptr_mut(stream).0
    }
}

fn regs(f: &CudaFunction) -> i32 {
    f.get_attribute(cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)
        .unwrap_or(-1)
}

fn occupancy(f: &CudaFunction) -> u32 {
    f.occupancy_max_active_blocks_per_multiprocessor(256, 0, None)
        .map_or(1, |n| n.max(1))
}

#[allow(clippy::too_many_arguments)]
fn launch(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    blocks: u32,
    w: u64,
    x: u64,
    y: u64,
    rows: usize,
    cols: usize,
) -> Res<()> {
    let rows = rows as i64;
    let cols = cols as i32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(f);
    b.arg(&w).arg(&x).arg(&y).arg(&rows).arg(&cols);
    // SAFETY: the lab kernels take (w, x, y, long long rows, int cols) and the buffers are
    // live allocations of those sizes.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

fn time(stream: &Arc<CudaStream>, ws: &[u64], mut run: impl FnMut(u64) -> Res<()>) -> Res<f64> {
    for i in 0..5 {
        run(ws[i % ws.len()])?;
    }
    let mut ev = Vec::new();
    for i in 0..50 {
        let a = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        run(ws[i % ws.len()])?;
        let b = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        ev.push((a, b));
    }
    stream.synchronize()?;
    let mut t: Vec<f64> = ev
        .iter()
        .map(|(a, b)| a.elapsed_ms(b).map(|ms| f64::from(ms) / 1e3))
        .collect::<Result<_, _>>()?;
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn d2d(stream: &Arc<CudaStream>) -> Res<f64> {
    let n = 1usize << 30;
    let a: CudaSlice<u8> = stream.alloc_zeros(n)?;
    let mut b: CudaSlice<u8> = stream.alloc_zeros(n)?;
    let mut t = Vec::new();
    for i in 0..23 {
        let s = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        stream.memcpy_dtod(&a, &mut b)?;
        let e = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        if i >= 3 {
            t.push(f64::from(s.elapsed_ms(&e)?) / 1e3);
        }
    }
    t.sort_by(f64::total_cmp);
    Ok(2.0 * n as f64 / t[t.len() / 2] / 1e9)
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f64 {
    let norm = b
        .iter()
        .map(|v| f64::from(*v).abs())
        .fold(0.0, f64::max)
        .max(1e-30);
    a.iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).abs() / norm)
        .fold(
            0.0,
            |m, d| if d.is_nan() { f64::INFINITY } else { m.max(d) },
        )
}
