//! The attention's masked softmax over each sequence's keys.

use super::slices::clamp_len;

/// In place on `scores [batch·heads, seq, seq]`: each row's softmax over the keys
/// `j < lengths[b]` (clamped to `0..=seq`), the other keys set to 0; a row of length 0
/// becomes zeros. Max-subtracted, f32.
pub fn masked_softmax(scores: &mut [f32], lengths: &[i32], batch: usize, heads: usize, seq: usize) {
    assert!(
        scores.len() == batch * heads * seq * seq && lengths.len() >= batch,
        "masked_softmax: shapes"
    );
    if seq == 0 {
        return;
    }
    for (r, row) in scores.chunks_exact_mut(seq).enumerate() {
        let len = clamp_len(lengths[r / (heads * seq)], seq);
        let (keep, masked) = row.split_at_mut(len);
        masked.fill(0.0);
        if keep.is_empty() {
            continue;
        }
        let m = keep.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut s = 0.0;
        for v in keep.iter_mut() {
            *v = (*v - m).exp();
            s += *v;
        }
        let inv = 1.0 / s;
        for v in keep.iter_mut() {
            *v *= inv;
        }
    }
}
