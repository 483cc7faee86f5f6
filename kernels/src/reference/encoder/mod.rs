//! CPU references of the encoder kernels (`crate::encoder`) and of the cuBLAS products
//! (`crate::blas`), on row-major f32 slices.
//!
//! They double as the building blocks of a CPU encoder forward pass, so they are written to
//! be reasonably fast: f32 math (as the kernels), no allocation per row, contiguous inner
//! loops. They are not bit-equal to the GPU (its reductions add in another order; it rounds
//! f16/bf16 outputs), which the GPU checks allow for.
//!
//! # Panics
//!
//! Every function panics if a slice is shorter than the shape it is given says (these are
//! references and CPU building blocks: the device launchers return errors instead).
//!
//! # Layout
//! - here: the map; every reference is re-exported here.
//! - `embed`: [`embed_layer_norm`].
//! - `norm`: [`layer_norm_row`], [`layer_norm_rows`], [`bias_residual_layer_norm`] (and
//!   [in place](bias_residual_layer_norm_in_place)).
//! - `gelu`: [`gelu()`], [`bias_gelu`].
//! - `heads`: [`split_heads`], [`merge_heads`].
//! - `softmax`: [`masked_softmax`].
//! - `pool`: [`pool()`].
//! - `matmul`: [`linear`], [`batched_matmul`].
//! - `slices`: small helpers on rows (sums, lengths) the others share.

mod embed;
mod gelu;
mod heads;
mod matmul;
mod norm;
mod pool;
mod slices;
mod softmax;
#[cfg(test)]
mod tests;

pub use self::embed::embed_layer_norm;
pub use self::gelu::{bias_gelu, gelu};
pub use self::heads::{merge_heads, split_heads};
pub use self::matmul::{batched_matmul, linear};
pub use self::norm::{
    bias_residual_layer_norm, bias_residual_layer_norm_in_place, layer_norm_row, layer_norm_rows,
};
pub use self::pool::pool;
pub use self::softmax::masked_softmax;
