//! The echo computation, exactly as the server's tests expect it (and as
//! `workers/python/echo_worker.py` repeats it):
//!
//! - `w`: the model's first tensor in name order whose dtype is F32, F16 or BF16, flattened,
//!   as f32 values; `[0.0]` if there is none (or if that tensor has no elements).
//! - Text item `s`: `fail:MSG` fails with INVALID_ARGUMENT and message `MSG`. `sleep:N ...`
//!   (N milliseconds: the characters after `sleep:` up to the first space or the end, all
//!   ASCII digits, else INVALID_ARGUMENT) sleeps N ms first (a batch sleeps once, for its
//!   longest item, and stops early when all its items are cancelled), then goes on. Output
//!   `embedding`, FP32, shape `[D]`: `w[j] + (UTF-8 byte length of s)` (added in f32); output
//!   parameter `prompt_tokens` (int64): the number of words of `s` split on Unicode white
//!   space (Rust's `split_whitespace`).
//! - `D`: the item parameter `dimensions` (int64, or uint64 that fits) if given, else
//!   `min(len(w), 64)`; a `dimensions` that is not such an integer from 1 to `len(w)` fails
//!   with INVALID_ARGUMENT: "parameter 'dimensions' must be an integer from 1 to {len(w)}".
//! - Tensor item whose only input is `input_ids`, INT32 or INT64, of shape `[n]` (rank 1):
//!   as text with the byte length replaced by `n`; `prompt_tokens` = `n`.
//! - Other tensor items: output `echo`, the first input tensor unchanged (dtype, shape and
//!   bytes); if it is FP32, also `plus_weights`, FP32, same shape: `x[k] + w[k % len(w)]`. An
//!   item with no tensors fails with INVALID_ARGUMENT.
//!
//! No computation here knows about the server: [`compute`] and [`sleep_ms`] take an
//! [`Item`] and [`Weights`] and are tested on fixed inputs below.

use modelshare_proto::v1 as pb;
use modelshare_worker::serve::{Input, Item, ItemFailure, Outcome, Output, OutputTensor};
use modelshare_worker::{Model, Tensor, WorkerError};

/// Most dimensions of an embedding when the item does not say.
pub const DEFAULT_DIMENSIONS: usize = 64;

/// The float type of the weights' tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Float {
    F32,
    F16,
    Bf16,
}

impl Float {
    fn of(dtype: pb::DType) -> Option<Self> {
        match dtype {
            pb::DType::DtypeF32 => Some(Float::F32),
            pb::DType::DtypeF16 => Some(Float::F16),
            pb::DType::DtypeBf16 => Some(Float::Bf16),
            _ => None,
        }
    }

    fn size(self) -> usize {
        match self {
            Float::F32 => 4,
            Float::F16 | Float::Bf16 => 2,
        }
    }
}

/// Where the weights' bytes are.
#[derive(Debug)]
enum Store {
    /// In the shared arena, mapped read-only in this process (host backend): no copy.
    Shared(Tensor),
    /// A copy (a device arena's tensor, or the default `[0.0]`).
    Copied(Vec<u8>),
}

/// `w`: the values the computation adds, read on demand from the weights.
#[derive(Debug)]
pub struct Weights {
    store: Store,
    float: Float,
    len: usize,
}

impl Weights {
    /// `w` of an attached model (see the module docs).
    pub fn of(model: &Model) -> Result<Self, WorkerError> {
        let mut tensors = model.tensors();
        tensors.sort_by(|a, b| a.name().cmp(b.name()));
        let Some((tensor, float)) = tensors
            .into_iter()
            .find_map(|t| Float::of(t.dtype()).map(|f| (t, f)))
        else {
            return Ok(Self::from_f32(&[0.0]));
        };
        let len = usize::try_from(tensor.len()).unwrap_or(usize::MAX);
        if len == 0 {
            return Ok(Self::from_f32(&[0.0]));
        }
        let store = if tensor.is_on_device() {
            Store::Copied(tensor.to_host()?)
        } else {
            Store::Shared(tensor)
        };
        let weights = Self { store, float, len };
        if weights.bytes().len() < len * float.size() {
            return Err(WorkerError::Protocol(format!(
                "tensor has {} bytes, fewer than its {len} elements need",
                weights.bytes().len()
            )));
        }
        Ok(weights)
    }

