//! The work a handler receives: [`Batch`], [`Item`], [`Input`], [`InputTensor`] and
//! [`Parameter`] (of the input kinds in [`Accepts`]), made from the wire messages with their inputs checked (a dtype the SDK
//! knows, a shape without negative dimensions, exactly the bytes the shape needs), so that a
//! handler never sees a malformed tensor.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use modelshare_proto::v1 as pb;
use prost::bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::failure::ItemFailure;
use crate::tensor::Element;

/// A batch of items of one model version. The handler answers each item.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Identifier of the batch, unique within its Serve stream.
    pub id: u64,
    /// The model version the items are for.
    pub version: u32,
    /// The items to run (those the server cancelled before the handler started, whose
    /// deadline had passed, or whose input was malformed were answered by the SDK and are not
    /// here).
    pub items: Vec<Item>,
}

/// One request to run.
#[derive(Debug, Clone)]
pub struct Item {
    /// Identifier of the item, unique within the server.
    pub id: u64,
    /// The input.
    pub input: Input,
    /// Request parameters passed through from the front door (`dimensions`, `max_tokens`,
    /// ...); ignore those you do not know.
    pub parameters: HashMap<String, Parameter>,
    /// When the caller stops waiting, if it said.
    pub deadline: Option<SystemTime>,
    /// The request's id (the caller's `x-request-id`, or the server's): the same on every item
    /// of a request and in the server's logs and answer. Empty from older servers.
    pub request_id: String,
    /// The caller's W3C trace context (`traceparent`), if it sent a well-formed one: a worker
    /// that traces continues the caller's trace from it.
    pub traceparent: Option<String>,
    cancel: CancellationToken,
}

impl Item {
    /// An item with no parameters and no deadline (for tests of a handler).
    pub fn new(id: u64, input: Input) -> Self {
        Self {
            id,
            input,
            parameters: HashMap::new(),
            deadline: None,
            request_id: String::new(),
            traceparent: None,
            cancel: CancellationToken::new(),
        }
    }

    /// The item with parameter `name` set to `value`.
    pub fn with_parameter(mut self, name: impl Into<String>, value: impl Into<Parameter>) -> Self {
        self.parameters.insert(name.into(), value.into());
        self
    }

    /// Parameter `name`, if the request had it.
    pub fn parameter(&self, name: &str) -> Option<&Parameter> {
        self.parameters.get(name)
    }

    /// Whether the server has cancelled the item (the caller went away or its deadline
    /// passed): whatever the handler answers for it now is discarded.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Completes when the server cancels the item; for long work that can stop early.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// A handle that tells whether the server has cancelled the item, for work that runs
    /// away from the item (a compute thread checking between groups).
    pub fn cancellation(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Converts a wire item, checking its input against the kinds the worker accepts;
    /// `cancel` is cancelled when the server cancels it.
    pub(super) fn from_pb(
        item: pb::Item,
        accepts: Accepts,
        cancel: CancellationToken,
    ) -> Result<Self, ItemFailure> {
        let input = match item.input {
            Some(pb::item::Input::Text(t)) if accepts.text => Input::Text(t.text),
            Some(pb::item::Input::Tensors(t)) if accepts.tensor => {
                Input::Tensors(tensors_from_pb(t.tensors)?)
            }
            Some(pb::item::Input::Text(_)) => {
                return Err(ItemFailure::invalid_argument(
                    "this worker does not take text inputs",
                ));
            }
            Some(pb::item::Input::Tensors(_)) => {
                return Err(ItemFailure::invalid_argument(
                    "this worker does not take tensor inputs",
                ));
            }
            None => return Err(ItemFailure::invalid_argument("the item has no input")),
        };
        let parameters = item
            .parameters
            .into_iter()
            .filter_map(|(k, v)| Parameter::from_pb(v).map(|v| (k, v)))
            .collect();
        Ok(Self {
            id: item.item_id,
            input,
            parameters,
            deadline: deadline(item.deadline_unix_ms),
            request_id: item.request_id,
            traceparent: Some(item.traceparent).filter(|t| !t.is_empty()),
            cancel,
        })
    }
}

/// The input kinds a worker takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepts {
    /// Text inputs (OpenAI-style requests).
    pub text: bool,
    /// Tensor inputs (KServe v2 / OIP requests).
    pub tensor: bool,
}

