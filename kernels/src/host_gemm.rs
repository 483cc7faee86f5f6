//! Matrix products on the host, for the CPU backend of workers: the `gemm` crate's
//! multithreaded f32 kernels (rayon) behind a safe API over borrowed slices, so that weights
//! in the shared host arena are read in place, never copied.
//!
//! A matrix is a strided view into a slice ([`MatRef`], [`MatMut`]): element `(r, c)` is
//! `data[offset + r·row_stride + c·col_stride]`. Views check that every element they name
//! lies in the slice, and an output view that no two elements share a place, before `gemm`
//! is called; heads of an attention layer are views into one activation buffer.

use gemm::Parallelism;

use crate::error::KernelError;

/// A read-only strided matrix view.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    /// The elements.
    pub data: &'a [f32],
    /// Index of element (0, 0).
    pub offset: usize,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Elements from one row to the next.
    pub row_stride: usize,
    /// Elements from one column to the next.
    pub col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// A dense row-major `[rows, cols]` matrix starting at `data[0]`.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            offset: 0,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose (no data moves).
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }
}

/// A writable strided matrix view.
#[derive(Debug)]
pub struct MatMut<'a> {
    /// The elements.
    pub data: &'a mut [f32],
    /// Index of element (0, 0).
    pub offset: usize,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Elements from one row to the next.
    pub row_stride: usize,
    /// Elements from one column to the next.
    pub col_stride: usize,
}

impl<'a> MatMut<'a> {
    /// A dense row-major `[rows, cols]` matrix starting at `data[0]`.
    pub fn row_major(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            offset: 0,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }
}

/// Whether `gemm` may spread one product over the rayon pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threads {
    /// On the calling thread only (for many small products run in parallel by the caller).
    One,
    /// Over the current rayon pool.
    Pool,
}

/// `dst = alpha · lhs · rhs` (dst's old values are not read).
pub fn matmul(
    dst: MatMut<'_>,
    lhs: MatRef<'_>,
    rhs: MatRef<'_>,
    alpha: f32,
    threads: Threads,
) -> Result<(), KernelError> {
    check_operands(&dst, &lhs, &rhs)?;
    let (r, c, rs, cs) = (dst.rows, dst.cols, dst.row_stride, dst.col_stride);
    if dst.rows == 0 || dst.cols == 0 {
        return Ok(());
    }
    if lhs.cols == 0 {
        // An empty sum: gemm would leave dst unread and unwritten.
        for i in 0..r {
            for j in 0..c {
                dst.data[dst.offset + i * rs + j * cs] = 0.0;
            }
        }
        return Ok(());
    }
    let parallelism = match threads {
        Threads::One => Parallelism::None,
        Threads::Pool => Parallelism::Rayon(0),
    };
    let stride =
        |s: usize| isize::try_from(s).map_err(|_| KernelError::bad("matmul stride past isize"));
    let (dst_rs, dst_cs) = (stride(rs)?, stride(cs)?);
    let (lhs_rs, lhs_cs) = (stride(lhs.row_stride)?, stride(lhs.col_stride)?);
    let (rhs_rs, rhs_cs) = (stride(rhs.row_stride)?, stride(rhs.col_stride)?);
    let dst_ptr = dst.data[dst.offset..].as_mut_ptr();
    let lhs_ptr = lhs.data[lhs.offset..].as_ptr();
    let rhs_ptr = rhs.data[rhs.offset..].as_ptr();
    // SAFETY: every element the three views name lies inside its slice, the output's
    // elements are pairwise distinct (both check_operands), and dst is a unique borrow,
    // so it overlaps neither input. With read_dst false, gemm writes dst = alpha·lhs·rhs
    // (its `beta` multiplies the product) and reads nothing of dst; f32 is a type gemm takes.
    unsafe {
        gemm::gemm(
            dst.rows,
            dst.cols,
            lhs.cols,
            dst_ptr,
            dst_cs,
            dst_rs,
            false,
            lhs_ptr,
            lhs_cs,
            lhs_rs,
            rhs_ptr,
            rhs_cs,
            rhs_rs,
            0.0,
            alpha,
            false,
            false,
            false,
            parallelism,
        );
    }
    Ok(())
}

/// The operands of [`matmul`]: shapes that chain, every element of each view inside its
/// slice, and an output whose elements are pairwise distinct.
fn check_operands(dst: &MatMut<'_>, lhs: &MatRef<'_>, rhs: &MatRef<'_>) -> Result<(), KernelError> {
    if lhs.rows != dst.rows || rhs.cols != dst.cols || lhs.cols != rhs.rows {
        return Err(KernelError::bad(format!(
            "matmul of [{}, {}] by [{}, {}] into [{}, {}]: the shapes do not chain",
            lhs.rows, lhs.cols, rhs.rows, rhs.cols, dst.rows, dst.cols
        )));
    }
    check_view(
        "lhs",
        lhs.data.len(),
        lhs.offset,
        lhs.rows,
        lhs.cols,
        lhs.row_stride,
        lhs.col_stride,
    )?;
    check_view(
        "rhs",
        rhs.data.len(),
        rhs.offset,
        rhs.rows,
        rhs.cols,
        rhs.row_stride,
        rhs.col_stride,
    )?;
    check_view(
        "dst",
        dst.data.len(),
        dst.offset,
        dst.rows,
        dst.cols,
        dst.row_stride,
        dst.col_stride,
    )?;
    let (r, c, rs, cs) = (dst.rows, dst.cols, dst.row_stride, dst.col_stride);
    let disjoint = r <= 1 && c <= 1
        || (cs >= 1 || c <= 1) && rs >= c.saturating_mul(cs).max(1)
        || (rs >= 1 || r <= 1) && cs >= r.saturating_mul(rs).max(1);
    if !disjoint {
        return Err(KernelError::bad(format!(
            "matmul output [{r}, {c}] with strides ({rs}, {cs}) writes some elements twice"
        )));
    }
    Ok(())
}