    /// `w` made of `values` (`[0.0]` if empty).
    pub fn from_f32(values: &[f32]) -> Self {
        let values = if values.is_empty() {
            &[0.0][..]
        } else {
            values
        };
        Self {
            store: Store::Copied(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
            float: Float::F32,
            len: values.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        match &self.store {
            Store::Shared(t) => t.bytes(),
            Store::Copied(v) => v,
        }
    }

    /// Number of values (at least 1).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Value `i` as f32 (0.0 past the end).
    pub fn get(&self, i: usize) -> f32 {
        let size = self.float.size();
        let Some(b) = self.bytes().get(i * size..(i + 1) * size) else {
            return 0.0;
        };
        match self.float {
            Float::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Float::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
            Float::Bf16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        }
    }
}

/// How long an item asks to sleep before it runs (0: it does not); INVALID_ARGUMENT for a
/// `sleep:` without a number.
pub fn sleep_ms(item: &Item) -> Result<u64, ItemFailure> {
    let Input::Text(s) = &item.input else {
        return Ok(0);
    };
    let Some(rest) = s.strip_prefix("sleep:") else {
        return Ok(0);
    };
    let digits = rest.split(' ').next().unwrap_or_default();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ItemFailure::invalid_argument(format!(
            "sleep:N needs N in milliseconds, got '{digits}'"
        )));
    }
    digits.parse().map_err(|_| {
        ItemFailure::invalid_argument(format!("sleep:N needs N in milliseconds, got '{digits}'"))
    })
}

/// The outcome of one item (after its sleep).
pub fn compute(w: &Weights, item: &Item) -> Outcome {
    match &item.input {
        Input::Text(s) => {
            if let Some(message) = s.strip_prefix("fail:") {
                return Err(ItemFailure::invalid_argument(message));
            }
            let words = s.split_whitespace().count();
            embed(
                w,
                item,
                s.len() as f32,
                i64::try_from(words).unwrap_or(i64::MAX),
            )
        }
        Input::Tensors(tensors) => match tensors.as_slice() {
            [] => Err(ItemFailure::invalid_argument(
                "the item has no input tensors",
            )),
            [ids]
                if ids.name == "input_ids"
                    && matches!(ids.dtype, pb::DType::DtypeI32 | pb::DType::DtypeI64)
                    && ids.shape.len() == 1 =>
            {
                let n = ids.shape[0];
                embed(w, item, n as f32, n)
            }
            [first, ..] => {
                let echo = OutputTensor {
                    name: "echo".to_owned(),
                    ..OutputTensor::from(first.clone())
                };
                let mut output = Output::new().with_tensor(echo);
                if first.dtype == pb::DType::DtypeF32 {
                    let x = first.to_vec::<f32>()?;
                    let plus: Vec<f32> = x
                        .iter()
                        .enumerate()
                        .map(|(k, v)| v + w.get(k % w.len()))
                        .collect();
                    output = output.with_tensor(OutputTensor::f32(
                        "plus_weights",
                        first.shape.clone(),
                        &plus,
                    ));
                }
                Ok(output)
            }
        },
    }
}

/// `embedding[j] = w[j] + add` for `j < D`, and `prompt_tokens`.
fn embed(w: &Weights, item: &Item, add: f32, prompt_tokens: i64) -> Outcome {
    let d = dimensions(w, item)?;
    let values: Vec<f32> = (0..d).map(|j| w.get(j) + add).collect();
    let shape = [i64::try_from(d).unwrap_or(i64::MAX)];
    Ok(Output::tensor_f32("embedding", shape, &values)
        .with_parameter("prompt_tokens", prompt_tokens))
}

/// `D`: the `dimensions` parameter, or `min(len(w), 64)`.
fn dimensions(w: &Weights, item: &Item) -> Result<usize, ItemFailure> {
    let Some(p) = item.parameter("dimensions") else {
        return Ok(w.len().min(DEFAULT_DIMENSIONS));
    };
    p.as_i64()
        .and_then(|d| usize::try_from(d).ok())
        .filter(|d| (1..=w.len()).contains(d))
        .ok_or_else(|| {
            ItemFailure::invalid_argument(format!(
                "parameter 'dimensions' must be an integer from 1 to {}",
                w.len()
            ))
        })
}

#[cfg(test)]
mod tests {
    use modelshare_worker::serve::{InputTensor, Parameter};
    use tonic::Code;

    use super::*;

    fn text(s: &str) -> Item {
        Item::new(1, Input::Text(s.into()))
    }

    fn tensors(t: Vec<InputTensor>) -> Item {
        Item::new(1, Input::Tensors(t))
    }

