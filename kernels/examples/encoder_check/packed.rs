//! The kernels that read or write token rows, on sequences packed one after the other
//! (`Layout::Packed`, no padded rows): embeddings with each token's position, the head split
//! (zeros past each sequence's end), the merge and pooling. Each is checked against the CPU
//! reference run on the same sequences padded, its valid rows gathered.

use modelshare_kernels::encoder::{self, EmbedArgs, HeadsArgs, Layout};
use modelshare_kernels::reference;
use modelshare_kernels::{Pooling, WeightDtype};

use crate::buf::Buf;
use crate::compare::{Check, POOL_TOL, Tol, compare, unit_tol};
use crate::env::{EPS, Pieces, Res};
use crate::rng::Rng;

/// Where each sequence of `lengths` starts when packed, and the tokens in all.
fn offsets(lengths: &[i32]) -> (Vec<i32>, usize) {
    let mut at = vec![0];
    for &l in lengths {
        at.push(at.last().copied().unwrap_or(0) + l);
    }
    let t = at.last().copied().unwrap_or(0) as usize;
    (at, t)
}

/// `packed` rows (`width` wide) laid out padded to `seq` rows per sequence, `fill` past
/// each sequence's end.
fn pad(packed: &[f32], at: &[i32], seq: usize, width: usize, fill: f32) -> Vec<f32> {
    let b = at.len() - 1;
    let mut out = vec![fill; b * seq * width];
    for i in 0..b {
        let (start, end) = (at[i] as usize * width, at[i + 1] as usize * width);
        out[i * seq * width..i * seq * width + end - start].copy_from_slice(&packed[start..end]);
    }
    out
}

/// The valid rows of `padded` (`seq` rows per sequence), packed.
fn gather(padded: &[f32], at: &[i32], seq: usize, width: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for i in 0..at.len() - 1 {
        let len = (at[i + 1] - at[i]) as usize;
        out.extend_from_slice(&padded[i * seq * width..(i * seq + len) * width]);
    }
    out
}

