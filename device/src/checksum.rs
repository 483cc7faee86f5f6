//! ms64, the device-friendly checksum: its definition (the CPU implementation, which is
//! the reference every device launcher is compared with) and its CUDA C source.
//!
//! For a byte string of length `len`, let `n = ceil(len / 8)` and let word `w_i`
//! (`i` in `0..n`) be the little-endian `u64` of bytes `[8i, 8i + 8)`, zero-padded past
//! `len`. Then, with all arithmetic wrapping mod 2^64:
//!
//! ```text
//! ms64 = len * 0x9E3779B97F4A7C15 + Σ_i splitmix64(w_i ^ (i * 0xD1B54A32D192ED03))
//!
//! splitmix64(z):  z += 0x9E3779B97F4A7C15
//!                 z  = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//!                 z  = (z ^ (z >> 27)) * 0x94D049BB133111EB
//!                 return z ^ (z >> 31)
//! ```
//!
//! So `ms64(b"") == 0`. It is a sum of independent per-word terms, so any split of the words
//! (GPU threads and blocks, host threads in [`ms64_parallel`]) adds up to the same value. It
//! is an integrity check against corruption and mix-ups, **not** a cryptographic hash.
//!
//! It lives here, at the bottom of the crate graph, because both the server's CUDA backend
//! (which checksums every arena it loads, on the device) and the workers' kernels crate (which
//! lets a worker verify what it imported) use it.

/// The CUDA C source of the `ms64_sum` kernel (`device/cuda/checksum.cu`), compiled at run
/// time with NVRTC by the CUDA backend and by `modelshare-kernels`.
pub const CUDA_SOURCE: &str = include_str!("../cuda/checksum.cu");

/// Threads per block of `ms64_sum`.
pub const BLOCK_THREADS: u32 = 256;
/// Loads in flight per thread in the kernel's main loop (`MS_UNROLL`).
const UNROLL: u64 = 4;
/// Most blocks per multiprocessor.
const BLOCKS_PER_SM: u64 = 8;

/// Blocks for an ms64 of `len` bytes at `ptr` on a device of `multiprocessors` SMs: enough
/// for one trip of the unrolled loop per thread, at most `BLOCKS_PER_SM` per SM.
pub fn ms64_blocks(ptr: u64, len: u64, multiprocessors: u32) -> u32 {
    let words = len / 8;
    // 16-byte aligned data is read two words per load.
    let items = if ptr.is_multiple_of(16) {
        words / 2
    } else {
        words
    };
    let cap = u64::from(multiprocessors.max(1)) * BLOCKS_PER_SM;
    items
        .div_ceil(u64::from(BLOCK_THREADS) * UNROLL)
        .clamp(1, cap) as u32
}

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

    /// The grid is empty (an invalid launch) or larger than the device holds.
    #[test]
    fn grid_is_never_empty_nor_oversized() {
        assert_eq!(ms64_blocks(0x1000, 1, 132), 1);
        assert_eq!(ms64_blocks(0x1000, 7, 132), 1);
        assert_eq!(ms64_blocks(0x1000, 16 * 1024, 132), 1);
        assert_eq!(ms64_blocks(0x1000, 16 * 1024 + 16, 132), 2);
        assert_eq!(ms64_blocks(0x1001, 8 * 1024 + 8, 132), 2);
        assert_eq!(ms64_blocks(0x1000, 1 << 30, 132), 132 * 8);
        assert_eq!(ms64_blocks(0x1000, u64::MAX, 0), 8);
    }
}
