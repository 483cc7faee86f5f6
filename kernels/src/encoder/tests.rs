//! Tests of the launchers' checks and plans: kernel names, grids, pointers and sizes.

use super::embed::plan_embed;
use super::gelu::plan_bias_gelu;
use super::heads::{plan_merge, plan_split};
use super::names::*;
use super::plan::*;
use super::pool::plan_pool;
use super::residual_norm::plan_residual;
use super::softmax::plan_softmax;
use super::*;
use crate::compile::ENCODER_SOURCE;
use crate::gemv::WeightDtype;

const A: u64 = 0x7f00_0000_0000;
const B: u64 = 0x7f10_0000_0000;
const C: u64 = 0x7f20_0000_0000;
const D: u64 = 0x7f30_0000_0000;
const E: u64 = 0x7f40_0000_0000;
const F: u64 = 0x7f50_0000_0000;
const G: u64 = 0x7f60_0000_0000;
const H: u64 = 0x7f70_0000_0000;
const I: u64 = 0x7f80_0000_0000;

fn embed(hidden: usize) -> EmbedArgs {
    EmbedArgs {
        out: A,
        ids: B,
        type_ids: C,
        position_ids: 0,
        word: D,
        position: E,
        token_type: F,
        gamma: G,
        beta: H,
        tokens: 6,
        seq_len: 3,
        hidden,
        vocab: 100,
        positions: 512,
        type_vocab: 2,
        position_offset: 0,
        eps: 1e-12,
    }
}

/// A launcher picks a kernel name that `encoder.cu` does not define.
#[test]
fn kernel_names_are_in_the_source() {
    let code = ENCODER_SOURCE.code;
    for op in [
        "embed_ln",
        "residual_ln",
        "softmax",
        "bias_gelu",
        "split_heads",
        "merge_heads",
    ] {
        assert!(code.contains(&format!(", {op})")), "{op}");
    }
    for name in POOL {
        assert!(code.contains(name), "{name}");
    }
    assert_eq!(kernel_names().count(), 39);
    assert_eq!(pick(&SOFTMAX, WeightDtype::BF16, true), "ms_softmax_bf16_v");
    assert_eq!(
        pick(&EMBED_LN, WeightDtype::F32, false),
        "ms_embed_ln_f32_s"
    );
    assert_eq!(
        pick(&MERGE_HEADS, WeightDtype::F16, true),
        "ms_merge_heads_f16_v"
    );
}

/// Row kernels get blocks that do not cover the row, or exceed their launch bounds.
#[test]
fn row_plans_cover_the_row() {
    for (len, width, threads, rows_per_block) in [
        (1, 1, 1, 128),
        (8, 8, 1, 128),
        (64, 8, 4, 32),
        (100, 1, 8, 16),
        (500, 1, 32, 4),
        (384, 8, 32, 4),
        (384, 4, 32, 4),
        (384, 1, 32, 4),
        (768, 8, 64, 2),
        (1024, 8, 64, 2),
        (1024, 4, 64, 2),
        (4096, 8, 256, 1),
        (4096, 1, 256, 1),
        (MAX_ROW_LEN, 1, 512, 1),
        (513, 1, 64, 2),
    ] {
        let p = row_plan("k", 10, len, width).expect("plan");
        assert_eq!(p.block, (threads, rows_per_block, 1), "{len}/{width}");
        assert!(p.block.0 as usize * ROW_ELEMS >= len, "{len}");
        assert!(p.block.0 * p.block.1 <= ROW_MAX_THREADS as u32);
        assert_eq!((p.block.0 * p.block.1) % 32, 0, "whole warps");
        assert_eq!(p.grid.0 as u64, 10u64.div_ceil(u64::from(rows_per_block)));
    }
    assert!(row_plan("k", 1, 0, 1).is_err());
    assert!(row_plan("k", 1, MAX_ROW_LEN + 1, 1).is_err());
}