/// Every packed-layout kernel on the shape's lengths.
pub fn check_packed(cx: &Pieces<'_>, rng: &mut Rng, checks: &mut Vec<Check>) -> Res<()> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = format!("{} packed", cx.label);
    let (st, cache) = (&env.stream, &env.cache);
    let (h, nh, hd, off) = (s.hidden, s.heads, s.head_dim(), s.offset);
    let (at, t) = offsets(&s.lengths);
    let d_at = Buf::ints(st, &at)?;
    let layout = Layout::Packed {
        offsets: d_at.ptr(st),
        rows: t,
    };

    // Embeddings: packed ids with each token's position; the reference runs on the padded
    // ids (position t % seq), its valid rows kept.
    let (vocab, type_vocab) = (50usize, 2usize);
    let positions = s.seq + s.position_offset;
    let ids: Vec<i32> = (0..t).map(|_| rng.below(vocab as u64) as i32).collect();
    let types: Vec<i32> = (0..t).map(|_| rng.below(2) as i32).collect();
    let pos: Vec<i32> = (0..s.batch).flat_map(|i| 0..at[i + 1] - at[i]).collect();
    let word = rng.values(dtype, vocab * h, 1.0);
    let position = rng.values(dtype, positions * h, 1.0);
    let token_type = rng.values(dtype, type_vocab * h, 1.0);
    let gamma = rng.values(dtype, h, 1.0);
    let beta = rng.values(dtype, h, 0.5);
    let as_f = |v: &[i32]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
    let to_i = |v: Vec<f32>| v.into_iter().map(|x| x as i32).collect::<Vec<_>>();
    let padded_ids = to_i(pad(&as_f(&ids), &at, s.seq, 1, 0.0));
    let padded_types = to_i(pad(&as_f(&types), &at, s.seq, 1, 0.0));
    let mut want = vec![0.0; s.batch * s.seq * h];
    reference::embed_layer_norm(
        &mut want,
        &padded_ids,
        s.type_ids.then_some(&padded_types[..]),
        &word,
        &position,
        &token_type,
        &gamma,
        &beta,
        s.seq,
        s.position_offset,
        EPS,
    );
    let want = gather(&want, &at, s.seq, h);
    let (d_ids, d_types, d_pos) = (
        Buf::ints(st, &ids)?,
        Buf::ints(st, &types)?,
        Buf::ints(st, &pos)?,
    );
    let d_word = Buf::input(st, dtype, &word, off)?;
    let d_position = Buf::input(st, dtype, &position, off)?;
    let d_tt = Buf::input(st, dtype, &token_type, off)?;
    let d_gamma = Buf::input(st, dtype, &gamma, off)?;
    let d_beta = Buf::input(st, dtype, &beta, off)?;
    let d_out = Buf::output(st, dtype, t * h, off)?;
    let args = EmbedArgs {
        out: d_out.ptr(st),
        ids: d_ids.ptr(st),
        type_ids: if s.type_ids { d_types.ptr(st) } else { 0 },
        position_ids: d_pos.ptr(st),
        word: d_word.ptr(st),
        position: d_position.ptr(st),
        token_type: d_tt.ptr(st),
        gamma: d_gamma.ptr(st),
        beta: d_beta.ptr(st),
        tokens: t,
        seq_len: s.seq,
        hidden: h,
        vocab,
        positions,
        type_vocab,
        position_offset: s.position_offset,
        eps: EPS,
    };
    // SAFETY: every buffer holds the elements EmbedArgs says (t tokens), on this stream.
    unsafe { encoder::embed_layer_norm(cache, st, dtype, &args) }?;
    let got = d_out.read(st)?;
    checks.push(compare(
        "embed_layer_norm",
        dtype,
        &label,
        &got,
        &want,
        unit_tol(dtype),
    ));

    // Split: packed q/k/v rows to padded heads, zeros past each end (the reference's padded
    // rows are NaN before the split; its outputs there are set to the zeros expected).
    let scale = 1.0 / (hd as f32).sqrt();
    let per_head = s.batch * s.seq * h;
    let mut split_out = Vec::new();
    let mut inputs = Vec::new();
    let mut biases = Vec::new();
    for _ in 0..3 {
        inputs.push(Buf::input(st, dtype, &rng.values(dtype, t * h, 2.0), off)?);
        biases.push(Buf::input(st, dtype, &rng.values(dtype, h, 1.0), off)?);
        split_out.push(Buf::output(st, dtype, per_head, off)?);
    }
    let a = HeadsArgs {
        q: inputs[0].ptr(st),
        k: inputs[1].ptr(st),
        v: inputs[2].ptr(st),
        layout,
        q_bias: biases[0].ptr(st),
        k_bias: biases[1].ptr(st),
        v_bias: biases[2].ptr(st),
        q_out: split_out[0].ptr(st),
        k_out: split_out[1].ptr(st),
        v_out: split_out[2].ptr(st),
        batch: s.batch,
        seq: s.seq,
        heads: nh,
        head_dim: hd,
        q_scale: scale,
    };
    // SAFETY: q, k, v hold t·h elements, the outputs batch·seq·h, the offsets batch + 1.
    unsafe { encoder::split_heads(cache, st, dtype, &a) }?;
    for (i, name) in ["split_heads q", "split_heads k", "split_heads v"]
        .iter()
        .enumerate()
    {
        let packed_in = inputs[i].read(st)?.values;
        let bias = biases[i].read(st)?.values;
        let padded_in = pad(&packed_in, &at, s.seq, h, f32::NAN);
        let mut want = vec![0.0; per_head];
        let sc = if i == 0 { scale } else { 1.0 };
        reference::split_heads(&padded_in, &bias, &mut want, s.batch, s.seq, nh, hd, sc);
        for (j, w) in want.iter_mut().enumerate() {
            let (b, row) = (j / (nh * s.seq * hd), (j / hd) % s.seq);
            if row >= s.lengths[b] as usize {
                *w = 0.0;
            }
        }
        let got = split_out[i].read(st)?;
        checks.push(compare(name, dtype, &label, &got, &want, unit_tol(dtype)));
    }

    // Merge: padded heads back to packed rows, padding dropped.
    let ctx = rng.values(dtype, per_head, 2.0);
    let mut merged = vec![0.0; per_head];
    reference::merge_heads(&ctx, &mut merged, s.batch, s.seq, nh, hd);
    let want = gather(&merged, &at, s.seq, h);
    let d_ctx = Buf::input(st, dtype, &ctx, off)?;
    let d_merged = Buf::output(st, dtype, t * h, off)?;
    // SAFETY: ctx holds batch·seq·h elements, the output t·h, the offsets batch + 1.
    unsafe {
        encoder::merge_heads(
            cache,
            st,
            dtype,
            d_ctx.ptr(st),
            d_merged.ptr(st),
            layout,
            s.batch,
            nh,
            s.seq,
            hd,
        )
    }?;
    let exact = Tol { rel: 0.0, abs: 0.0 };
    checks.push(compare(
        "merge_heads",
        dtype,
        &label,
        &d_merged.read(st)?,
        &want,
        exact,
    ));

    // Pooling over packed rows, mean and CLS (the modes differ only in the reduction, which
    // the padded checks cover), normalized.
    let x = rng.values(dtype, t * h, 2.0);
    let padded_x = pad(&x, &at, s.seq, h, 0.0);
    let d_x = Buf::input(st, dtype, &x, off)?;
    let d_len = Buf::ints(st, &s.lengths)?;
    for mode in [Pooling::Mean, Pooling::Cls] {
        let mut want = vec![0.0; s.batch * h];
        reference::pool(
            &padded_x, &s.lengths, &mut want, s.batch, s.seq, h, mode, true,
        );
        let d_pooled = Buf::output(st, WeightDtype::F32, s.batch * h, 0)?;
        // SAFETY: x holds t·h elements, lengths batch i32, offsets batch + 1, out batch·h f32.
        unsafe {
            encoder::pool(
                cache,
                st,
                dtype,
                d_x.ptr(st),
                layout,
                d_len.ptr(st),
                d_pooled.ptr(st),
                s.batch,
                s.seq,
                h,
                mode,
                true,
            )
        }?;
        let got = d_pooled.read(st)?;
        checks.push(compare(
            &format!("pool {mode:?}"),
            dtype,
            &label,
            &got,
            &want,
            POOL_TOL,
        ));
    }
    Ok(())
}
