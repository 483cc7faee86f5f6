//! Sequences grouped for the encoder: longest first, within its limits, padding bounded.

/// The most padding a group of a padding encoder may carry, as a fraction of its first
/// (longest) sequence: a sequence shorter than that starts a new group.
pub(super) const MAX_PADDING: f64 = 0.25;
/// Groups smaller than this take shorter sequences anyway (a group has a fixed cost).
pub(super) const MIN_GROUP: usize = 16;

/// Groups of sequence indices, longest first, each with at most `max_sequences` members
/// and `members × longest ≤ max_tokens` (a sequence longer than `max_tokens` alone); once a
/// group has [`MIN_GROUP`] members, a sequence shorter than `(1 − max_padding) × longest`
/// starts the next (padding bounded where it costs: on the GPU, attention grows as S²).
pub fn plan(
    lengths: &[usize],
    max_tokens: usize,
    max_sequences: usize,
    max_padding: f64,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for i in order {
        match groups.last_mut() {
            // Sorted longest first: the group's first member is its longest.
            Some(g)
                if g.len() < max_sequences.max(1)
                    && (g.len() + 1) * lengths[g[0]] <= max_tokens
                    && (g.len() < MIN_GROUP
                        || lengths[i] as f64 >= (1.0 - max_padding) * lengths[g[0]] as f64) =>
            {
                g.push(i)
            }
            _ => groups.push(vec![i]),
        }
    }
    groups
}
