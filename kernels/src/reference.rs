//! CPU references of the device kernels: `gemv` in three weight types and the ms64
//! checksum (which is also what the server's loader puts in the manifest).
//!
//! The gemv references accumulate in f64 and round once to f32; they are the yardstick
//! the GPU results are measured against, not fast paths. [`ms64`] and [`ms64_parallel`]
//! are fast: they run over every byte a server loads.

use half::{bf16, f16};

/// ms64's multiplier of the byte length: the 64-bit golden ratio, `splitmix64`'s increment.
pub const MS64_LEN_MUL: u64 = 0x9E37_79B9_7F4A_7C15;

/// ms64's multiplier of a word's index, xor-ed into the word before mixing.
pub const MS64_INDEX_MUL: u64 = 0xD1B5_4A32_D192_ED03;

/// Below this many bytes per thread, [`ms64_parallel`] does not spawn threads.
const PARALLEL_MIN_BYTES_PER_THREAD: usize = 1 << 20;

/// Sebastiano Vigna's splitmix64 finalizer, as ms64 uses it (wrapping arithmetic).
#[inline(always)]
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(MS64_LEN_MUL);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The ms64 checksum of `bytes` (see the crate docs for the definition).
///
/// `ms64(&[]) == 0`. One pass of 8-byte words, no per-byte work but the last partial word.
pub fn ms64(bytes: &[u8]) -> u64 {
    len_term(bytes.len()).wrapping_add(word_sum(bytes, 0))
}

/// [`ms64`] computed by up to `threads` scoped threads over disjoint runs of whole words.
///
/// Equal to `ms64(bytes)` for every input and thread count (the word sum is associative and
/// commutative); small inputs, or `threads <= 1`, are summed on the calling thread.
pub fn ms64_parallel(bytes: &[u8], threads: usize) -> u64 {
    ms64_parallel_with(bytes, threads, PARALLEL_MIN_BYTES_PER_THREAD)
}

