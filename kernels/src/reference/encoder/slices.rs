//! Small helpers on rows shared by the references.

/// A sequence's length as an index, clamped to `0..=seq`.
pub(super) fn clamp_len(len: i32, seq: usize) -> usize {
    usize::try_from(len).unwrap_or(0).min(seq)
}

/// The sum of `v`'s elements.
pub(super) fn sum(v: &[f32]) -> f32 {
    v.iter().sum()
}

/// `acc += v`, element-wise.
pub(super) fn add(acc: &mut [f32], v: &[f32]) {
    for (a, b) in acc.iter_mut().zip(v) {
        *a += b;
    }
}
