//! Host <-> device: rounding to a dtype, its bytes, and device buffers that start at an
//! offset and end in a guard.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::{bf16, f16};
use modelshare_kernels::WeightDtype;

use crate::env::Res;

/// Bytes after each output that must keep this pattern.
pub const GUARD_BYTES: usize = 256;
pub const GUARD: u8 = 0xa5;

pub fn round(dtype: WeightDtype, v: f32) -> f32 {
    match dtype {
        WeightDtype::F32 => v,
        WeightDtype::F16 => f16::from_f32(v).to_f32(),
        WeightDtype::BF16 => bf16::from_f32(v).to_f32(),
    }
}

pub fn round_all(dtype: WeightDtype, v: &mut [f32]) {
    for x in v {
        *x = round(dtype, *x);
    }
}

pub fn to_bytes(dtype: WeightDtype, v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * dtype.size_bytes());
    for x in v {
        match dtype {
            WeightDtype::F32 => out.extend_from_slice(&x.to_le_bytes()),
            WeightDtype::F16 => out.extend_from_slice(&f16::from_f32(*x).to_le_bytes()),
            WeightDtype::BF16 => out.extend_from_slice(&bf16::from_f32(*x).to_le_bytes()),
        }
    }
    out
}

pub fn from_bytes(dtype: WeightDtype, b: &[u8]) -> Vec<f32> {
    match dtype {
        WeightDtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        WeightDtype::F16 => b
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        WeightDtype::BF16 => b
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    }
}

/// A device buffer: `offset` bytes of padding, the data, then the guard.
pub struct Buf {
    mem: CudaSlice<u8>,
    offset: usize,
    bytes: usize,
    dtype: WeightDtype,
}

/// What came back from an output buffer.
pub struct Out {
    pub values: Vec<f32>,
    pub guard_ok: bool,
}

impl Buf {
    fn with_bytes(
        stream: &Arc<CudaStream>,
        dtype: WeightDtype,
        data: &[u8],
        offset_elems: usize,
    ) -> Res<Self> {
        let offset = offset_elems * dtype.size_bytes();
        let mut host = vec![0u8; offset];
        host.extend_from_slice(data);
        host.extend(std::iter::repeat_n(GUARD, GUARD_BYTES));
        let mut mem = stream.alloc_zeros::<u8>(host.len())?;
        stream.memcpy_htod(&host, &mut mem)?;
        Ok(Self {
            mem,
            offset,
            bytes: data.len(),
            dtype,
        })
    }

    /// `values` (already representable in `dtype`) on the device.
    pub fn input(
        stream: &Arc<CudaStream>,
        dtype: WeightDtype,
        values: &[f32],
        offset: usize,
    ) -> Res<Self> {
        Self::with_bytes(stream, dtype, &to_bytes(dtype, values), offset)
    }

    pub fn ints(stream: &Arc<CudaStream>, values: &[i32]) -> Res<Self> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        // i32 travels as "f32-sized" elements; only its size matters here.
        Self::with_bytes(stream, WeightDtype::F32, &bytes, 0)
    }

    /// `n` elements of NaN.
    pub fn output(
        stream: &Arc<CudaStream>,
        dtype: WeightDtype,
        n: usize,
        offset: usize,
    ) -> Res<Self> {
        Self::input(stream, dtype, &vec![f32::NAN; n], offset)
    }

    pub fn ptr(&self, stream: &Arc<CudaStream>) -> u64 {
        self.mem.device_ptr(stream).0 + self.offset as u64
    }

    pub fn read(&self, stream: &Arc<CudaStream>) -> Res<Out> {
        let host = stream.clone_dtoh(&self.mem)?;
        let data = &host[self.offset..self.offset + self.bytes];
        let guard_ok = host[self.offset + self.bytes..].iter().all(|b| *b == GUARD);
        Ok(Out {
            values: from_bytes(self.dtype, data),
            guard_ok,
        })
    }
}