    fn f32s(t: &OutputTensor) -> Vec<f32> {
        t.data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    fn tokens(o: &Output) -> Option<i64> {
        o.parameters
            .get("prompt_tokens")
            .and_then(Parameter::as_i64)
    }

    /// Text embeddings no longer add the byte length to w, or count words differently.
    #[test]
    fn text_embeds_byte_length_plus_w() {
        let w = Weights::from_f32(&[1.0, -2.0, 0.5]);
        let o = compute(&w, &text("héllo  wörld\n")).unwrap();
        assert_eq!(o.tensors.len(), 1);
        assert_eq!(o.tensors[0].name, "embedding");
        assert_eq!(o.tensors[0].dtype, pb::DType::DtypeF32);
        assert_eq!(o.tensors[0].shape, vec![3]);
        // 15 UTF-8 bytes, 2 words.
        assert_eq!(f32s(&o.tensors[0]), vec![16.0, 13.0, 15.5]);
        assert_eq!(tokens(&o), Some(2));
        let empty = compute(&w, &text("")).unwrap();
        assert_eq!(f32s(&empty.tensors[0]), vec![1.0, -2.0, 0.5]);
        assert_eq!(tokens(&empty), Some(0));
    }

    /// `dimensions` no longer picks D, or a bad one is not refused with INVALID_ARGUMENT.
    #[test]
    fn dimensions_choose_d_within_w() {
        let w = Weights::from_f32(&(0..100).map(|i| i as f32).collect::<Vec<_>>());
        let o = compute(&w, &text("ab")).unwrap();
        assert_eq!(o.tensors[0].shape, vec![64]);
        let o = compute(&w, &text("ab").with_parameter("dimensions", 3i64)).unwrap();
        assert_eq!(f32s(&o.tensors[0]), vec![2.0, 3.0, 4.0]);
        let o = compute(&w, &text("ab").with_parameter("dimensions", 100u64)).unwrap();
        assert_eq!(o.tensors[0].shape, vec![100]);
        for bad in [
            Parameter::Int64(0),
            Parameter::Int64(101),
            Parameter::Int64(-1),
            Parameter::String("3".into()),
            Parameter::Double(3.0),
        ] {
            let e = compute(&w, &text("ab").with_parameter("dimensions", bad)).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument);
            assert_eq!(
                e.message,
                "parameter 'dimensions' must be an integer from 1 to 100"
            );
        }
    }

    /// `fail:` and `sleep:` prefixes no longer behave as the server's tests expect.
    #[test]
    fn fail_and_sleep_prefixes() {
        let w = Weights::from_f32(&[0.0]);
        let e = compute(&w, &text("fail:no good")).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (Code::InvalidArgument, "no good")
        );
        assert_eq!(sleep_ms(&text("sleep:250 hello")), Ok(250));
        assert_eq!(sleep_ms(&text("sleep:7")), Ok(7));
        assert_eq!(sleep_ms(&text("hello sleep:7")), Ok(0));
        assert!(sleep_ms(&text("sleep:x")).is_err());
        assert!(sleep_ms(&text("sleep: 5")).is_err());
        // The sleep prefix counts in the length and the words.
        let o = compute(&w, &text("sleep:5 hi")).unwrap();
        assert_eq!(f32s(&o.tensors[0]), vec![10.0]);
        assert_eq!(tokens(&o), Some(2));
    }

    /// `input_ids` items no longer embed with n, or other tensors are not echoed (with
    /// plus_weights for FP32).
    #[test]
    fn tensor_items_embed_or_echo() {
        let w = Weights::from_f32(&[1.0, 2.0]);
        let ids = InputTensor::new(
            "input_ids",
            pb::DType::DtypeI64,
            [3],
            [7i64, 8, 9]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        let o = compute(&w, &tensors(vec![ids.clone()])).unwrap();
        assert_eq!(f32s(&o.tensors[0]), vec![4.0, 5.0]);
        assert_eq!(tokens(&o), Some(3));

        let x = InputTensor::new(
            "x",
            pb::DType::DtypeF32,
            [3, 1],
            [0.5f32, 1.5, 2.5]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        let o = compute(&w, &tensors(vec![x.clone(), ids.clone()])).unwrap();
        assert_eq!(o.tensors.len(), 2);
        assert_eq!(o.tensors[0].name, "echo");
        assert_eq!(o.tensors[0].shape, vec![3, 1]);
        assert_eq!(o.tensors[0].data, x.data);
        assert_eq!(o.tensors[1].name, "plus_weights");
        assert_eq!(f32s(&o.tensors[1]), vec![1.5, 3.5, 3.5]);
        assert_eq!(tokens(&o), None);

        // input_ids of rank 2 is echoed, not embedded; a non-FP32 echo has no plus_weights.
        let ids2 = InputTensor {
            shape: vec![1, 3],
            ..ids
        };
        let o = compute(&w, &tensors(vec![ids2.clone()])).unwrap();
        assert_eq!(o.tensors.len(), 1);
        assert_eq!(o.tensors[0].data, ids2.data);
        assert_eq!(o.tensors[0].dtype, pb::DType::DtypeI64);

        let e = compute(&w, &tensors(vec![])).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
    }

    /// F16 and BF16 weights no longer read as their f32 values.
    #[test]
    fn half_weights_read_as_f32() {
        let bytes: Vec<u8> = [half::bf16::from_f32(1.5), half::bf16::from_f32(-3.0)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let w = Weights {
            store: Store::Copied(bytes),
            float: Float::Bf16,
            len: 2,
        };
        assert_eq!((w.get(0), w.get(1), w.get(2)), (1.5, -3.0, 0.0));
        let bytes: Vec<u8> = [half::f16::from_f32(0.25)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let w = Weights {
            store: Store::Copied(bytes),
            float: Float::F16,
            len: 1,
        };
        assert_eq!(w.get(0), 0.25);
    }
}
