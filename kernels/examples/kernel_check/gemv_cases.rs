//! The gemv cases: shapes, offsets and dtypes, and which of them are timed.

use modelshare_kernels::WeightDtype;

pub struct GemvCase {
    pub dtype: WeightDtype,
    pub rows: usize,
    pub cols: usize,
    /// Elements W starts past a 256-byte aligned allocation.
    pub w_offset: usize,
    /// Floats x starts past a 256-byte aligned allocation.
    pub x_offset: usize,
    pub timed: bool,
}

/// The gemv cases of every dtype: odd and large shapes, offset buffers, and the timed ones.
pub fn gemv_cases() -> Vec<GemvCase> {
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