impl Default for Accepts {
    /// Both kinds.
    fn default() -> Self {
        Self {
            text: true,
            tensor: true,
        }
    }
}

impl Accepts {
    /// The offer's `accepts` list.
    pub(super) fn names(self) -> Vec<String> {
        let mut names = Vec::new();
        if self.text {
            names.push("text".to_owned());
        }
        if self.tensor {
            names.push("tensor".to_owned());
        }
        names
    }
}

/// The deadline of a wire item (0 or less: none).
pub(super) fn deadline(unix_ms: i64) -> Option<SystemTime> {
    u64::try_from(unix_ms)
        .ok()
        .filter(|&ms| ms > 0)
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
}

/// The input of an item.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A text input (OpenAI-style requests).
    Text(String),
    /// Named tensors (KServe v2 / OIP requests), each named once.
    Tensors(Vec<InputTensor>),
}

/// One input tensor, checked: its dtype is known, its shape has no negative dimension, and
/// `data` holds exactly the elements of the shape (for [`pb::DType::DtypeBytes`]: that many
/// length-prefixed strings).
#[derive(Debug, Clone, PartialEq)]
pub struct InputTensor {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: pb::DType,
    /// Dimensions, outermost first; empty for a scalar.
    pub shape: Vec<i64>,
    /// The elements, row-major, little-endian.
    pub data: Bytes,
}

impl InputTensor {
    /// A tensor from its parts, unchecked (for tests of a handler).
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

    /// Number of elements: the product of the shape.
    pub fn len(&self) -> usize {
        element_count(&self.shape).unwrap_or(0)
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as a `Vec<T>` (a copy, so `data` need not be aligned). Fails with
    /// INVALID_ARGUMENT if `T` is not the tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, ItemFailure> {
        if self.dtype != T::DTYPE {
            return Err(ItemFailure::invalid_argument(format!(
                "input tensor '{}' is {}, not {}",
                self.name,
                oip_datatype(self.dtype),
                oip_datatype(T::DTYPE)
            )));
        }
        let size = std::mem::size_of::<T>();
        if size == 0 || !self.data.len().is_multiple_of(size) {
            return Err(ItemFailure::invalid_argument(format!(
                "input tensor '{}' has {} bytes, not a whole number of {}-byte elements",
                self.name,
                self.data.len(),
                size
            )));
        }
        let mut values = vec![T::zeroed(); self.data.len() / size];
        bytemuck::cast_slice_mut::<T, u8>(&mut values).copy_from_slice(&self.data);
        Ok(values)
    }

    /// The elements of a BYTES tensor, each a byte string. Fails with INVALID_ARGUMENT if the
    /// tensor is not BYTES or its data is not a sequence of length-prefixed strings.
    pub fn strings(&self) -> Result<Vec<&[u8]>, ItemFailure> {
        if self.dtype != pb::DType::DtypeBytes {
            return Err(ItemFailure::invalid_argument(format!(
                "input tensor '{}' is {}, not BYTES",
                self.name,
                oip_datatype(self.dtype)
            )));
        }
        split_strings(&self.data).ok_or_else(|| {
            ItemFailure::invalid_argument(format!(
                "input tensor '{}' is not a sequence of length-prefixed strings",
                self.name
            ))
        })
    }
}

