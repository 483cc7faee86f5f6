//! The gemv launcher: `y = W·x` on raw device pointers (`cuda/gemv.cu`).
//!
//! Workers get their weights as pointers into an IPC-imported arena that no cudarc
//! `CudaSlice` owns, so the launcher takes `CUdeviceptr`s (`u64`) and checks what it can:
//! sizes that overflow, null or misaligned pointers, an output overlapping an input.
//! Whether the memory behind a pointer is large enough is the caller's promise.
//!
//! Measured on an H100 against its 3.0 TB/s device-to-device copy (tuning notes in
//! `examples/gemv_lab.rs`): 16384x16384 f16/bf16 and 8192x16384 f32 at 99%, 8192² f16 at
//! 93%; unaligned rows (odd `cols`) take the general kernel, about 56%.

use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use crate::compile::{GEMV_SOURCE, KernelCache};
use crate::error::KernelError;

/// Threads per block of every gemv launch (8 warps).
const BLOCK_THREADS: u32 = 256;
/// Longest row the kernels take: their per-row indices are 32-bit and may run a block's
/// width past the row's end.
const MAX_COLS: usize = i32::MAX as usize - 4096;
/// Below this many warps per multiprocessor, the warp layouts keep too few bytes in flight:
/// long rows then get a block each.
const MIN_WARPS_PER_SM: u64 = 16;
/// Rows at least this long make a block per row worth it.
const BLOCK_MIN_COLS: usize = 2048;

/// The element type of a weight matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the high half of a binary32).
    BF16,
}

impl WeightDtype {
    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
        }
    }

    /// The lowercase name, as in the kernels' names.
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
        }
    }
}

/// How the rows are spread over the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvLayout {
    /// The fast path: `rows_per_warp` rows per warp, 16-byte loads only. Needs W's rows and x
    /// 16-byte aligned (both pointers, and `cols * dtype.size_bytes()`, multiples of 16).
    Aligned {
        /// 2 for 16-bit weights (each x value serves two rows), 1 for f32.
        rows_per_warp: u32,
    },
    /// Any alignment, one warp per row (scalar head and tail around 16-byte loads).
    Warp,
    /// Any alignment, one block per row: too few rows to keep the device busy with warps.
    Block,
}

/// A checked gemv launch: the kernel to run and the grid it wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvPlan {
    /// The kernel's name in `cuda/gemv.cu`.
    pub kernel: &'static str,
    /// How rows map to warps and blocks.
    pub layout: GemvLayout,
    /// Blocks to cover every row once; the launcher caps this at the blocks resident on the
    /// device at once (the kernels stride over rows).
    pub blocks: u32,
    /// Bytes of W.
    pub weight_bytes: u64,
}