/// The embedding would take the wrong kernel for its width or alignment, or launch for
/// no tokens.
#[test]
fn embed_picks_its_kernel() {
    let ok = |a: &EmbedArgs| plan_embed(WeightDtype::F16, a);
    let plan = ok(&embed(384)).expect("plan").expect("some");
    assert_eq!(plan.kernel, "ms_embed_ln_f16_v");
    assert_eq!(
        ok(&embed(100)).expect("plan").expect("some").kernel,
        "ms_embed_ln_f16_s"
    );
    assert_eq!(
        ok(&EmbedArgs {
            tokens: 0,
            ..embed(384)
        })
        .expect("plan"),
        None
    );
    // Misaligned by 2 bytes: scalar kernel, not an error.
    assert_eq!(
        ok(&EmbedArgs {
            word: D + 2,
            ..embed(384)
        })
        .expect("plan")
        .expect("some")
        .kernel,
        "ms_embed_ln_f16_s"
    );
}

/// Embedding positions past the position table (with the offset) reach the device.
#[test]
fn embed_checks_positions() {
    let ok = |a: &EmbedArgs| plan_embed(WeightDtype::F16, a);
    // Positions: seq_len + offset must fit.
    assert!(
        ok(&EmbedArgs {
            seq_len: 512,
            ..embed(384)
        })
        .is_ok()
    );
    assert!(
        ok(&EmbedArgs {
            seq_len: 513,
            ..embed(384)
        })
        .is_err()
    );
    assert!(
        ok(&EmbedArgs {
            seq_len: 511,
            position_offset: 2,
            ..embed(384)
        })
        .is_err()
    );
    assert!(
        ok(&EmbedArgs {
            position_offset: usize::MAX,
            ..embed(384)
        })
        .is_err()
    );
    assert!(
        ok(&EmbedArgs {
            seq_len: 0,
            ..embed(384)
        })
        .is_err()
    );
}

/// Embedding pointers, sizes or eps that would read out of bounds reach the device.
#[test]
fn embed_checks_pointers_and_sizes() {
    let ok = |a: &EmbedArgs| plan_embed(WeightDtype::F16, a);
    // type_ids may be absent; other pointers may not.
    assert!(
        ok(&EmbedArgs {
            type_ids: 0,
            ..embed(384)
        })
        .is_ok()
    );
    assert!(
        ok(&EmbedArgs {
            word: 0,
            ..embed(384)
        })
        .is_err()
    );
    assert!(
        ok(&EmbedArgs {
            ids: B + 2,
            ..embed(384)
        })
        .is_err()
    );
    assert!(
        ok(&EmbedArgs {
            gamma: G + 1,
            ..embed(384)
        })
        .is_err()
    );
    // Out overlapping an input, bad eps, hidden limits.
    assert!(
        ok(&EmbedArgs {
            out: G - 2,
            ..embed(384)
        })
        .is_err()
    );
    assert!(
        ok(&EmbedArgs {
            eps: f32::NAN,
            ..embed(384)
        })
        .is_err()
    );
    assert!(
        ok(&EmbedArgs {
            eps: -1.0,
            ..embed(384)
        })
        .is_err()
    );
    assert!(ok(&embed(0)).is_err());
    assert!(ok(&embed(MAX_ROW_LEN + 1)).is_err());
    assert!(
        ok(&EmbedArgs {
            vocab: usize::MAX,
            ..embed(384)
        })
        .is_err()
    );
}