/// Converts and checks an item's tensors.
fn tensors_from_pb(tensors: Vec<pb::TensorInput>) -> Result<Vec<InputTensor>, ItemFailure> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        if !seen.insert(t.name.clone()) {
            return Err(ItemFailure::invalid_argument(format!(
                "input tensor '{}' appears twice",
                t.name
            )));
        }
        let tensor = InputTensor {
            dtype: pb::DType::try_from(t.dtype)
                .ok()
                .filter(|d| *d != pb::DType::DtypeUnspecified)
                .ok_or_else(|| {
                    ItemFailure::invalid_argument(format!(
                        "input tensor '{}' has no known dtype ({})",
                        t.name, t.dtype
                    ))
                })?,
            name: t.name,
            shape: t.shape,
            data: t.data,
        };
        check(&tensor)?;
        out.push(tensor);
    }
    Ok(out)
}

/// Checks that a tensor's data matches its shape and dtype.
fn check(t: &InputTensor) -> Result<(), ItemFailure> {
    let count = element_count(&t.shape).ok_or_else(|| {
        ItemFailure::invalid_argument(format!(
            "input tensor '{}' has an impossible shape {:?}",
            t.name, t.shape
        ))
    })?;
    match element_size(t.dtype) {
        Some(size) => {
            let need = count.checked_mul(size);
            if need != Some(t.data.len()) {
                return Err(ItemFailure::invalid_argument(format!(
                    "input tensor '{}' has {} bytes, its shape {:?} of {} needs {}",
                    t.name,
                    t.data.len(),
                    t.shape,
                    oip_datatype(t.dtype),
                    need.map_or_else(|| "more".to_owned(), |n| n.to_string())
                )));
            }
        }
        None => {
            let strings = split_strings(&t.data).map(|s| s.len());
            if strings != Some(count) {
                return Err(ItemFailure::invalid_argument(format!(
                    "input tensor '{}' (BYTES, shape {:?}) must hold {count} length-prefixed strings",
                    t.name, t.shape
                )));
            }
        }
    }
    Ok(())
}

/// The product of a shape's dimensions; `None` for a negative dimension or an overflow.
fn element_count(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| {
        usize::try_from(d).ok().and_then(|d| n.checked_mul(d))
    })
}

/// Splits OIP BYTES data (a 4-byte little-endian length, then that many bytes, per element);
/// `None` if it does not end exactly after an element.
fn split_strings(mut data: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let (len, rest) = data.split_first_chunk::<4>()?;
        let len = usize::try_from(u32::from_le_bytes(*len)).ok()?;
        if rest.len() < len {
            return None;
        }
        let (s, rest) = rest.split_at(len);
        out.push(s);
        data = rest;
    }
    Some(out)
}

/// Bytes per element of `dtype`; `None` for BYTES (variable) and for no dtype: the
/// contract's table, [`modelshare_proto::dtype::size_of`].
pub fn element_size(dtype: pb::DType) -> Option<usize> {
    modelshare_proto::dtype::size_of(dtype)
}

pub use modelshare_proto::dtype::oip_datatype;

/// A [`pb::TensorSpec`] for the offer's `inputs` / `outputs` (shape per item, -1 for a
/// dimension of any size).
pub fn tensor_spec(name: impl Into<String>, dtype: pb::DType, shape: &[i64]) -> pb::TensorSpec {
    pb::TensorSpec {
        name: name.into(),
        datatype: oip_datatype(dtype).to_owned(),
        shape: shape.to_vec(),
    }
}

/// The value of one request or output parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum Parameter {
    /// A boolean.
    Bool(bool),
    /// A signed 64-bit integer.
    Int64(i64),
    /// A string.
    String(String),
    /// A double-precision float.
    Double(f64),
    /// An unsigned 64-bit integer.
    Uint64(u64),
}