/// `y[rows, out] = x[rows, in] · w[out, in]ᵀ`, row-major: a linear layer without its bias.
pub fn linear(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    rows: usize,
    in_features: usize,
    out_features: usize,
) -> Result<(), KernelError> {
    let size = |what: &str, len: usize, a: usize, b: usize| match a.checked_mul(b) {
        Some(n) if n == len => Ok(()),
        _ => Err(KernelError::bad(format!(
            "linear: {what} has {len} elements, not {a}x{b}"
        ))),
    };
    size("x", x.len(), rows, in_features)?;
    size("w", w.len(), out_features, in_features)?;
    size("y", y.len(), rows, out_features)?;
    matmul(
        MatMut::row_major(y, rows, out_features),
        MatRef::row_major(x, rows, in_features),
        MatRef::row_major(w, out_features, in_features).t(),
        1.0,
        Threads::Pool,
    )
}

/// Every element of a `[rows, cols]` view lies inside a slice of `len`.
fn check_view(
    what: &str,
    len: usize,
    offset: usize,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
) -> Result<(), KernelError> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let last = (rows - 1)
        .checked_mul(rs)
        .and_then(|a| (cols - 1).checked_mul(cs).and_then(|b| a.checked_add(b)))
        .and_then(|a| a.checked_add(offset));
    match last {
        Some(last) if last < len => Ok(()),
        _ => Err(KernelError::bad(format!(
            "matmul {what} view [{rows}, {cols}] at {offset} with strides ({rs}, {cs}) runs past its {len} elements"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    /// A linear layer would be computed with the weight untransposed or rows mixed up.
    #[test]
    fn linear_matches_the_naive_product() {
        let (rows, inp, out) = (5, 7, 3);
        let x: Vec<f32> = (0..rows * inp).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..out * inp).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut wt = vec![0.0; inp * out];
        for o in 0..out {
            for i in 0..inp {
                wt[i * out + o] = w[o * inp + i];
            }
        }
        let want = naive(&x, &wt, rows, inp, out);
        let mut y = vec![f32::NAN; rows * out];
        linear(&x, &w, &mut y, rows, inp, out).expect("linear");
        for (a, b) in y.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    /// Head views (column slices of a wider buffer) would read or write outside their head.
    #[test]
    fn strided_head_views_multiply_in_place() {
        // Two heads of width 2 in rows of 4; scores of head 1 = Q1 · K1ᵀ.
        let q: Vec<f32> = (0..12).map(|i| i as f32).collect(); // [3, 4]
        let k: Vec<f32> = (0..12).map(|i| (i % 5) as f32).collect();
        let mut s = vec![f32::NAN; 9];
        let q1 = MatRef {
            data: &q,
            offset: 2,
            rows: 3,
            cols: 2,
            row_stride: 4,
            col_stride: 1,
        };
        let k1 = MatRef {
            data: &k,
            offset: 2,
            rows: 3,
            cols: 2,
            row_stride: 4,
            col_stride: 1,
        };
        matmul(
            MatMut::row_major(&mut s, 3, 3),
            q1,
            k1.t(),
            0.5,
            Threads::One,
        )
        .expect("matmul");
        for i in 0..3 {
            for j in 0..3 {
                let want: f32 = (0..2)
                    .map(|c| q[i * 4 + 2 + c] * k[j * 4 + 2 + c])
                    .sum::<f32>()
                    * 0.5;
                assert_eq!(s[i * 3 + j], want, "({i}, {j})");
            }
        }
    }

    /// Bad shapes or views would reach gemm (an out-of-bounds read, or overlapping writes).
    #[test]
    fn refuses_bad_shapes_and_views() {
        let a = vec![0.0; 6];
        let mut y = vec![0.0; 4];
        assert!(linear(&a, &a, &mut y, 2, 3, 3).is_err(), "y too small");
        assert!(linear(&a, &a[..5], &mut y, 2, 3, 2).is_err(), "w too small");
        let past = MatRef {
            data: &a,
            offset: 1,
            rows: 2,
            cols: 3,
            row_stride: 3,
            col_stride: 1,
        };
        let ok = MatRef::row_major(&a, 3, 2);
        assert!(matmul(MatMut::row_major(&mut y, 2, 2), past, ok, 1.0, Threads::One).is_err());
        let mut z = vec![0.0; 4];
        let overlapping = MatMut {
            data: &mut z,
            offset: 0,
            rows: 2,
            cols: 2,
            row_stride: 1,
            col_stride: 1,
        };
        let lhs = MatRef::row_major(&a, 2, 3);
        assert!(matmul(overlapping, lhs, ok, 1.0, Threads::One).is_err());
        let e = matmul(MatMut::row_major(&mut y, 2, 2), lhs, lhs, 1.0, Threads::One)
            .expect_err("shapes");
        assert!(e.to_string().contains("do not chain"), "{e}");
        // k = 0: zeros, not stale values.
        let mut y = vec![5.0; 4];
        let empty = MatRef::row_major(&[], 2, 0);
        matmul(
            MatMut::row_major(&mut y, 2, 2),
            empty,
            MatRef::row_major(&[], 0, 2),
            1.0,
            Threads::One,
        )
        .expect("k=0");
        assert_eq!(y, [0.0; 4]);
    }
}