/// Residual LayerNorm refuses a legal in-place call or accepts a shifted overlap.
#[test]
fn residual_norm_aliasing() {
    let args = ResidualNormArgs {
        out: A,
        x: B,
        bias: C,
        residual: D,
        gamma: E,
        beta: F,
        rows: 8,
        cols: 768,
        eps: 1e-12,
    };
    let plan = |a: &ResidualNormArgs| plan_residual(WeightDtype::BF16, a);
    assert_eq!(
        plan(&args).expect("plan").expect("some").kernel,
        "ms_residual_ln_bf16_v"
    );
    assert!(
        plan(&ResidualNormArgs { out: B, ..args }).is_ok(),
        "out = x"
    );
    assert!(
        plan(&ResidualNormArgs { out: D, ..args }).is_ok(),
        "out = residual"
    );
    assert!(plan(&ResidualNormArgs { out: D + 2, ..args }).is_err());
    assert!(
        plan(&ResidualNormArgs {
            out: B - 16,
            ..args
        })
        .is_err()
    );
    assert!(
        plan(&ResidualNormArgs { out: C, ..args }).is_err(),
        "out = bias"
    );
    assert!(plan(&ResidualNormArgs { cols: 0, ..args }).is_err());
    assert_eq!(
        plan(&ResidualNormArgs { rows: 0, ..args }).expect("plan"),
        None
    );
    assert_eq!(
        plan(&ResidualNormArgs { cols: 100, ..args })
            .expect("plan")
            .expect("some")
            .kernel,
        "ms_residual_ln_bf16_s"
    );
}

/// Head split arguments over the buffers A..I: 2 sequences of `seq`, 3 heads of 64.
fn heads(layout: Layout, seq: usize) -> HeadsArgs {
    HeadsArgs {
        q: A,
        k: B,
        v: C,
        layout,
        q_bias: D,
        k_bias: E,
        v_bias: F,
        q_out: G,
        k_out: H,
        v_out: I,
        batch: 2,
        seq,
        heads: 3,
        head_dim: 64,
        q_scale: 0.125,
    }
}

/// Head split/merge accept overlapping outputs or vectorize across head boundaries.
#[test]
fn heads_checks() {
    let args = heads(Layout::Padded, 5);
    let plan = |a: &HeadsArgs| plan_split(WeightDtype::F32, a);
    let p = plan(&args).expect("plan").expect("some");
    assert_eq!(p.kernel, "ms_split_heads_f32_v");
    // A padded row (b·seq = 10 of them) per threadIdx.y: 192 / 4 = 48 chunks on 64 lanes,
    // two rows a block; q, k, v along y.
    assert_eq!((p.grid, p.block), ((5, 3, 1), (64, 2, 1)));
    let wide = plan(&HeadsArgs {
        heads: 32,
        head_dim: 128,
        ..args
    })
    .expect("plan")
    .expect("some");
    assert_eq!(
        (wide.grid, wide.block),
        ((10, 3, 1), (256, 1, 1)),
        "strides past 256"
    );
    // head_dim 6 with f32: 24 bytes a head, not whole chunks.
    assert_eq!(
        plan(&HeadsArgs {
            head_dim: 6,
            ..args
        })
        .expect("plan")
        .expect("some")
        .kernel,
        "ms_split_heads_f32_s"
    );
    assert!(
        plan(&HeadsArgs {
            k_out: G + 4,
            ..args
        })
        .is_err()
    );
    assert!(plan(&HeadsArgs { v_out: A, ..args }).is_err());
    assert!(
        plan(&HeadsArgs {
            q_scale: f32::INFINITY,
            ..args
        })
        .is_err()
    );
    assert_eq!(plan(&HeadsArgs { batch: 0, ..args }).expect("plan"), None);

    let merge = |ctx, out, head_dim| {
        plan_merge(
            WeightDtype::F16,
            ctx,
            out,
            Layout::Padded,
            2,
            3,
            5,
            head_dim,
        )
    };
    assert_eq!(
        merge(A, B, 64).expect("plan").expect("some").kernel,
        "ms_merge_heads_f16_v"
    );
    assert_eq!(
        merge(A, B, 12).expect("plan").expect("some").kernel,
        "ms_merge_heads_f16_s"
    );
    assert!(merge(A, A + 2, 64).is_err());
    assert!(merge(0, B, 64).is_err());
}

