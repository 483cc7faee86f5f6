//! Embeddings + LayerNorm: each token's word, position and token-type rows summed and
//! normalized.

use super::norm::layer_norm_row;
use super::slices::add;

/// `out[t, :] = LayerNorm(word[ids[t]] + position[t % seq_len + position_offset] +
/// token_type[type_ids[t]]) * gamma + beta`, with `hidden = gamma.len()`, one row of `out`
/// per id. An id (or type id) outside its table contributes zeros; `type_ids: None` means
/// type 0 for every token.
///
/// # Panics
///
/// Also if `seq_len` is 0 or a position is past the position table.
#[allow(clippy::too_many_arguments)] // The embedding's own tables.
pub fn embed_layer_norm(
    out: &mut [f32],
    ids: &[i32],
    type_ids: Option<&[i32]>,
    word: &[f32],
    position: &[f32],
    token_type: &[f32],
    gamma: &[f32],
    beta: &[f32],
    seq_len: usize,
    position_offset: usize,
    eps: f32,
) {
    let hidden = gamma.len();
    assert!(
        seq_len > 0 && hidden > 0,
        "embeddings: seq_len and hidden must be positive"
    );
    assert_eq!(
        out.len(),
        ids.len() * hidden,
        "embeddings: out is not [tokens, hidden]"
    );
    assert!(
        type_ids.is_none_or(|t| t.len() == ids.len()),
        "embeddings: type_ids length"
    );
    for (t, (o, id)) in out.chunks_exact_mut(hidden).zip(ids).enumerate() {
        let p = t % seq_len + position_offset;
        let prow = &position[p * hidden..(p + 1) * hidden];
        o.copy_from_slice(prow);
        if let Some(w) = table_row(word, *id, hidden) {
            add(o, w);
        }
        let tt = type_ids.map_or(0, |types| types[t]);
        if let Some(w) = table_row(token_type, tt, hidden) {
            add(o, w);
        }
        layer_norm_row(o, gamma, beta, eps);
    }
}

/// Row `i` of a `[_, hidden]` table, or `None` when `i` is outside it.
fn table_row(table: &[f32], i: i32, hidden: usize) -> Option<&[f32]> {
    let i = usize::try_from(i).ok()?;
    table.get(i * hidden..(i + 1) * hidden)
}
