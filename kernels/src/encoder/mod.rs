//! Launchers of the BERT encoder's element-wise and row-wise pieces (`cuda/encoder.cu`):
//! embeddings + LayerNorm, bias + GELU, bias + residual + LayerNorm, head split and merge,
//! masked softmax, fused attention and pooling. The matrix products are cuBLAS
//! ([`crate::blas`]).
//!
//! Activations and weights share one [`WeightDtype`](crate::WeightDtype); the kernels compute in
//! f32 and round once on store. Every pointer is a raw device address (`u64`), as in
//! [`crate::gemv`], because weights live in an IPC-imported arena; index arrays (token ids,
//! lengths) are `i32`. Launchers check sizes (overflow, the kernels' 32-bit limits), null and
//! misaligned pointers and outputs overlapping inputs, pick a 16-byte-vector or a scalar kernel,
//! and enqueue on the caller's stream: they never synchronize, allocate or copy, so a sequence of
//! them can be captured in a CUDA graph. Whether the memory behind a pointer is large enough is the
//! caller's promise, hence `unsafe`.
//!
//! Row kernels (the LayerNorms and the softmax) hold a row in registers, at most
//! [`MAX_ROW_LEN`] elements (short rows share a warp); other sizes are limited only by
//! 64-bit sizes and `i32` widths.
//!
//! Measured on an H100 (`examples/encoder_check/`, a BERT-large layer in f16, batch 128,
//! seq 64, against the device's ~3.0 TB/s copy): LayerNorms, head split/merge and
//! bias_gelu move 2.6-2.75 TB/s, the masked softmax 2.2 TB/s, pooling 1.6 TB/s. The whole
//! layer takes 514 µs (405 TFLOP/s): cuBLAS's linears run at 590-750 TFLOP/s, attention's
//! 64×64 batched products at 45-56, and bias_gelu (51 µs) and split_heads (37 µs) are the
//! largest non-matmul steps (fusing them into the products' epilogues would save most).
//!
//! # Layout
//! - here: the map; every launcher and argument type is re-exported here.
//! - `embed`: [`embed_layer_norm`] and its [`EmbedArgs`].
//! - `residual_norm`: [`bias_residual_layer_norm`] and its [`ResidualNormArgs`].
//! - `gelu`: [`bias_gelu`].
//! - `heads`: [`split_heads`] (with its [`HeadsArgs`]) and [`merge_heads`].
//! - `layout`: [`Layout`], padded or packed sequences in the token-major tensors.
//! - `softmax`: [`masked_softmax`].
//! - `attention`: [`attention`] (scores, softmax and context in one kernel, sm_80+) and its
//!   [`AttentionArgs`]; [`attention_packed`], the same over the packed projections with the
//!   split and merge folded in, and its [`PackedAttentionArgs`].
//! - `pool`: [`pool()`] and [`Pooling`].
//! - `names`: the kernels' names in `encoder.cu`, [`kernel_names`].
//! - `plan`: launch grids of the row and element-wise kernels, [`MAX_ROW_LEN`].
//! - `checks`: the launchers' checks of sizes and pointers.

mod attention;
mod checks;
mod embed;
mod gelu;
mod heads;
mod layout;
mod names;
mod plan;
mod pool;
mod residual_norm;
mod softmax;
#[cfg(test)]
mod tests;

pub use self::attention::{
    ATTENTION_HEAD_DIMS, AttentionArgs, PackedAttentionArgs, attention, attention_packed,
    attention_supported,
};
pub use self::embed::{EmbedArgs, embed_layer_norm};
pub use self::gelu::bias_gelu;
pub use self::heads::{HeadsArgs, merge_heads, split_heads};
pub use self::layout::Layout;
pub use self::names::{ATTENTION, ATTENTION_PACKED, kernel_names};
pub use self::plan::MAX_ROW_LEN;
pub use self::pool::{Pooling, pool};
pub use self::residual_norm::{ResidualNormArgs, bias_residual_layer_norm};
pub use self::softmax::masked_softmax;
