//! The fused attention kernel against a CPU reference in f64: every head size it is built
//! for, f16 and bf16, odd lengths (1, one past a key tile, one short of the padded length, a
//! second query tile), and the rows it must leave alone; then its timing on the BERT-large
//! layer's heads beside the three steps it replaces.

use cudarc::driver::sys::CUevent_flags;
use modelshare_kernels::WeightDtype;
use modelshare_kernels::encoder::{
    self, ATTENTION_HEAD_DIMS, AttentionArgs, Layout, PackedAttentionArgs,
};

use crate::buf::{Buf, Out, round};
use crate::compare::{Check, Tol, compare, unit_tol};
use crate::env::{Env, Res};
use crate::rng::Rng;
use crate::timing::{TIMED_RUNS, Timing, median};

/// (batch, heads, padded length, lengths) of the checked shapes.
fn shapes() -> Vec<(usize, usize, usize, Vec<i32>)> {
    vec![
        (3, 2, 72, vec![72, 33, 1]),
        (2, 3, 8, vec![5, 8]),
        (1, 1, 136, vec![130]),
        (2, 2, 40, vec![0, 17]),
    ]
}

/// softmax(q_r·kᵀ over j < len)·v for each row r < len of one head (`[seq, hd]` each).
fn reference(q: &[f32], k: &[f32], v: &[f32], len: usize, hd: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; len * hd];
    for r in 0..len {
        let scores: Vec<f64> = (0..len)
            .map(|j| {
                (0..hd)
                    .map(|d| f64::from(q[r * hd + d]) * f64::from(k[j * hd + d]))
                    .sum()
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        for d in 0..hd {
            let c: f64 = (0..len)
                .map(|j| e[j] * f64::from(v[j * hd + d]))
                .sum::<f64>()
                / sum;
            out[r * hd + d] = c as f32;
        }
    }
    out
}

/// Every head size and shape for `dtype` (f16 or bf16).
pub fn check_fused_attention(
    env: &Env,
    dtype: WeightDtype,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<()> {
    let st = &env.stream;
    for hd in ATTENTION_HEAD_DIMS {
        for (batch, heads, seq, lengths) in shapes() {
            let n = batch * heads * seq * hd;
            let scale = 1.0 / (hd as f32).sqrt();
            let q: Vec<f32> = rng.values(dtype, n, 2.0 * scale);
            let k = rng.values(dtype, n, 2.0);
            let v = rng.values(dtype, n, 1.0);
            let (d_q, d_k, d_v) = (
                Buf::input(st, dtype, &q, 0)?,
                Buf::input(st, dtype, &k, 0)?,
                Buf::input(st, dtype, &v, 0)?,
            );
            let d_len = Buf::ints(st, &lengths)?;
            let args = AttentionArgs {
                q: d_q.ptr(st),
                k: d_k.ptr(st),
                v: d_v.ptr(st),
                lengths: d_len.ptr(st),
                batch,
                heads,
                seq,
                head_dim: hd,
            };
            // SAFETY: q, k, v hold batch·heads·seq·hd elements, lengths batch i32.
            unsafe { encoder::attention(&env.cache, st, dtype, &args) }?;
            let got = d_q.read(st)?;
            // The context rows inside each length; the rows past it must still hold q.
            let (mut want, mut gathered, mut kept) = (Vec::new(), Vec::new(), true);
            for (b, &len) in lengths.iter().enumerate() {
                let len = len.clamp(0, seq as i32) as usize;
                for h in 0..heads {
                    let at = (b * heads + h) * seq * hd;
                    let head = |x: &[f32]| x[at..at + seq * hd].to_vec();
                    want.extend(reference(&head(&q), &head(&k), &head(&v), len, hd));
                    gathered.extend_from_slice(&got.values[at..at + len * hd]);
                    kept &=
                        got.values[at + len * hd..at + seq * hd] == q[at + len * hd..at + seq * hd];
                }
            }
            let u = unit_tol(dtype).rel;
            let label = format!("b{batch} nh{heads} s{seq} hd{hd} len{lengths:?}");
            let out = Out {
                values: gathered,
                guard_ok: got.guard_ok && kept,
            };
            let tol = Tol {
                rel: 2.0 * u,
                abs: 2.0 * u,
            };
            checks.push(compare("fused attention", dtype, &label, &out, &want, tol));
        }
    }
    Ok(())
}

/// The packed variant: the projections `[t, heads·hd]` without bias, sequences packed, the
/// biases and q's scale applied as they are read, the context over q's rows; against the
/// reference run on the heads split on the host (rounded to the dtype as the split does).
pub fn check_fused_packed(
    env: &Env,
    dtype: WeightDtype,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<()> {
    let st = &env.stream;
    for hd in ATTENTION_HEAD_DIMS {
        for (batch, heads, seq, lengths) in shapes() {
            let width = heads * hd;
            let mut offsets = vec![0i32];
            for &l in &lengths {
                offsets.push(offsets.last().copied().unwrap_or(0) + l);
            }
            let t = *offsets.last().unwrap_or(&0) as usize;
            let scale = 1.0 / (hd as f32).sqrt();
            let (q, k, v) = (
                rng.values(dtype, t * width, 2.0),
                rng.values(dtype, t * width, 2.0),
                rng.values(dtype, t * width, 1.0),
            );
            let (bq, bk, bv) = (
                rng.values(dtype, width, 1.0),
                rng.values(dtype, width, 1.0),
                rng.values(dtype, width, 0.5),
            );
            let d = |x: &[f32]| Buf::input(st, dtype, x, 0);
            let (d_q, d_k, d_v) = (d(&q)?, d(&k)?, d(&v)?);
            let (d_bq, d_bk, d_bv) = (d(&bq)?, d(&bk)?, d(&bv)?);
            let d_off = Buf::ints(st, &offsets)?;
            let args = PackedAttentionArgs {
                q: d_q.ptr(st),
                k: d_k.ptr(st),
                v: d_v.ptr(st),
                q_bias: d_bq.ptr(st),
                k_bias: d_bk.ptr(st),
                v_bias: d_bv.ptr(st),
                layout: Layout::Packed {
                    offsets: d_off.ptr(st),
                    rows: t,
                },
                batch,
                heads,
                seq,
                head_dim: hd,
                q_scale: scale,
            };
            // SAFETY: q, k, v hold t·width elements, the biases width, the offsets batch + 1.
            unsafe { encoder::attention_packed(&env.cache, st, dtype, &args) }?;
            let got = d_q.read(st)?;
            let mut want = vec![0.0f32; t * width];
            for (&start, &len) in offsets.iter().zip(&lengths) {
                let (start, len) = (start as usize, len as usize);
                for h in 0..heads {
                    // The head split on the host: bias added (q scaled), rounded once.
                    let head = |x: &[f32], bias: &[f32], sc: f32| -> Vec<f32> {
                        (0..len * hd)
                            .map(|i| {
                                let (r, c) = (i / hd, h * hd + i % hd);
                                round(dtype, (x[(start + r) * width + c] + bias[c]) * sc)
                            })
                            .collect()
                    };
                    let ctx = reference(
                        &head(&q, &bq, scale),
                        &head(&k, &bk, 1.0),
                        &head(&v, &bv, 1.0),
                        len,
                        hd,
                    );
                    for r in 0..len {
                        let at = (start + r) * width + h * hd;
                        want[at..at + hd].copy_from_slice(&ctx[r * hd..(r + 1) * hd]);
                    }
                }
            }
            let u = unit_tol(dtype).rel;
            let label = format!("packed b{batch} nh{heads} s{seq} hd{hd} len{lengths:?}");
            let out = Out {
                values: got.values,
                guard_ok: got.guard_ok,
            };
            let tol = Tol {
                rel: 2.0 * u,
                abs: 2.0 * u,
            };
            checks.push(compare("fused attention", dtype, &label, &out, &want, tol));
        }
    }
    Ok(())
}

/// The fused kernel on `[batch·heads, seq, hd]` heads of `lengths` (in place over q, which
/// only rescales what it holds), median of [`TIMED_RUNS`]; its FLOPs counted as the padded
/// products' (4·batch·heads·seq²·hd), to compare with q·kᵀ and p·v.
pub fn time_fused(
    env: &Env,
    heads_bufs: [&Buf; 3],
    lengths: &Buf,
    (batch, heads, seq, hd): (usize, usize, usize, usize),
) -> Res<Timing> {
    let st = &env.stream;
    let args = AttentionArgs {
        q: heads_bufs[0].ptr(st),
        k: heads_bufs[1].ptr(st),
        v: heads_bufs[2].ptr(st),
        lengths: lengths.ptr(st),
        batch,
        heads,
        seq,
        head_dim: hd,
    };
    let mut times = Vec::new();
    for i in 0..TIMED_RUNS + 3 {
        let start = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        // SAFETY: the layer's heads hold batch·heads·seq·hd elements each, lengths batch i32.
        unsafe { encoder::attention(&env.cache, st, WeightDtype::F16, &args) }?;
        let end = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        st.synchronize()?;
        if i >= 3 {
            times.push(f64::from(start.elapsed_ms(&end)?) * 1e3);
        }
    }
    let us = median(&mut times);
    let flops = 4.0 * (batch * heads) as f64 * (seq * seq) as f64 * hd as f64;
    Ok(Timing {
        name: "fused attention (replaces q·kᵀ, softmax, p·v)".to_owned(),
        us,
        tflops: Some(flops / us / 1e6),
        gbps: None,
    })
}