/// Packed sequences: the launchers size the token rows by the layout's rows, check the
/// offsets like any buffer, and refuse outputs over them.
#[test]
fn packed_layout_checks() {
    let packed = |offsets, rows| Layout::Packed { offsets, rows };
    let args = heads(packed(D + 4096, 7), 8);
    let split = |a: &HeadsArgs| plan_split(WeightDtype::F16, a);
    let p = split(&args).expect("plan").expect("some");
    // The grid covers the padded outputs (2·3·8·64 elements), not the 7 packed rows.
    assert_eq!(p.kernel, "ms_split_heads_f16_v");
    assert!(
        split(&HeadsArgs {
            layout: packed(D + 2, 7),
            ..args
        })
        .is_err(),
        "misaligned offsets"
    );
    assert!(
        split(&HeadsArgs {
            layout: packed(0, 7),
            ..args
        })
        .is_err(),
        "null offsets"
    );
    // An output over the offsets (which sit inside q_out's padded range).
    assert!(
        split(&HeadsArgs {
            layout: packed(G + 64, 7),
            ..args
        })
        .is_err()
    );
    // q_out right after 7 packed rows of q is fine; after 16 padded ones it would overlap.
    let q_rows = 7 * 3 * 64 * 2;
    let tight = HeadsArgs {
        q_out: A + q_rows,
        ..args
    };
    assert!(split(&tight).is_ok());
    assert!(
        split(&HeadsArgs {
            layout: Layout::Padded,
            ..tight
        })
        .is_err()
    );
    assert!(
        split(&HeadsArgs {
            layout: packed(D + 4096, 1 << 31),
            ..args
        })
        .is_err(),
        "rows past i32"
    );

    let merge = |out, layout| plan_merge(WeightDtype::F16, A, out, layout, 2, 3, 8, 64);
    // ctx holds 2·3·8·64 elements; 7 packed rows of out may follow 7·192 elements later...
    assert!(merge(A + 2 * 3 * 8 * 64 * 2, packed(B, 7)).is_ok());
    assert!(
        merge(C, packed(C + 100, 7)).is_err(),
        "out over the offsets"
    );
    assert!(merge(C, packed(B, 7)).is_ok());

    let pool = |x, layout| plan_pool(WeightDtype::F32, x, layout, B, C, 3, 16, 100);
    assert!(pool(A, packed(D, 20)).is_ok());
    assert!(pool(A, packed(C + 8, 20)).is_err(), "offsets inside out");
    assert!(pool(A, packed(D + 1, 20)).is_err(), "misaligned offsets");
}

/// Softmax, GELU and pooling accept bad pointers or sizes.
#[test]
fn softmax_gelu_pool_checks() {
    let sm = |scores, lengths, seq| plan_softmax(WeightDtype::F16, scores, lengths, 2, 4, seq);
    assert_eq!(
        sm(A, B, 64).expect("plan").expect("some").kernel,
        "ms_softmax_f16_v"
    );
    assert_eq!(
        sm(A, B, 63).expect("plan").expect("some").kernel,
        "ms_softmax_f16_s"
    );
    assert!(sm(A, B + 2, 64).is_err(), "misaligned lengths");
    assert!(sm(A, A + 8, 64).is_err(), "lengths inside scores");
    assert!(sm(A, B, MAX_ROW_LEN + 1).is_err());
    assert_eq!(sm(A, B, 0).expect("plan"), None);

    let gelu = |x, bias, cols| plan_bias_gelu(WeightDtype::BF16, x, bias, 7, cols, 132);
    assert_eq!(
        gelu(A, B, 3072).expect("plan").expect("some").kernel,
        "ms_bias_gelu_bf16_v"
    );
    assert_eq!(
        gelu(A, B, 100).expect("plan").expect("some").kernel,
        "ms_bias_gelu_bf16_s"
    );
    assert!(gelu(A, A + 64, 100).is_err());
    assert!(gelu(A + 1, B, 100).is_err());
    assert_eq!(gelu(A, B, 0).expect("plan"), None);
    let big = plan_bias_gelu(WeightDtype::F32, A, B, 1 << 20, 4096, 132)
        .expect("plan")
        .expect("some");
    assert_eq!(big.grid.0 as u64, 132 * FLAT_BLOCKS_PER_SM);

    let pool = |x, lengths, out, batch| {
        plan_pool(
            WeightDtype::F32,
            x,
            Layout::Padded,
            lengths,
            out,
            batch,
            16,
            100,
        )
    };
    let p = pool(A, B, C, 3).expect("plan").expect("some");
    assert_eq!((p.kernel, p.grid.0, p.block.0), ("ms_pool_f32", 3, 128));
    let wide = plan_pool(WeightDtype::F16, A, Layout::Padded, B, C, 3, 16, 4096)
        .expect("plan")
        .expect("some");
    assert_eq!(wide.block.0, 1024);
    assert!(pool(A, B, C + 2, 3).is_err());
    assert!(pool(A, B, A + 4, 3).is_err());
    assert_eq!(pool(A, B, C, 0).expect("plan"), None);
}

