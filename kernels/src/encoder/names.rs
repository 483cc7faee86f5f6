//! The kernels' names, as `encoder.cu`'s `MS_ALL_WIDTHS` (and its pooling kernels) define
//! them, and the pick of one for a launch's dtype and width.

use crate::gemv::WeightDtype;

/// One kernel in each width for each dtype: f32, f16, bf16 × scalar, 16-byte vector.
pub(super) type Names = [&'static str; 6];

// As `encoder.cu`'s `MS_ALL_WIDTHS` names them.
pub(super) const EMBED_LN: Names = [
    "ms_embed_ln_f32_s",
    "ms_embed_ln_f32_v",
    "ms_embed_ln_f16_s",
    "ms_embed_ln_f16_v",
    "ms_embed_ln_bf16_s",
    "ms_embed_ln_bf16_v",
];

pub(super) const RESIDUAL_LN: Names = [
    "ms_residual_ln_f32_s",
    "ms_residual_ln_f32_v",
    "ms_residual_ln_f16_s",
    "ms_residual_ln_f16_v",
    "ms_residual_ln_bf16_s",
    "ms_residual_ln_bf16_v",
];

pub(super) const SOFTMAX: Names = [
    "ms_softmax_f32_s",
    "ms_softmax_f32_v",
    "ms_softmax_f16_s",
    "ms_softmax_f16_v",
    "ms_softmax_bf16_s",
    "ms_softmax_bf16_v",
];

pub(super) const BIAS_GELU: Names = [
    "ms_bias_gelu_f32_s",
    "ms_bias_gelu_f32_v",
    "ms_bias_gelu_f16_s",
    "ms_bias_gelu_f16_v",
    "ms_bias_gelu_bf16_s",
    "ms_bias_gelu_bf16_v",
];

pub(super) const SPLIT_HEADS: Names = [
    "ms_split_heads_f32_s",
    "ms_split_heads_f32_v",
    "ms_split_heads_f16_s",
    "ms_split_heads_f16_v",
    "ms_split_heads_bf16_s",
    "ms_split_heads_bf16_v",
];

pub(super) const MERGE_HEADS: Names = [
    "ms_merge_heads_f32_s",
    "ms_merge_heads_f32_v",
    "ms_merge_heads_f16_s",
    "ms_merge_heads_f16_v",
    "ms_merge_heads_bf16_s",
    "ms_merge_heads_bf16_v",
];
pub(super) const POOL: [&str; 3] = ["ms_pool_f32", "ms_pool_f16", "ms_pool_bf16"];

/// The fused attention kernels: f16 then bf16, each for head sizes 32, 64, 80 and 128
/// (`ATTENTION_HEAD_DIMS`). Built for sm_80 and newer only, so not in [`kernel_names`].
pub const ATTENTION: [&str; 8] = [
    "ms_attention_f16_32",
    "ms_attention_f16_64",
    "ms_attention_f16_80",
    "ms_attention_f16_128",
    "ms_attention_bf16_32",
    "ms_attention_bf16_64",
    "ms_attention_bf16_80",
    "ms_attention_bf16_128",
];

/// The fused attention kernels over the packed projections (bias, scale, split and merge
/// folded in), in [`ATTENTION`]'s order.
pub const ATTENTION_PACKED: [&str; 8] = [
    "ms_attention_packed_f16_32",
    "ms_attention_packed_f16_64",
    "ms_attention_packed_f16_80",
    "ms_attention_packed_f16_128",
    "ms_attention_packed_bf16_32",
    "ms_attention_packed_bf16_64",
    "ms_attention_packed_bf16_80",
    "ms_attention_packed_bf16_128",
];

/// Every kernel name the launchers use, for the NVRTC compile test.
pub fn kernel_names() -> impl Iterator<Item = &'static str> {
    [
        EMBED_LN,
        RESIDUAL_LN,
        SOFTMAX,
        BIAS_GELU,
        SPLIT_HEADS,
        MERGE_HEADS,
    ]
    .into_iter()
    .flatten()
    .chain(POOL)
}

/// The dtype's pair in a [`Names`] (f32, f16, bf16) and its kernel in [`POOL`].
pub(super) const fn dtype_index(dtype: WeightDtype) -> usize {
    match dtype {
        WeightDtype::F32 => 0,
        WeightDtype::F16 => 1,
        WeightDtype::BF16 => 2,
    }
}

/// The kernel of `names` for `dtype`, the 16-byte one if `vec`.
pub(super) fn pick(names: &Names, dtype: WeightDtype, vec: bool) -> &'static str {
    names[2 * dtype_index(dtype) + usize::from(vec)]
}
