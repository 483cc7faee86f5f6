//! What a handler answers for one item: an [`Output`] (tensors and parameters) or an
//! [`ItemFailure`] (see `failure`), and their wire forms.

use std::collections::HashMap;

use modelshare_proto::v1 as pb;
use prost::bytes::Bytes;

use super::failure::ItemFailure;
use super::item::{InputTensor, Parameter};
use crate::tensor::Element;

/// The outcome of one item: its output, or why it failed (that item only).
pub type Outcome = Result<Output, ItemFailure>;

/// The output of one item.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Output {
    /// The output tensors, each named once.
    pub tensors: Vec<OutputTensor>,
    /// Facts about the computation the front doors may report, e.g. `prompt_tokens` (int64).
    pub parameters: HashMap<String, Parameter>,
}

impl Output {
    /// An output with no tensors and no parameters.
    pub fn new() -> Self {
        Self::default()
    }

    /// An output of one FP32 tensor.
    pub fn tensor_f32(name: impl Into<String>, shape: impl Into<Vec<i64>>, values: &[f32]) -> Self {
        Self::new().with_tensor(OutputTensor::f32(name, shape, values))
    }

    /// The output with `tensor` added.
    pub fn with_tensor(mut self, tensor: OutputTensor) -> Self {
        self.tensors.push(tensor);
        self
    }

    /// The output with parameter `name` set to `value`.
    pub fn with_parameter(mut self, name: impl Into<String>, value: impl Into<Parameter>) -> Self {
        self.parameters.insert(name.into(), value.into());
        self
    }

    /// The wire form.
    pub(super) fn into_pb(self) -> pb::ItemOutput {
        pb::ItemOutput {
            tensors: self
                .tensors
                .into_iter()
                .map(OutputTensor::into_pb)
                .collect(),
            parameters: self
                .parameters
                .iter()
                .map(|(k, v)| (k.clone(), v.to_pb()))
                .collect(),
        }
    }
}

/// One output tensor: name, dtype, shape and little-endian row-major elements.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputTensor {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: pb::DType,
    /// Dimensions, outermost first; empty for a scalar.
    pub shape: Vec<i64>,
    /// The elements, row-major with no padding, little-endian.
    pub data: Bytes,
}

impl OutputTensor {
    /// A tensor from its parts (the caller makes `data` match `shape` and `dtype`).
    pub fn new(
        name: impl Into<String>,
        dtype: pb::DType,
        shape: impl Into<Vec<i64>>,
        data: impl Into<Bytes>,
    ) -> Self {
        Self {
            name: name.into(),
            dtype,
            shape: shape.into(),
            data: data.into(),
        }
    }

    /// A tensor of `values` (copied; the SDK runs on little-endian hosts only, like the rest
    /// of it).
    pub fn from_slice<T: Element>(
        name: impl Into<String>,
        shape: impl Into<Vec<i64>>,
        values: &[T],
    ) -> Self {
        Self::new(
            name,
            T::DTYPE,
            shape,
            Bytes::copy_from_slice(bytemuck::cast_slice(values)),
        )
    }

    /// An FP32 tensor of `values`.
    pub fn f32(name: impl Into<String>, shape: impl Into<Vec<i64>>, values: &[f32]) -> Self {
        Self::from_slice(name, shape, values)
    }

    /// A BYTES tensor of `strings` (each a 4-byte little-endian length, then its bytes).
    /// Fails if a string is 4 GiB or more.
    pub fn strings<S: AsRef<[u8]>>(
        name: impl Into<String>,
        shape: impl Into<Vec<i64>>,
        strings: &[S],
    ) -> Result<Self, ItemFailure> {
        let mut data = Vec::new();
        for s in strings {
            let s = s.as_ref();
            let len = u32::try_from(s.len()).map_err(|_| {
                ItemFailure::invalid_argument(format!(
                    "a string of {} bytes does not fit a BYTES element",
                    s.len()
                ))
            })?;
            data.extend_from_slice(&len.to_le_bytes());
            data.extend_from_slice(s);
        }
        Ok(Self::new(name, pb::DType::DtypeBytes, shape, data))
    }

    fn into_pb(self) -> pb::TensorOutput {
        pb::TensorOutput {
            name: self.name,
            dtype: self.dtype.into(),
            shape: self.shape,
            data: self.data,
        }
    }
}

impl From<InputTensor> for OutputTensor {
    /// The same tensor as an output (no copy of the data).
    fn from(t: InputTensor) -> Self {
        Self {
            name: t.name,
            dtype: t.dtype,
            shape: t.shape,
            data: t.data,
        }
    }
}

/// The wire result of item `id`.
pub(super) fn item_result(id: u64, outcome: Outcome) -> pb::ItemResult {
    let outcome = match outcome {
        Ok(output) => pb::item_result::Outcome::Output(output.into_pb()),
        Err(failure) => pb::item_result::Outcome::Error(failure.to_pb()),
    };
    pb::ItemResult {
        item_id: id,
        outcome: Some(outcome),
    }
}