/// The fused attention's plans: a dtype or head size it is not built for, misaligned rows or
/// biases, q over another input, or a padded layout for the packed kernel, would launch.
#[test]
fn attention_checks() {
    use super::attention::{plan_attention, plan_attention_packed};
    let args = AttentionArgs {
        q: A,
        k: B,
        v: C,
        lengths: D,
        batch: 3,
        heads: 16,
        seq: 72,
        head_dim: 64,
    };
    let p = plan_attention(WeightDtype::F16, &args)
        .expect("plan")
        .expect("some");
    assert_eq!(p.kernel, "ms_attention_f16_64");
    assert_eq!(
        (p.grid, p.block),
        ((48, 2, 1), (128, 1, 1)),
        "two query tiles of 64"
    );
    let bad = |a: AttentionArgs, dtype| plan_attention(dtype, &a).is_err();
    assert!(bad(args, WeightDtype::F32));
    assert!(bad(
        AttentionArgs {
            head_dim: 96,
            ..args
        },
        WeightDtype::F16
    ));
    assert!(
        bad(AttentionArgs { k: B + 8, ..args }, WeightDtype::F16),
        "misaligned"
    );
    assert!(
        bad(AttentionArgs { k: A + 64, ..args }, WeightDtype::BF16),
        "q over k"
    );
    assert_eq!(
        plan_attention(WeightDtype::BF16, &AttentionArgs { batch: 0, ..args }).expect("plan"),
        None
    );

    let packed = PackedAttentionArgs {
        q: A,
        k: B,
        v: C,
        q_bias: D,
        k_bias: E,
        v_bias: F,
        layout: Layout::Packed {
            offsets: G,
            rows: 100,
        },
        batch: 3,
        heads: 12,
        seq: 40,
        head_dim: 32,
        q_scale: 0.125,
    };
    let p = plan_attention_packed(WeightDtype::BF16, &packed)
        .expect("plan")
        .expect("some");
    assert_eq!(p.kernel, "ms_attention_packed_bf16_32");
    assert_eq!(p.grid, (36, 1, 1));
    let bad = |a: PackedAttentionArgs| plan_attention_packed(WeightDtype::F16, &a).is_err();
    assert!(bad(PackedAttentionArgs {
        layout: Layout::Padded,
        ..packed
    }));
    assert!(bad(PackedAttentionArgs {
        k_bias: E + 2,
        ..packed
    }));
    assert!(
        bad(PackedAttentionArgs {
            layout: Layout::Packed {
                offsets: A + 1024,
                rows: 100
            },
            ..packed
        }),
        "offsets inside q's 100 rows"
    );
    assert!(bad(PackedAttentionArgs {
        q_scale: f32::NAN,
        ..packed
    }));
    let empty = PackedAttentionArgs {
        layout: Layout::Packed {
            offsets: G,
            rows: 0,
        },
        ..packed
    };
    assert_eq!(
        plan_attention_packed(WeightDtype::F16, &empty).expect("plan"),
        None
    );
}
