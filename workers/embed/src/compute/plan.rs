//! Sequences grouped for the encoder: longest first, within its limits, padding bounded
//! for an encoder that pads.

/// The most padding a group of a padding encoder may carry, as a fraction of its first
/// (longest) sequence: a sequence shorter than that starts a new group.
pub(super) const MAX_PADDING: f64 = 0.25;
/// Groups smaller than this take shorter sequences anyway (a group has a fixed cost).
pub(super) const MIN_GROUP: usize = 16;

/// Groups of sequence indices, longest first, each with at most `max_sequences` members
/// (a sequence longer than `max_tokens` alone).
///
/// With `padding` (an encoder that pads each sequence to the group's longest), a group
/// holds `members × longest ≤ max_tokens`, and once it has [`MIN_GROUP`] members a sequence
/// shorter than `(1 − padding) × longest` starts the next (padding bounded where it costs:
/// on the GPU, attention grows as S²). Without (`None`: an encoder that computes only the
/// real tokens), its lengths' sum is at most `max_tokens`, whatever the lengths: fewer,
/// larger groups.
pub fn plan(
    lengths: &[usize],
    max_tokens: usize,
    max_sequences: usize,
    padding: Option<f64>,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    let mut groups: Vec<(Vec<usize>, usize)> = Vec::new();
    for i in order {
        let fits = |g: &[usize], sum: usize| match padding {
            // Sorted longest first: the group's first member is its longest.
            Some(padding) => {
                (g.len() + 1) * lengths[g[0]] <= max_tokens
                    && (g.len() < MIN_GROUP
                        || lengths[i] as f64 >= (1.0 - padding) * lengths[g[0]] as f64)
            }
            None => sum + lengths[i] <= max_tokens,
        };
        match groups.last_mut() {
            Some((g, sum)) if g.len() < max_sequences.max(1) && fits(g, *sum) => {
                g.push(i);
                *sum += lengths[i];
            }
            _ => groups.push((vec![i], lengths[i])),
        }
    }
    groups.into_iter().map(|(g, _)| g).collect()
}
