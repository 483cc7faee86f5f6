//! The encoder's device buffers: its inputs and activations, allocated once for its limits.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::sizes::{Dims, Limits, buffer_tokens, scores_elems};
use crate::error::KernelError;

/// One device buffer and its address.
#[derive(Debug)]
pub(super) struct Buffer<T> {
    pub(super) slice: CudaSlice<T>,
    pub(super) ptr: u64,
}

impl<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits> Buffer<T> {
    /// `len` zeroed elements (at least 16) on `stream`.
    fn new(stream: &Arc<CudaStream>, len: usize) -> Result<Self, KernelError> {
        let slice = stream.alloc_zeros::<T>(len.max(16))?;
        let (ptr, sync) = slice.device_ptr(stream);
        drop(sync);
        Ok(Self { slice, ptr })
    }
}

/// The activations of one call, in the weights' dtype unless said otherwise.
#[derive(Debug)]
pub(super) struct Buffers {
    pub(super) ids: Buffer<i32>,
    pub(super) type_ids: Buffer<i32>,
    pub(super) lengths: Buffer<i32>,
    pub(super) x: Buffer<u8>,
    /// The query, key and value projections, one after the other, [`Buffers::slot`] elements
    /// apart (so that the three can be one strided-batched product); `q`, `k` and `v` are
    /// the three slots' addresses. `k` also takes the output projections.
    pub(super) qkv: Buffer<u8>,
    pub(super) q: u64,
    pub(super) k: u64,
    pub(super) v: u64,
    /// Elements from one projection's slot to the next.
    pub(super) slot: usize,
    pub(super) qh: Buffer<u8>,
    pub(super) kh: Buffer<u8>,
    pub(super) vh: Buffer<u8>,
    pub(super) up: Buffer<u8>,
    pub(super) scores: Buffer<u8>,
    pub(super) pooled: Buffer<f32>,
}

impl Buffers {
    /// The buffers for `limits` of an encoder of `dims` with elements of `es` bytes, zeroed,
    /// on `stream`.
    pub(super) fn new(
        stream: &Arc<CudaStream>,
        dims: &Dims,
        limits: &Limits,
        es: usize,
    ) -> Result<Self, KernelError> {
        let h = dims.hidden;
        let t = buffer_tokens(dims, limits, es)?;
        let act = |n: usize| Buffer::<u8>::new(stream, n * es);
        let qkv = act(3 * t * h)?;
        let at = |i: usize| qkv.ptr + (i * t * h * es) as u64;
        let (q, k, v) = (at(0), at(1), at(2));
        Ok(Self {
            ids: Buffer::new(stream, t)?,
            type_ids: Buffer::new(stream, t)?,
            lengths: Buffer::new(stream, limits.max_sequences)?,
            x: act(t * h)?,
            qkv,
            q,
            k,
            v,
            slot: t * h,
            qh: act(t * h)?,
            kh: act(t * h)?,
            vh: act(t * h)?,
            up: act(t * dims.intermediate)?,
            // The attention runs in sub-batches whose scores fit this (at least one sequence).
            scores: act(scores_elems(dims, limits, es))?,
            pooled: Buffer::new(stream, limits.max_sequences * h)?,
        })
    }
}
