//! One job: its sequences grouped by length, each group's members not cancelled by then
//! encoded, the rows put back in the caller's order.

use modelshare_worker::CancellationToken;

use super::job::Encoded;
use super::panics::encode_caught;
use super::plan::{MAX_PADDING, plan};
use crate::encoder::{EncodeError, Encoder};
use crate::tokenize::Sequence;

/// Runs one job: groups by length, encodes each group's members not cancelled by then, puts
/// rows back in order.
pub(super) fn run(
    encoder: &mut dyn Encoder,
    seqs: &[Sequence],
    cancels: &[CancellationToken],
) -> Result<Encoded, EncodeError> {
    let hidden = encoder.hidden();
    let lengths: Vec<usize> = seqs.iter().map(Sequence::len).collect();
    let mut out = vec![0.0f32; seqs.len() * hidden];
    let mut cancelled = vec![false; seqs.len()];
    let waste = if encoder.pads() { MAX_PADDING } else { 1.0 };
    for group in plan(
        &lengths,
        encoder.max_tokens(),
        encoder.max_sequences(),
        waste,
    ) {
        let group: Vec<usize> = group
            .into_iter()
            .filter(|&i| {
                let gone = cancels.get(i).is_some_and(CancellationToken::is_cancelled);
                cancelled[i] = gone;
                !gone
            })
            .collect();
        if group.is_empty() {
            continue;
        }
        let members: Vec<&Sequence> = group.iter().map(|&i| &seqs[i]).collect();
        let vectors = encode_caught(encoder, &members)?;
        if vectors.len() != group.len() * hidden {
            return Err(EncodeError::Device(format!(
                "the encoder returned {} values for {} sequences of {hidden}",
                vectors.len(),
                group.len()
            )));
        }
        for (row, &i) in vectors.chunks_exact(hidden).zip(&group) {
            out[i * hidden..(i + 1) * hidden].copy_from_slice(row);
        }
    }
    Ok(Encoded {
        vectors: out,
        cancelled,
    })
}