/// Checks a gemv's arguments and picks its kernel and grid for a device of `multiprocessors`
/// SMs. `Ok(None)`: nothing to do (`rows == 0`).
pub fn plan_gemv(
    dtype: WeightDtype,
    w: u64,
    x: u64,
    y: u64,
    rows: usize,
    cols: usize,
    multiprocessors: u32,
) -> Result<Option<GemvPlan>, KernelError> {
    if rows == 0 {
        return Ok(None);
    }
    let es = dtype.size_bytes() as u64;
    let too_big = || {
        KernelError::bad(format!(
            "gemv of {rows}x{cols} {} does not fit in 64-bit sizes",
            dtype.name()
        ))
    };
    let elems = (rows as u64).checked_mul(cols as u64).ok_or_else(too_big)?;
    let weight_bytes = elems.checked_mul(es).ok_or_else(too_big)?;
    if rows > i64::MAX as usize || weight_bytes > i64::MAX as u64 {
        return Err(too_big());
    }
    if cols > MAX_COLS {
        return Err(KernelError::bad(format!(
            "gemv with {cols} columns: at most {MAX_COLS} are supported"
        )));
    }
    let x_bytes = cols as u64 * 4;
    let y_bytes = rows as u64 * 4;
    check_range("y", y, y_bytes, 4)?;
    if cols > 0 {
        check_range("w", w, weight_bytes, es)?;
        check_range("x", x, x_bytes, 4)?;
        if overlaps(y, y_bytes, w, weight_bytes) || overlaps(y, y_bytes, x, x_bytes) {
            return Err(KernelError::bad(format!(
                "gemv output y at {y:#x} ({y_bytes} bytes) overlaps an input"
            )));
        }
    }

    let sms = u64::from(multiprocessors.max(1));
    let warps_per_block = u64::from(BLOCK_THREADS / 32);
    let aligned = cols > 0
        && w.is_multiple_of(16)
        && x.is_multiple_of(16)
        && (cols as u64 * es).is_multiple_of(16);
    let rows_per_warp = if aligned && es == 2 { 2 } else { 1 };
    let warps = (rows as u64).div_ceil(rows_per_warp);
    let layout = if warps < sms * MIN_WARPS_PER_SM && cols >= BLOCK_MIN_COLS {
        GemvLayout::Block
    } else if aligned {
        GemvLayout::Aligned {
            rows_per_warp: rows_per_warp as u32,
        }
    } else {
        GemvLayout::Warp
    };
    let wanted = match layout {
        GemvLayout::Block => rows as u64,
        GemvLayout::Aligned { .. } | GemvLayout::Warp => warps.div_ceil(warps_per_block),
    };
    // The kernels stride over rows: any grid covers them; this keeps within the grid limit.
    let blocks = wanted.clamp(1, i32::MAX as u64) as u32;
    let kernel = match (dtype, layout) {
        (WeightDtype::F32, GemvLayout::Aligned { .. }) => "ms_gemv_f32_aligned",
        (WeightDtype::F16, GemvLayout::Aligned { .. }) => "ms_gemv_f16_aligned",
        (WeightDtype::BF16, GemvLayout::Aligned { .. }) => "ms_gemv_bf16_aligned",
        (WeightDtype::F32, GemvLayout::Warp) => "ms_gemv_f32_warp",
        (WeightDtype::F16, GemvLayout::Warp) => "ms_gemv_f16_warp",
        (WeightDtype::BF16, GemvLayout::Warp) => "ms_gemv_bf16_warp",
        (WeightDtype::F32, GemvLayout::Block) => "ms_gemv_f32_block",
        (WeightDtype::F16, GemvLayout::Block) => "ms_gemv_f16_block",
        (WeightDtype::BF16, GemvLayout::Block) => "ms_gemv_bf16_block",
    };
    Ok(Some(GemvPlan {
        kernel,
        layout,
        blocks,
        weight_bytes,
    }))
}

/// Non-null, aligned to `align`, and `[ptr, ptr + bytes)` inside the address space.
pub(crate) fn check_range(what: &str, ptr: u64, bytes: u64, align: u64) -> Result<(), KernelError> {
    if ptr == 0 {
        return Err(KernelError::bad(format!("{what} is a null device pointer")));
    }
    if !ptr.is_multiple_of(align) {
        return Err(KernelError::bad(format!(
            "{what} at {ptr:#x} is not aligned to its {align}-byte elements"
        )));
    }
    if ptr.checked_add(bytes).is_none() {
        return Err(KernelError::bad(format!(
            "{what} at {ptr:#x} with {bytes} bytes runs past the address space"
        )));
    }
    Ok(())
}

