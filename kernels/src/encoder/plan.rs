//! Launch grids: a checked launch ([`Plan`]) of a row kernel (a row per group of lanes, for
//! the LayerNorms and the softmax) or of an element-wise kernel (a strided grid), and whether
//! the 16-byte-vector kernels apply.

use cudarc::driver::LaunchConfig;

use crate::error::KernelError;
use crate::gemv::WeightDtype;

/// The longest row the row kernels (LayerNorm, softmax) take: 512 threads of 16 elements.
pub const MAX_ROW_LEN: usize = 8192;
/// Elements per thread of a row kernel (`MS_ROW_ELEMS` in `encoder.cu`).
pub(super) const ROW_ELEMS: usize = 16;
/// Most threads per row (and per block) of a row kernel (their `__launch_bounds__`).
pub(super) const ROW_MAX_THREADS: usize = 512;
/// Threads per block of the element-wise kernels.
const FLAT_THREADS: u32 = 256;
/// Element-wise grids stop at this many blocks per multiprocessor (they stride).
pub(super) const FLAT_BLOCKS_PER_SM: u64 = 32;

/// A checked launch: the kernel and its grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Plan {
    pub(super) kernel: &'static str,
    pub(super) grid: (u32, u32, u32),
    pub(super) block: (u32, u32, u32),
}

impl Plan {
    /// The launch configuration (no dynamic shared memory).
    pub(super) fn config(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: self.grid,
            block_dim: self.block,
            shared_mem_bytes: 0,
        }
    }
}

/// Elements in one 16-byte chunk.
pub(super) const fn vec_width(dtype: WeightDtype) -> usize {
    16 / dtype.size_bytes()
}

/// Whether the 16-byte kernels apply: every pointer 16-byte aligned and `unit` (a row, or a
/// head) a whole number of chunks.
pub(super) fn vectorizable(dtype: WeightDtype, unit: usize, ptrs: &[u64]) -> bool {
    unit.is_multiple_of(vec_width(dtype)) && ptrs.iter().all(|p| p.is_multiple_of(16))
}

/// The grid of a row kernel: rows of `len` elements in chunks of `width`.
pub(super) fn row_plan(
    kernel: &'static str,
    rows: u64,
    len: usize,
    width: usize,
) -> Result<Plan, KernelError> {
    if len == 0 || len > MAX_ROW_LEN {
        return Err(KernelError::bad(format!(
            "rows of {len} elements: the row kernels take 1 to {MAX_ROW_LEN}"
        )));
    }
    let chunks = len / width;
    let per_thread = ROW_ELEMS / width;
    let needed = chunks.div_ceil(per_thread).max(1);
    // Short rows: a power-of-two group of lanes each, several rows per warp (the kernels'
    // reductions shuffle within the group); long rows: whole warps.
    let threads = if needed < 32 {
        needed.next_power_of_two()
    } else {
        needed.next_multiple_of(32)
    };
    debug_assert!(threads <= ROW_MAX_THREADS);
    // Blocks of at least 128 threads, whatever the row length.
    let rows_per_block = (128 / threads).max(1);
    let blocks = rows.div_ceil(rows_per_block as u64);
    let blocks = u32::try_from(blocks)
        .ok()
        .filter(|b| *b <= i32::MAX as u32)
        .ok_or_else(|| KernelError::bad(format!("{rows} rows need too many blocks")))?;
    Ok(Plan {
        kernel,
        grid: (blocks, 1, 1),
        block: (threads as u32, rows_per_block as u32, 1),
    })
}

/// Most threads along a row of the head kernels (they stride over longer rows).
const HEAD_ROW_THREADS: usize = 256;

/// The grid of a head kernel (split or merge): `rows` token rows of `chunks` chunks each,
/// a row per `threadIdx.y`, blocks of at least 128 threads, `y` grid rows.
pub(super) fn heads_plan(
    kernel: &'static str,
    rows: u64,
    chunks: usize,
    y: u32,
) -> Result<Plan, KernelError> {
    let threads = if chunks < 32 {
        chunks.max(1).next_power_of_two()
    } else {
        chunks.next_multiple_of(32).min(HEAD_ROW_THREADS)
    };
    let rows_per_block = (128 / threads).max(1);
    let blocks = u32::try_from(rows.div_ceil(rows_per_block as u64))
        .ok()
        .filter(|b| *b <= i32::MAX as u32)
        .ok_or_else(|| KernelError::bad(format!("{rows} rows need too many blocks")))?;
    Ok(Plan {
        kernel,
        grid: (blocks, y, 1),
        block: (threads as u32, rows_per_block as u32, 1),
    })
}

/// The grid of an element-wise kernel over `chunks` chunks, `y` grid rows.
pub(super) fn flat_plan(kernel: &'static str, chunks: u64, y: u32, multiprocessors: u32) -> Plan {
    let cap = u64::from(multiprocessors.max(1)) * FLAT_BLOCKS_PER_SM;
    let blocks = chunks.div_ceil(u64::from(FLAT_THREADS)).clamp(1, cap);
    Plan {
        kernel,
        grid: (blocks as u32, y, 1),
        block: (FLAT_THREADS, 1, 1),
    }
}