/// [`ms64_parallel`] with a chosen least share per thread (`min_bytes_per_thread`).
fn ms64_parallel_with(bytes: &[u8], threads: usize, min_bytes_per_thread: usize) -> u64 {
    let threads = threads.min(bytes.len().div_ceil(min_bytes_per_thread.max(8)));
    if threads <= 1 {
        return ms64(bytes);
    }
    // Each share is a whole number of words, so every share but the last holds no partial
    // word and a share that starts at byte `8k` starts at word index `k`.
    let share = bytes.len().div_ceil(8).div_ceil(threads) * 8;
    let sum = std::thread::scope(|scope| {
        let mut pending = Vec::with_capacity(threads);
        let mut sum = 0u64;
        for (k, chunk) in bytes.chunks(share).enumerate() {
            let first_word = (k * share / 8) as u64;
            let spawned = std::thread::Builder::new()
                .name("ms64".into())
                .spawn_scoped(scope, move || word_sum(chunk, first_word));
            match spawned {
                Ok(handle) => pending.push(handle),
                // No thread to be had: do this share here.
                Err(_) => sum = sum.wrapping_add(word_sum(chunk, first_word)),
            }
        }
        for handle in pending {
            match handle.join() {
                Ok(part) => sum = sum.wrapping_add(part),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        sum
    });
    len_term(bytes.len()).wrapping_add(sum)
}

#[inline(always)]
fn len_term(len: usize) -> u64 {
    (len as u64).wrapping_mul(MS64_LEN_MUL)
}

/// Σ splitmix64(w_i ^ (i * MS64_INDEX_MUL)) over the words of `bytes`, the first of which
/// has index `first_word`; the last word is zero-padded.
fn word_sum(bytes: &[u8], first_word: u64) -> u64 {
    let (words, rest) = bytes.as_chunks::<8>();
    let mut key = first_word.wrapping_mul(MS64_INDEX_MUL);
    let mut sum = 0u64;
    for word in words {
        sum = sum.wrapping_add(splitmix64(u64::from_le_bytes(*word) ^ key));
        key = key.wrapping_add(MS64_INDEX_MUL);
    }
    if !rest.is_empty() {
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        sum = sum.wrapping_add(splitmix64(u64::from_le_bytes(last) ^ key));
    }
    sum
}

/// `y = W·x` for a row-major `w` of `rows × cols` f32, accumulated in f64.
///
/// # Panics
///
/// If `w` holds fewer than `rows * cols` elements or `x` fewer than `cols` (a reference for
/// tests: the device launchers return errors instead).
pub fn gemv_f32(w: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    gemv_by(w, x, rows, cols, |v| f64::from(*v))
}

/// `y = W·x` for a row-major `w` of `rows × cols` f16, accumulated in f64.
///
/// # Panics
///
/// As [`gemv_f32`].
pub fn gemv_f16(w: &[f16], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    gemv_by(w, x, rows, cols, |v| v.to_f64())
}

/// `y = W·x` for a row-major `w` of `rows × cols` bf16, accumulated in f64.
///
/// # Panics
///
/// As [`gemv_f32`].
pub fn gemv_bf16(w: &[bf16], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    gemv_by(w, x, rows, cols, |v| v.to_f64())
}

fn gemv_by<T>(
    w: &[T],
    x: &[f32],
    rows: usize,
    cols: usize,
    to_f64: impl Fn(&T) -> f64,
) -> Vec<f32> {
    let elems = rows.checked_mul(cols);
    assert!(
        elems.is_some_and(|n| n <= w.len()) && x.len() >= cols,
        "gemv reference: {rows}x{cols} needs {elems:?} weights and {cols} inputs, got {} and {}",
        w.len(),
        x.len()
    );
    if cols == 0 {
        return vec![0.0; rows];
    }
    w.chunks_exact(cols)
        .take(rows)
        .map(|row| {
            row.iter()
                .zip(x)
                .map(|(wv, xv)| to_f64(wv) * f64::from(*xv))
                .sum::<f64>() as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator for test inputs (never all zeros).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(1);
            splitmix64(self.0.wrapping_mul(0x2545_F491_4F6C_DD1D))
        }
        fn unit(&mut self) -> f32 {
            // Uniform in [-1, 1).
            ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    /// The definition, spelled out byte by byte: the yardstick for the fast paths.
    fn ms64_naive(bytes: &[u8]) -> u64 {
        let n = bytes.len().div_ceil(8);
        let mut sum = (bytes.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for i in 0..n {
            let mut w = 0u64;
            for j in 0..8 {
                let b = bytes.get(8 * i + j).copied().unwrap_or(0);
                w |= u64::from(b) << (8 * j);
            }
            let z = w ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
            sum = sum.wrapping_add(splitmix64(z));
        }
        sum
    }

    /// splitmix64 itself is off (the device kernel copies these constants).
    #[test]
    fn splitmix64_matches_published_values() {
        // The first outputs of Vigna's splitmix64 generator seeded with 0: state advances by
        // the golden ratio and each output is the finalizer of the state before the add.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(MS64_LEN_MUL), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(
            splitmix64(MS64_LEN_MUL.wrapping_mul(2)),
            0x06C4_5D18_8009_454F
        );
    }

    /// The empty input no longer sums to 0, the value the definition gives it.
    #[test]
    fn ms64_of_empty_is_zero() {
        assert_eq!(ms64(&[]), 0);
        assert_eq!(ms64_parallel(&[], 8), 0);
    }

    /// The hand-computed values of short inputs changed: the definition moved.
    #[test]
    fn ms64_known_values() {
        // One zero byte: len 1, one word w_0 = 0, index term 0.
        assert_eq!(ms64(&[0]), MS64_LEN_MUL.wrapping_add(splitmix64(0)));
        // Eight bytes 1..=8: w_0 = 0x0807060504030201.
        let w0 = 0x0807_0605_0403_0201u64;
        assert_eq!(
            ms64(&[1, 2, 3, 4, 5, 6, 7, 8]),
            8u64.wrapping_mul(MS64_LEN_MUL).wrapping_add(splitmix64(w0))
        );
        // Nine bytes: the ninth (0xff) is word 1, zero-padded, xor-ed with 1 * MS64_INDEX_MUL.
        assert_eq!(
            ms64(&[1, 2, 3, 4, 5, 6, 7, 8, 0xff]),
            9u64.wrapping_mul(MS64_LEN_MUL)
                .wrapping_add(splitmix64(w0))
                .wrapping_add(splitmix64(0xff ^ MS64_INDEX_MUL))
        );
    }

    /// The zero padding of the last word is not what the definition says.
    #[test]
    fn ms64_pads_short_inputs_as_defined() {
        let mut rng = Rng(17);
        for len in 1..=17 {
            let bytes = rng.bytes(len);
            assert_eq!(ms64(&bytes), ms64_naive(&bytes), "len {len}");
        }
        // Padding is not confused with real zero bytes: the length term tells them apart.
        assert_ne!(ms64(&[7]), ms64(&[7, 0]));
        assert_ne!(
            ms64(&[7, 0, 0, 0, 0, 0, 0]),
            ms64(&[7, 0, 0, 0, 0, 0, 0, 0])
        );
    }

    /// ms64 is not position-dependent: reordered tensors would pass the check.
    #[test]
    fn ms64_changes_when_words_swap() {
        let mut rng = Rng(3);
        let bytes = rng.bytes(64);
        let mut swapped = bytes.clone();
        let (a, b) = swapped.split_at_mut(8);
        a.swap_with_slice(&mut b[..8]);
        assert_ne!(bytes, swapped);
        assert_ne!(ms64(&bytes), ms64(&swapped));
        // And a single flipped bit anywhere changes it.
        for bit in [0, 7, 100, 511] {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(ms64(&bytes), ms64(&flipped), "bit {bit}");
        }
    }

    /// The fast word loop disagrees with the definition on some length.
    #[test]
    fn ms64_matches_naive_definition() {
        let mut rng = Rng(5);
        for len in [
            0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4095, 4096, 4097,
        ] {
            let bytes = rng.bytes(len);
            assert_eq!(ms64(&bytes), ms64_naive(&bytes), "len {len}");
        }
    }

    /// Splitting the words between threads changes the result (a share boundary or a
    /// word index is off).
    #[test]
    fn ms64_parallel_equals_serial() {
        let mut rng = Rng(11);
        let bytes = rng.bytes(5000);
        for len in [0, 1, 7, 8, 9, 16, 17, 100, 1023, 1024, 1025, 4999, 5000] {
            let slice = &bytes[..len];
            let serial = ms64(slice);
            for threads in [0, 1, 2, 3, 4, 7, 8, 16, 64, 1000] {
                assert_eq!(
                    ms64_parallel_with(slice, threads, 8),
                    serial,
                    "len {len} threads {threads}"
                );
                assert_eq!(ms64_parallel(slice, threads), serial);
            }
        }
        // Past the threshold, the public entry point splits too.
        let big = rng.bytes(3 * PARALLEL_MIN_BYTES_PER_THREAD + 5);
        assert_eq!(ms64_parallel(&big, 4), ms64(&big));
    }

    fn naive_gemv(w: &[f64], x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
        let mut y = vec![0.0; rows];
        for (r, out) in y.iter_mut().enumerate() {
            for c in 0..cols {
                *out += w[r * cols + c] * x[c];
            }
        }
        y
    }

    fn rel_err(y: &[f32], reference: &[f64]) -> f64 {
        let diff: f64 = y
            .iter()
            .zip(reference)
            .map(|(a, b)| (f64::from(*a) - b).powi(2))
            .sum();
        let norm: f64 = reference.iter().map(|b| b * b).sum();
        (diff / norm).sqrt()
    }

    /// A gemv reference indexes rows or columns wrongly.
    #[test]
    fn gemv_references_match_naive_loop() {
        let mut rng = Rng(23);
        for (rows, cols) in [(1, 1), (1, 17), (3, 5), (7, 64), (33, 129), (64, 4097)] {
            let w: Vec<f32> = (0..rows * cols).map(|_| rng.unit()).collect();
            let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
            let x64: Vec<f64> = x.iter().map(|v| f64::from(*v)).collect();

            let w64: Vec<f64> = w.iter().map(|v| f64::from(*v)).collect();
            let reference = naive_gemv(&w64, &x64, rows, cols);
            assert!(rel_err(&gemv_f32(&w, &x, rows, cols), &reference) < 1e-6);

            let wh: Vec<f16> = w.iter().map(|v| f16::from_f32(*v)).collect();
            let wh64: Vec<f64> = wh.iter().map(|v| v.to_f64()).collect();
            let reference = naive_gemv(&wh64, &x64, rows, cols);
            assert!(rel_err(&gemv_f16(&wh, &x, rows, cols), &reference) < 1e-6);

            let wb: Vec<bf16> = w.iter().map(|v| bf16::from_f32(*v)).collect();
            let wb64: Vec<f64> = wb.iter().map(|v| v.to_f64()).collect();
            let reference = naive_gemv(&wb64, &x64, rows, cols);
            assert!(rel_err(&gemv_bf16(&wb, &x, rows, cols), &reference) < 1e-6);
        }
    }

    /// The hand-computed 2x3 product is wrong (rows and columns swapped, say).
    #[test]
    fn gemv_known_small_case() {
        let w = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let x = [1.0f32, 0.5, -1.0];
        assert_eq!(gemv_f32(&w, &x, 2, 3), vec![-1.0, 0.5]);
        let wh: Vec<f16> = w.iter().map(|v| f16::from_f32(*v)).collect();
        assert_eq!(gemv_f16(&wh, &x, 2, 3), vec![-1.0, 0.5]);
        let wb: Vec<bf16> = w.iter().map(|v| bf16::from_f32(*v)).collect();
        assert_eq!(gemv_bf16(&wb, &x, 2, 3), vec![-1.0, 0.5]);
    }

    /// Zero columns give zero rows' worth of zeros, not a panic in `chunks_exact(0)`.
    #[test]
    fn gemv_with_zero_cols_is_zeros() {
        assert_eq!(gemv_f32(&[], &[], 3, 0), vec![0.0; 3]);
        assert!(gemv_f32(&[], &[], 0, 0).is_empty());
    }
}
