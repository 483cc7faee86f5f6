//! A BERT encoder's forward pass on the GPU, as one safe type: [`CudaBert`] reads the weights
//! in place inside an imported arena (a [`Mapping`](modelshare_device::Mapping) it keeps
//! alive), owns its activation buffers (allocated once, sized from its [`Limits`]), and turns
//! token sequences into pooled sentence vectors. Every pointer it hands the launchers is one of its own buffers,
//! or a tensor range checked against the arena's size when it was made, so nothing a caller
//! passes can make it read or write out of bounds: this is the safe layer over the `unsafe`
//! launchers of [`crate::encoder`] and [`crate::blas`].
//!
//! Per group of `B` sequences padded to their longest `S` (`T = B·S` tokens): the ids go up,
//! then per layer three projections, the heads split with their biases (q scaled by 1/√d),
//! the scores as one strided-batched product over `B·heads`, a masked softmax, the context as
//! a second batched product, the heads merged, the output projection, then bias, residual and
//! LayerNorm fused; the feed-forward (bias and exact GELU fused) and a second fused
//! bias-residual-LayerNorm; then pooling (and normalizing) into f32 and its copy down into
//! page-locked memory. [`CudaBert::encode_groups`] queues a job's groups one after the other
//! and waits once, so the GPU does not idle while the host packs the next group.
//! Activations are in the weights' dtype with f32 accumulation everywhere.
//!
//! # Layout
//! - here: the map; every public type is re-exported here.
//! - `model`: [`CudaBert`], its construction and [`CudaBert::encode`].
//! - `pass`: the steps of a call, each a launch (or a few) of [`crate::encoder`] and
//!   [`crate::blas`].
//! - `pack`: a call's [`Tokens`] checked and laid out as a padded group.
//! - `sizes`: [`Dims`] and [`Limits`], their checks, and the sizes derived from them.
//! - `placement`: [`Placed`], each weight's range in the arena, checked.
//! - `buffers`: the device buffers of the inputs and activations.
//! - `weights`: [`EncoderWeights`], the weights by role, generic over where they are.
//! - `stages`: [`StageTimes`], the GPU time of each stage of the calls, when asked for.

mod buffers;
mod graphs;
mod model;
mod pack;
mod pass;
mod placement;
mod replay;
mod sizes;
mod stages;
#[cfg(test)]
mod tests;
mod weights;

pub use self::model::CudaBert;
pub use self::pack::Tokens;
pub use self::placement::Placed;
pub use self::sizes::{Dims, Limits};
pub use self::stages::{Stage, StageTimes};
pub use self::weights::{Embeddings, EncoderWeights, Layer, Linear, Norm};
