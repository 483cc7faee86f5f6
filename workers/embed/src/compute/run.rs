//! One job: its sequences grouped by length, each group's members not cancelled by then
//! encoded, the rows put back in the caller's order. An encoder that queues groups (CUDA)
//! gets them all at once, the cancellations looked at before; the others one by one, the
//! cancellations looked at before each.

use modelshare_worker::CancellationToken;

use super::job::Encoded;
use super::panics::{encode_caught, encode_groups_caught};
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
    let groups = plan(
        &lengths,
        encoder.max_tokens(),
        encoder.max_sequences(),
        encoder.pads().then_some(MAX_PADDING),
    );
    let mut wanted = |group: Vec<usize>| -> Vec<usize> {
        group
            .into_iter()
            .filter(|&i| {
                let gone = cancels.get(i).is_some_and(CancellationToken::is_cancelled);
                cancelled[i] = gone;
                !gone
            })
            .collect()
    };
    let mut put = |group: &[usize], vectors: &[f32]| -> Result<(), EncodeError> {
        if vectors.len() != group.len() * hidden {
            return Err(EncodeError::Device(format!(
                "the encoder returned {} values for {} sequences of {hidden}",
                vectors.len(),
                group.len()
            )));
        }
        for (row, &i) in vectors.chunks_exact(hidden).zip(group) {
            out[i * hidden..(i + 1) * hidden].copy_from_slice(row);
        }
        Ok(())
    };
    let groups: Vec<Vec<usize>> = groups
        .into_iter()
        .map(&mut wanted)
        .filter(|g| !g.is_empty())
        .collect();
    if encoder.queues_groups() {
        let members: Vec<Vec<&Sequence>> = groups
            .iter()
            .map(|g| g.iter().map(|&i| &seqs[i]).collect())
            .collect();
        let all = encode_groups_caught(encoder, &members)?;
        if all.len() != groups.len() {
            return Err(EncodeError::Device(format!(
                "the encoder returned {} groups for {}",
                all.len(),
                groups.len()
            )));
        }
        for (group, vectors) in groups.iter().zip(&all) {
            put(group, vectors)?;
        }
    } else {
        for group in groups {
            // Cancelled since the plan: looked at again before each group.
            let group = wanted(group);
            if group.is_empty() {
                continue;
            }
            let members: Vec<&Sequence> = group.iter().map(|&i| &seqs[i]).collect();
            let vectors = encode_caught(encoder, &members)?;
            put(&group, &vectors)?;
        }
    }
    Ok(Encoded {
        vectors: out,
        cancelled,
    })
}
