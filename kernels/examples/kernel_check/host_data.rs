//! Random host data, filled and converted on all threads.

use std::ops::Range;

use modelshare_kernels::reference::splitmix64;

/// Uniform in [-1, 1) from 64 random bits.
pub fn unit(r: u64) -> f32 {
    ((r >> 40) as f32) * (1.0 / (1u64 << 23) as f32) - 1.0
}

/// `n` values `f(splitmix64(seed + i))`, filled by `threads` threads.
pub fn par_fill<T: Copy + Default + Send>(
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
pub fn par_bytes<T: Sync, const N: usize>(
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
pub fn par_rows(
    rows: usize,
    threads: usize,
    f: impl Fn(Range<usize>) -> Vec<f32> + Sync,
) -> Vec<f32> {
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
