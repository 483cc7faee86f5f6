//! The timing of a BERT-large-shaped f16 layer: each step and the whole layer, CUDA events,
//! median of [`TIMED_RUNS`].

use cudarc::driver::sys::CUevent_flags;
use modelshare_kernels::{WeightDtype, encoder};

use crate::enqueue::{Marks, enqueue_layer};
use crate::env::{Env, Res};
use crate::fused::time_fused;
use crate::layer::{layer_bufs, layer_weights};
use crate::rng::Rng;
use crate::shape::Shape;

pub const TIMED_RUNS: usize = 20;

pub struct Timing {
    pub name: String,
    pub us: f64,
    pub tflops: Option<f64>,
    pub gbps: Option<f64>,
}

/// Median times of each step of a BERT-large-shaped f16 layer and of the whole layer.
pub fn time_bert_large(env: &Env) -> Res<Vec<Timing>> {
    let dtype = WeightDtype::F16;
    let s = Shape {
        batch: 128,
        seq: 64,
        hidden: 1024,
        heads: 16,
        lengths: (0..128).map(|i| 32 + (i * 7) % 33).collect(),
        offset: 0,
        type_ids: false,
        position_offset: 0,
    };
    let mut rng = Rng(0x5eed_b1a5);
    let lw = layer_weights(dtype, s.hidden, 4 * s.hidden, &mut rng);
    let x = rng.values(dtype, s.tokens() * s.hidden, 1.0);
    let bufs = layer_bufs(&env.stream, dtype, &s, &x, &lw)?;
    for _ in 0..3 {
        enqueue_layer(env, dtype, &s, &bufs, None)?;
    }
    let mut per_step: Vec<(&'static str, Vec<f64>)> = Vec::new();
    let mut whole = Vec::new();
    for _ in 0..TIMED_RUNS {
        let start = env
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        enqueue_layer(env, dtype, &s, &bufs, None)?;
        let end = env
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let mut marks = Marks::new();
        enqueue_layer(env, dtype, &s, &bufs, Some(&mut marks))?;
        env.stream.synchronize()?;
        whole.push(f64::from(start.elapsed_ms(&end)?) * 1e3);
        for (i, (name, a, b)) in marks.iter().enumerate() {
            if per_step.len() <= i {
                per_step.push((name, Vec::new()));
            }
            per_step[i].1.push(f64::from(a.elapsed_ms(b)?) * 1e3);
        }
    }
    let (t, h) = (s.tokens() as f64, s.hidden as f64);
    let (ffn, seq, bh) = (4.0 * h, s.seq as f64, (s.batch * s.heads) as f64);
    let hd = h / s.heads as f64;
    let es = 2.0;
    // FLOPs of the products; bytes moved (read + write) of the other steps.
    let work = |name: &str| -> (Option<f64>, Option<f64>) {
        match name {
            "linear qkv (3x)" => (Some(3.0 * 2.0 * t * h * h), None),
            "linear out" => (Some(2.0 * t * h * h), None),
            "linear ffn up" | "linear ffn down" => (Some(2.0 * t * h * ffn), None),
            "q·kᵀ" => (Some(2.0 * bh * seq * seq * hd), None),
            "p·v" => (Some(2.0 * bh * seq * hd * seq), None),
            "split_heads" => (None, Some(es * 6.0 * t * h)),
            "masked_softmax" => (None, Some(es * 2.0 * bh * seq * seq)),
            "merge_heads" => (None, Some(es * 2.0 * t * h)),
            "residual_ln 1 (in place)" | "residual_ln 2" => (None, Some(es * 3.0 * t * h)),
            "bias_gelu" => (None, Some(es * 2.0 * t * ffn)),
            "pool mean + normalize" => (None, Some(es * t * h)),
            _ => (None, None),
        }
    };
    let mut out = Vec::new();
    let mut total_flops = 0.0;
    for (name, mut times) in per_step {
        let us = median(&mut times);
        let (flops, bytes) = work(name);
        total_flops += flops.unwrap_or(0.0);
        out.push(Timing {
            name: name.to_owned(),
            us,
            tflops: flops.map(|f| f / us / 1e6),
            gbps: bytes.map(|b| b / us / 1e3),
        });
    }
    let us = median(&mut whole);
    out.push(Timing {
        name: "whole layer".to_owned(),
        us,
        tflops: Some(total_flops / us / 1e6),
        gbps: None,
    });
    let major = env.stream.context().compute_capability()?.0;
    if encoder::attention_supported(dtype, s.head_dim(), major) {
        let heads = [&bufs.heads[0], &bufs.heads[1], &bufs.heads[2]];
        let shape = (s.batch, s.heads, s.seq, s.head_dim());
        out.push(time_fused(env, heads, &bufs.lengths, shape)?);
    }
    Ok(out)
}

pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