impl Parameter {
    /// The value as an `i64`: an `Int64`, or a `Uint64` that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Parameter::Int64(v) => Some(*v),
            Parameter::Uint64(v) => i64::try_from(*v).ok(),
            _ => None,
        }
    }

    /// The value as an `f64`: a `Double`, or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Parameter::Double(v) => Some(*v),
            Parameter::Int64(v) => Some(*v as f64),
            Parameter::Uint64(v) => Some(*v as f64),
            _ => None,
        }
    }

    /// The value as a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Parameter::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a boolean, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Parameter::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// A wire parameter; `None` when it has no value.
    fn from_pb(p: pb::Parameter) -> Option<Self> {
        use pb::parameter::Value;
        Some(match p.value? {
            Value::BoolValue(v) => Parameter::Bool(v),
            Value::Int64Value(v) => Parameter::Int64(v),
            Value::StringValue(v) => Parameter::String(v),
            Value::DoubleValue(v) => Parameter::Double(v),
            Value::Uint64Value(v) => Parameter::Uint64(v),
        })
    }

    /// The wire form.
    pub(super) fn to_pb(&self) -> pb::Parameter {
        use pb::parameter::Value;
        let value = match self {
            Parameter::Bool(v) => Value::BoolValue(*v),
            Parameter::Int64(v) => Value::Int64Value(*v),
            Parameter::String(v) => Value::StringValue(v.clone()),
            Parameter::Double(v) => Value::DoubleValue(*v),
            Parameter::Uint64(v) => Value::Uint64Value(*v),
        };
        pb::Parameter { value: Some(value) }
    }
}

impl From<bool> for Parameter {
    fn from(v: bool) -> Self {
        Parameter::Bool(v)
    }
}

impl From<i64> for Parameter {
    fn from(v: i64) -> Self {
        Parameter::Int64(v)
    }
}

impl From<u64> for Parameter {
    fn from(v: u64) -> Self {
        Parameter::Uint64(v)
    }
}

impl From<f64> for Parameter {
    fn from(v: f64) -> Self {
        Parameter::Double(v)
    }
}

impl From<String> for Parameter {
    fn from(v: String) -> Self {
        Parameter::String(v)
    }
}

impl From<&str> for Parameter {
    fn from(v: &str) -> Self {
        Parameter::String(v.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(dtype: i32, shape: Vec<i64>, data: Vec<u8>) -> pb::TensorInput {
        pb::TensorInput {
            name: "x".into(),
            dtype,
            shape,
            data: data.into(),
        }
    }

    /// A malformed tensor would reach handlers that trust its shape.
    #[test]
    fn malformed_tensors_are_refused() {
        let f32 = pb::DType::DtypeF32 as i32;
        let bytes = pb::DType::DtypeBytes as i32;
        let bad = [
            tensor(f32, vec![2], vec![0; 4]),
            tensor(f32, vec![-1], vec![]),
            tensor(999, vec![1], vec![0; 4]),
            tensor(0, vec![1], vec![0; 4]),
            tensor(f32, vec![i64::MAX, i64::MAX], vec![]),
            tensor(bytes, vec![2], vec![1, 0, 0, 0, b'a']),
            tensor(bytes, vec![1], vec![5, 0, 0, 0, b'a']),
        ];
        for t in bad {
            let e = tensors_from_pb(vec![t.clone()]).expect_err("refused");
            assert_eq!(e.code, tonic::Code::InvalidArgument, "{t:?}: {e}");
        }
        let two = vec![
            tensor(f32, vec![1], vec![0; 4]),
            tensor(f32, vec![1], vec![0; 4]),
        ];
        assert!(tensors_from_pb(two).is_err(), "a name twice");

        let ok = tensors_from_pb(vec![
            tensor(bytes, vec![2], vec![1, 0, 0, 0, b'a', 0, 0, 0, 0]),
            pb::TensorInput {
                name: "y".into(),
                ..tensor(f32, vec![2, 1], vec![0; 8])
            },
        ])
        .expect("well-formed");
        assert_eq!(ok[0].strings().unwrap(), vec![&b"a"[..], &b""[..]]);
        assert_eq!(ok[1].to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
        assert!(ok[1].to_vec::<i32>().is_err());
    }
}