/// Whether `[a, a + a_len)` and `[b, b + b_len)` share a byte.
pub(crate) fn overlaps(a: u64, a_len: u64, b: u64, b_len: u64) -> bool {
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

/// Enqueues `y = W·x` on `stream`: W row-major `[rows, cols]` of `dtype`, x f32 `[cols]`,
/// y f32 `[rows]`, accumulated in f32. Returns once the kernel is enqueued; `rows == 0` is a
/// no-op, `cols == 0` writes zeros.
///
/// The result is deterministic for given inputs and device (a fixed reduction order), but
/// not bit-equal to an f64 reference: expect a relative error near 1e-7 · √(cols / 32).
///
/// # Safety
///
/// `w`, `x` and `y` must be device pointers valid on `stream`'s device for
/// `rows * cols * dtype.size_bytes()`, `cols * 4` and `rows * 4` bytes, readable (w, x) and
/// writable (y) until the kernel completes, and nothing else may write w or x, or touch y,
/// while it runs.
#[allow(clippy::too_many_arguments)] // The operation's own parameters, as in cuBLAS.
pub unsafe fn gemv(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    w: u64,
    x: u64,
    y: u64,
    rows: usize,
    cols: usize,
) -> Result<(), KernelError> {
    if rows == 0 {
        return Ok(());
    }
    let ctx = stream.context();
    let info = cache.device_info(ctx)?;
    let Some(plan) = plan_gemv(dtype, w, x, y, rows, cols, info.multiprocessors)? else {
        return Ok(());
    };
    let (f, resident) =
        cache.function_and_occupancy(ctx, &GEMV_SOURCE, plan.kernel, BLOCK_THREADS)?;
    // One wave of resident blocks striding over the rows: no partial second wave.
    let blocks = plan
        .blocks
        .min(info.multiprocessors.saturating_mul(resident))
        .max(1);
    // Checked by plan_gemv: rows <= i64::MAX, cols <= MAX_COLS < i32::MAX.
    let rows_arg = rows as i64;
    let cols_arg = cols as i32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = stream.launch_builder(&f);
    launch.arg(&w).arg(&x).arg(&y).arg(&rows_arg).arg(&cols_arg);
    // SAFETY: the arguments match the kernel's signature (three pointers, long long rows,
    // int cols); plan_gemv checked the sizes and pointers it can, and the caller promised
    // that the memory behind them is valid for those sizes on this stream's device.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 0x7f00_0000_0000;
    const X: u64 = 0x7f10_0000_0000;
    const Y: u64 = 0x7f20_0000_0000;

    /// An empty gemv launches a kernel (and touches pointers) it need not.
    #[test]
    fn zero_rows_is_a_no_op() {
        assert_eq!(
            plan_gemv(WeightDtype::F32, 0, 0, 0, 0, 5, 132).expect("plan"),
            None
        );
        assert_eq!(
            plan_gemv(WeightDtype::F16, 0, 0, 0, 0, 0, 132).expect("plan"),
            None
        );
    }

    /// Zero columns refuse to run or demand input pointers (y must still be zeroed).
    #[test]
    fn zero_cols_needs_only_y() {
        let plan = plan_gemv(WeightDtype::BF16, 0, 0, Y, 3, 0, 132).expect("plan");
        assert!(plan.is_some());
        assert!(plan_gemv(WeightDtype::BF16, 0, 0, 0, 3, 0, 132).is_err());
    }

    /// An overflowing size reaches the device instead of an error.
    #[test]
    fn overflowing_sizes_are_errors() {
        for (rows, cols) in [(usize::MAX, 2), (1 << 40, 1 << 30), (usize::MAX / 2, 1)] {
            let err = plan_gemv(WeightDtype::F32, W, X, Y, rows, cols, 132).expect_err("overflow");
            assert!(matches!(err, KernelError::BadArgument { .. }), "{err}");
        }
        assert!(plan_gemv(WeightDtype::F16, W, X, Y, 1, MAX_COLS + 1, 132).is_err());
        assert!(plan_gemv(WeightDtype::F16, u64::MAX - 8, X, Y, 1, 64, 132).is_err());
    }

    /// Null, misaligned or overlapping pointers reach the device instead of an error.
    #[test]
    fn bad_pointers_are_errors() {
        let plan = |w, x, y| plan_gemv(WeightDtype::F32, w, x, y, 4, 4, 132);
        assert!(plan(W, X, Y).is_ok());
        assert!(plan(0, X, Y).is_err());
        assert!(plan(W, 0, Y).is_err());
        assert!(plan(W, X, 0).is_err());
        assert!(plan(W + 2, X, Y).is_err());
        assert!(plan(W, X + 1, Y).is_err());
        assert!(plan(W, X, Y + 3).is_err());
        assert!(plan(W, X, W + 16).is_err(), "y inside w");
        assert!(plan(W, X, X - 8).is_err(), "y overlapping x");
        assert!(plan(W, X, X + 16).is_ok(), "y right after x");
        // f16 weights need only 2-byte alignment: odd columns put rows at any even address.
        assert!(plan_gemv(WeightDtype::F16, W + 2, X, Y, 3, 4097, 132).is_ok());
        assert!(plan_gemv(WeightDtype::F16, W + 1, X, Y, 3, 4097, 132).is_err());
    }

    /// The layout or grid choice would leave the device idle, take the fast path on
    /// unaligned data, or exceed the grid limit.
    #[test]
    fn layout_and_grid() {
        let plan = |dtype, w, x, rows, cols| {
            plan_gemv(dtype, w, x, Y, rows, cols, 132)
                .expect("plan")
                .expect("some")
        };
        let big = plan(WeightDtype::F16, W, X, 16384, 16384);
        assert_eq!(big.layout, GemvLayout::Aligned { rows_per_warp: 2 });
        assert_eq!(big.kernel, "ms_gemv_f16_aligned");
        assert_eq!(big.blocks, 16384 / 2 / 8);
        assert_eq!(big.weight_bytes, 16384 * 16384 * 2);

        let f32_big = plan(WeightDtype::F32, W, X, 8192, 16384);
        assert_eq!(f32_big.layout, GemvLayout::Aligned { rows_per_warp: 1 });
        assert_eq!(f32_big.blocks, 8192 / 8);

        // Odd columns: rows start at every even address, so the general warp kernel.
        let odd = plan(WeightDtype::BF16, W, X, 8192, 4097);
        assert_eq!(odd.layout, GemvLayout::Warp);
        assert_eq!(odd.kernel, "ms_gemv_bf16_warp");
        assert_eq!(odd.blocks, 1024);
        // Aligned shape, unaligned pointers: general too.
        assert_eq!(
            plan(WeightDtype::F16, W + 2, X, 8192, 4096).layout,
            GemvLayout::Warp
        );
        assert_eq!(
            plan(WeightDtype::F16, W, X + 4, 8192, 4096).layout,
            GemvLayout::Warp
        );
        // cols * 2 a multiple of 16 needs cols % 8 == 0.
        assert_eq!(
            plan(WeightDtype::F16, W, X, 8192, 4100).layout,
            GemvLayout::Warp
        );
        assert_eq!(
            plan(WeightDtype::F32, W, X, 8192, 4100).layout,
            GemvLayout::Aligned { rows_per_warp: 1 }
        );

        // Few long rows: a block each.
        let one_row = plan(WeightDtype::BF16, W, X, 1, 1 << 20);
        assert_eq!(one_row.layout, GemvLayout::Block);
        assert_eq!(one_row.kernel, "ms_gemv_bf16_block");
        assert_eq!(one_row.blocks, 1);
        assert_eq!(
            plan(WeightDtype::F16, W, X, 2048, 16384).layout,
            GemvLayout::Block
        );
        // Few short rows: not worth a block each.
        let short = plan(WeightDtype::F32, W, X, 3, 5);
        assert_eq!(short.layout, GemvLayout::Warp);
        assert_eq!(short.blocks, 1);
        assert_eq!(
            plan(WeightDtype::F32, W, X, 7, 64).layout,
            GemvLayout::Aligned { rows_per_warp: 1 }
        );
    }
}
