//! The KServe v2 / Open Inference Protocol tensors, shared by its gRPC and REST doors: datatype
//! names, typed contents to the raw layout, a request's inputs split into items along their
//! first (batch) dimension, and the items' outputs stacked back.
//!
//! Raw layout: elements row-major, little-endian, no padding; BYTES elements each a 4-byte
//! little-endian length and that many bytes (the OIP's `raw_input_contents` layout, and
//! `DTYPE_BYTES` on the worker protocol).

use std::collections::HashMap;

use modelshare_proto::inference as oip;
use modelshare_proto::v1 as pb;
use prost::bytes::{Bytes, BytesMut};

use modelshare_serving::InferError;

/// One tensor of a request or a response, in the raw layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: pb::DType,
    /// Its dimensions.
    pub shape: Vec<i64>,
    /// Its elements, in the raw layout.
    pub data: Bytes,
}

impl Tensor {
    /// The OIP datatype name of its dtype.
    pub fn datatype(&self) -> &'static str {
        datatype(self.dtype)
    }
}

fn invalid(message: String) -> InferError {
    InferError::InvalidInput(message)
}

/// The dtype of an OIP datatype name.
pub fn dtype(datatype: &str) -> Result<pb::DType, InferError> {
    use pb::DType as D;
    Ok(match datatype {
        "BOOL" => D::DtypeBool,
        "UINT8" => D::DtypeU8,
        "UINT16" => D::DtypeU16,
        "UINT32" => D::DtypeU32,
        "UINT64" => D::DtypeU64,
        "INT8" => D::DtypeI8,
        "INT16" => D::DtypeI16,
        "INT32" => D::DtypeI32,
        "INT64" => D::DtypeI64,
        "FP16" => D::DtypeF16,
        "BF16" => D::DtypeBf16,
        "FP32" => D::DtypeF32,
        "FP64" => D::DtypeF64,
        "BYTES" => D::DtypeBytes,
        other => {
            return Err(invalid(format!(
                "unknown datatype '{}' (BOOL, UINT8..UINT64, INT8..INT64, FP16, BF16, FP32, FP64, BYTES)",
                other.escape_debug()
            )));
        }
    })
}

/// The OIP datatype name of a dtype (`""` for a dtype the OIP has no name for): the SDK's
/// name, where it is one the OIP knows.
pub fn datatype(d: pb::DType) -> &'static str {
    let name = modelshare_proto::dtype::oip_datatype(d);
    if dtype(name).is_ok() { name } else { "" }
}

/// Bytes per element; `None` for BYTES (variable) and dtypes the OIP does not carry.
pub fn element_size(d: pb::DType) -> Option<usize> {
    if datatype(d).is_empty() {
        None
    } else {
        modelshare_proto::dtype::size_of(d)
    }
}

/// The number of elements of `shape` (every dimension ≥ 0, the product bounded).
pub fn element_count(name: &str, shape: &[i64]) -> Result<usize, InferError> {
    shape.iter().try_fold(1usize, |n, d| {
        let d = usize::try_from(*d).map_err(|_| {
            invalid(format!(
                "input '{name}': dimension {d} of shape {shape:?} is negative"
            ))
        })?;
        n.checked_mul(d)
            .filter(|n| *n <= 1 << 32)
            .ok_or_else(|| invalid(format!("input '{name}': shape {shape:?} is too large")))
    })
}

/// The byte ranges of the `count` elements of a BYTES tensor's raw data, checking that the data
/// holds exactly that many.
pub fn bytes_elements(
    name: &str,
    data: &[u8],
    count: usize,
) -> Result<Vec<std::ops::Range<usize>>, InferError> {
    let mut out = Vec::with_capacity(count.min(1 << 16));
    let mut at = 0usize;
    while at < data.len() {
        let len = data
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| {
                invalid(format!(
                    "input '{name}': BYTES data ends inside an element's 4-byte length"
                ))
            })?;
        let start = at + 4;
        let end = start
            .checked_add(len)
            .filter(|e| *e <= data.len())
            .ok_or_else(|| {
                invalid(format!(
                    "input '{name}': BYTES element {} claims {len} bytes past the end of the data",
                    out.len()
                ))
            })?;
        out.push(start..end);
        at = end;
    }
    if out.len() != count {
        return Err(invalid(format!(
            "input '{name}': its shape holds {count} elements but its BYTES data holds {}",
            out.len()
        )));
    }
    Ok(out)
}

/// Checks that `t.data` holds exactly the elements its shape says.
pub fn check_data(t: &Tensor) -> Result<(), InferError> {
    let count = element_count(&t.name, &t.shape)?;
    match element_size(t.dtype) {
        Some(size) => {
            let want = count.saturating_mul(size);
            if t.data.len() != want {
                return Err(invalid(format!(
                    "input '{}': shape {:?} of {} needs {want} bytes of data, got {}",
                    t.name,
                    t.shape,
                    t.datatype(),
                    t.data.len()
                )));
            }
            Ok(())
        }
        None if t.dtype == pb::DType::DtypeBytes => {
            bytes_elements(&t.name, &t.data, count).map(|_| ())
        }
        None => Err(invalid(format!(
            "input '{}': dtype {:?} is not an OIP datatype",
            t.name, t.dtype
        ))),
    }
}

/// Encodes BYTES elements in the raw layout.
pub fn encode_bytes<'a>(elements: impl IntoIterator<Item = &'a [u8]>) -> Bytes {
    let mut out = BytesMut::new();
    for e in elements {
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
    }
    out.freeze()
}

/// The typed `contents` of an input in the raw layout. `count` is the element count its shape
/// gives; the contents must hold exactly that many, in the field its datatype uses (INT8,
/// INT16 and INT32 in `int_contents`; UINT8..UINT32 in `uint_contents`; FP16 and BF16 have no
/// typed field: raw only).
pub fn typed_to_raw(
    name: &str,
    dtype: pb::DType,
    c: &oip::InferTensorContents,
    count: usize,
) -> Result<Bytes, InferError> {
    use pb::DType as D;
    fn check(name: &str, got: usize, count: usize, field: &str) -> Result<(), InferError> {
        if got == count {
            Ok(())
        } else {
            Err(invalid(format!(
                "input '{name}': its shape holds {count} elements but {field} holds {got}"
            )))
        }
    }
    fn narrow<T, const N: usize>(
        name: &str,
        values: &[T],
        conv: impl Fn(&T) -> Option<[u8; N]>,
    ) -> Result<Bytes, InferError> {
        let mut out = Vec::with_capacity(values.len() * N);
        for (i, v) in values.iter().enumerate() {
            out.extend(conv(v).ok_or_else(|| {
                invalid(format!(
                    "input '{name}': element {i} is out of range of its datatype"
                ))
            })?);
        }
        Ok(out.into())
    }
    let raw = match dtype {
        D::DtypeBool => {
            check(name, c.bool_contents.len(), count, "bool_contents")?;
            c.bool_contents
                .iter()
                .map(|b| u8::from(*b))
                .collect::<Vec<u8>>()
                .into()
        }
        D::DtypeI8 | D::DtypeI16 | D::DtypeI32 => {
            check(name, c.int_contents.len(), count, "int_contents")?;
            match dtype {
                D::DtypeI8 => narrow(name, &c.int_contents, |v| {
                    i8::try_from(*v).ok().map(i8::to_le_bytes)
                })?,
                D::DtypeI16 => narrow(name, &c.int_contents, |v| {
                    i16::try_from(*v).ok().map(i16::to_le_bytes)
                })?,
                _ => narrow(name, &c.int_contents, |v| Some(v.to_le_bytes()))?,
            }
        }
        D::DtypeI64 => {
            check(name, c.int64_contents.len(), count, "int64_contents")?;
            narrow(name, &c.int64_contents, |v| Some(v.to_le_bytes()))?
        }
        D::DtypeU8 | D::DtypeU16 | D::DtypeU32 => {
            check(name, c.uint_contents.len(), count, "uint_contents")?;
            match dtype {
                D::DtypeU8 => narrow(name, &c.uint_contents, |v| {
                    u8::try_from(*v).ok().map(u8::to_le_bytes)
                })?,
                D::DtypeU16 => narrow(name, &c.uint_contents, |v| {
                    u16::try_from(*v).ok().map(u16::to_le_bytes)
                })?,
                _ => narrow(name, &c.uint_contents, |v| Some(v.to_le_bytes()))?,
            }
        }
        D::DtypeU64 => {
            check(name, c.uint64_contents.len(), count, "uint64_contents")?;
            narrow(name, &c.uint64_contents, |v| Some(v.to_le_bytes()))?
        }
        D::DtypeF32 => {
            check(name, c.fp32_contents.len(), count, "fp32_contents")?;
            narrow(name, &c.fp32_contents, |v| Some(v.to_le_bytes()))?
        }
        D::DtypeF64 => {
            check(name, c.fp64_contents.len(), count, "fp64_contents")?;
            narrow(name, &c.fp64_contents, |v| Some(v.to_le_bytes()))?
        }
        D::DtypeBytes => {
            check(name, c.bytes_contents.len(), count, "bytes_contents")?;
            encode_bytes(c.bytes_contents.iter().map(Vec::as_slice))
        }
        other => {
            return Err(invalid(format!(
                "input '{name}': {} has no typed contents; send it in raw_input_contents",
                datatype(other)
            )));
        }
    };
    Ok(raw)
}

/// The inputs of a gRPC ModelInfer request, each in the raw layout, checked.
pub fn grpc_inputs(req: &mut oip::ModelInferRequest) -> Result<Vec<Tensor>, InferError> {
    let raw = std::mem::take(&mut req.raw_input_contents);
    if !raw.is_empty() && raw.len() != req.inputs.len() {
        return Err(invalid(format!(
            "raw_input_contents has {} entries for {} inputs; it must have one per input",
            raw.len(),
            req.inputs.len()
        )));
    }
    let mut raw = raw.into_iter();
    let mut out = Vec::with_capacity(req.inputs.len());
    for input in &req.inputs {
        let dtype =
            dtype(&input.datatype).map_err(|e| invalid(format!("input '{}': {e}", input.name)))?;
        let count = element_count(&input.name, &input.shape)?;
        let data = match (raw.next(), &input.contents) {
            (Some(_), Some(_)) => {
                return Err(invalid(format!(
                    "input '{}' has both contents and raw_input_contents",
                    input.name
                )));
            }
            (Some(data), None) => data,
            (None, Some(c)) => typed_to_raw(&input.name, dtype, c, count)?,
            (None, None) if count == 0 => Bytes::new(),
            (None, None) => {
                return Err(invalid(format!("input '{}' has no data", input.name)));
            }
        };
        let t = Tensor {
            name: input.name.clone(),
            dtype,
            shape: input.shape.clone(),
            data,
        };
        check_data(&t)?;
        out.push(t);
    }
    Ok(out)
}

/// An OIP parameter as the worker protocol carries it.
pub fn parameter(p: &oip::InferParameter) -> Option<pb::Parameter> {
    use oip::infer_parameter::ParameterChoice as C;
    use pb::parameter::Value as V;
    let value = match p.parameter_choice.as_ref()? {
        C::BoolParam(b) => V::BoolValue(*b),
        C::Int64Param(i) => V::Int64Value(*i),
        C::StringParam(s) => V::StringValue(s.clone()),
        C::DoubleParam(d) => V::DoubleValue(*d),
        C::Uint64Param(u) => V::Uint64Value(*u),
    };
    Some(pb::Parameter { value: Some(value) })
}

/// A gRPC request's OIP parameters as the worker protocol carries them (those without a
/// value are left out).
pub fn parameters(ps: &HashMap<String, oip::InferParameter>) -> HashMap<String, pb::Parameter> {
    ps.iter()
        .filter_map(|(k, v)| Some((k.clone(), parameter(v)?)))
        .collect()
}

/// The request's tensors as items: split along the first dimension of every input (all must
/// have it, and agree on it). A request of one BYTES input of shape [N] or [N, 1] becomes N
/// text items (each must be UTF-8). `parameters` go on every item.
///
/// The batch dimension is the client's number: a request of more than `max_items` rows is
/// refused ([`InferError::TooLarge`]) before anything is built per row (a shape such as
/// `[4294967296, 0]` holds no data at all).
pub fn to_items(
    inputs: Vec<Tensor>,
    parameters: &HashMap<String, pb::Parameter>,
    max_items: usize,
) -> Result<Vec<pb::Item>, InferError> {
    let Some(first) = inputs.first() else {
        return Err(invalid("the request has no inputs".into()));
    };
    let mut names = std::collections::HashSet::new();
    for t in &inputs {
        if !names.insert(t.name.as_str()) {
            return Err(invalid(format!("input '{}' is given twice", t.name)));
        }
    }
    let rows = |t: &Tensor| -> Result<usize, InferError> {
        match t.shape.first() {
            Some(n) if *n >= 1 => Ok(usize::try_from(*n).unwrap_or(usize::MAX)),
            _ => Err(invalid(format!(
                "input '{}': shape {:?} has no batch dimension (the first dimension, at least 1, is the batch)",
                t.name, t.shape
            ))),
        }
    };
    let n = rows(first)?;
    for t in &inputs {
        let m = rows(t)?;
        if m != n {
            return Err(invalid(format!(
                "inputs disagree on the batch dimension: '{}' has {n} rows, '{}' has {m}",
                first.name, t.name
            )));
        }
    }
    if n > max_items {
        return Err(InferError::TooLarge {
            items: n,
            limit: max_items,
        });
    }
    let item = |input: pb::item::Input| pb::Item {
        input: Some(input),
        parameters: parameters.clone(),
        ..Default::default()
    };
    let text = inputs.len() == 1
        && first.dtype == pb::DType::DtypeBytes
        && (first.shape.len() == 1 || (first.shape.len() == 2 && first.shape[1] == 1));
    if text {
        let elements = bytes_elements(&first.name, &first.data, n)?;
        return elements
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let text = std::str::from_utf8(&first.data[r]).map_err(|_| {
                    invalid(format!(
                        "input '{}': element {i} is not UTF-8 text",
                        first.name
                    ))
                })?;
                Ok(item(pb::item::Input::Text(pb::TextInput {
                    text: text.to_owned(),
                })))
            })
            .collect();
    }
    // Each input's rows, as slices of its data.
    let mut per_input: Vec<Vec<Bytes>> = Vec::with_capacity(inputs.len());
    for t in &inputs {
        let row_elements = element_count(&t.name, &t.shape[1..])?;
        let slices = match element_size(t.dtype) {
            Some(size) => {
                let row = row_elements * size;
                (0..n)
                    .map(|r| t.data.slice(r * row..(r + 1) * row))
                    .collect()
            }
            None => {
                let elements = bytes_elements(&t.name, &t.data, n * row_elements)?;
                (0..n)
                    .map(|r| {
                        let rs = &elements[r * row_elements..(r + 1) * row_elements];
                        let start = rs.first().map_or(0, |e| e.start - 4);
                        let end = rs.last().map_or(start, |e| e.end);
                        t.data.slice(start..end)
                    })
                    .collect()
            }
        };
        per_input.push(slices);
    }
    Ok((0..n)
        .map(|r| {
            let tensors = inputs
                .iter()
                .zip(&per_input)
                .map(|(t, rows)| pb::TensorInput {
                    name: t.name.clone(),
                    dtype: t.dtype as i32,
                    shape: t.shape[1..].to_vec(),
                    data: rows[r].clone(),
                })
                .collect();
            item(pb::item::Input::Tensors(pb::Tensors { tensors }))
        })
        .collect())
}

/// The items' outputs stacked along a new first dimension: every item must have the same
/// output names, dtypes and shapes. `requested` (when not empty) picks outputs by name.
pub fn stack(
    model: &str,
    outputs: &[pb::ItemOutput],
    requested: &[String],
) -> Result<Vec<Tensor>, InferError> {
    let bad = |reason: String| InferError::BadOutput {
        model: model.to_owned(),
        reason,
    };
    let Some(first) = outputs.first() else {
        return Ok(Vec::new());
    };
    for name in requested {
        if !first.tensors.iter().any(|t| &t.name == name) {
            let known: Vec<&str> = first.tensors.iter().map(|t| t.name.as_str()).collect();
            return Err(invalid(format!(
                "model '{model}' has no output '{name}' (it has: {})",
                known.join(", ")
            )));
        }
    }
    let n = outputs.len() as i64;
    let mut stacked = Vec::new();
    for (k, t) in first.tensors.iter().enumerate() {
        if !requested.is_empty() && !requested.contains(&t.name) {
            continue;
        }
        let dtype = pb::DType::try_from(t.dtype).unwrap_or(pb::DType::DtypeUnspecified);
        if datatype(dtype).is_empty() {
            return Err(bad(format!(
                "output '{}' has a dtype the OIP cannot carry",
                t.name
            )));
        }
        let mut data = BytesMut::with_capacity(t.data.len() * outputs.len());
        for (i, o) in outputs.iter().enumerate() {
            let same = o
                .tensors
                .get(k)
                .filter(|u| u.name == t.name && u.dtype == t.dtype && u.shape == t.shape);
            let Some(u) = same else {
                return Err(bad(format!(
                    "item {i}'s outputs differ from item 0's (output '{}'): they cannot be stacked",
                    t.name
                )));
            };
            data.extend_from_slice(&u.data);
        }
        let mut shape = vec![n];
        shape.extend_from_slice(&t.shape);
        let tensor = Tensor {
            name: t.name.clone(),
            dtype,
            shape,
            data: data.freeze(),
        };
        check_data(&tensor).map_err(|e| bad(e.to_string()))?;
        stacked.push(tensor);
    }
    Ok(stacked)
}

/// The elements of a raw tensor as JSON values: numbers (FP16 and BF16 as their f32 values),
/// booleans, and BYTES elements as strings (lossy where not UTF-8).
pub fn raw_to_json(dtype: pb::DType, raw: &[u8]) -> Vec<serde_json::Value> {
    use pb::DType as D;
    use serde_json::json;
    fn each<const N: usize>(
        raw: &[u8],
        f: impl Fn([u8; N]) -> serde_json::Value,
    ) -> Vec<serde_json::Value> {
        raw.chunks_exact(N)
            .map(|c| f(c.try_into().unwrap_or([0; N])))
            .collect()
    }
    match dtype {
        D::DtypeBool => raw.iter().map(|b| json!(*b != 0)).collect(),
        D::DtypeU8 => raw.iter().map(|b| json!(b)).collect(),
        D::DtypeI8 => raw.iter().map(|b| json!(i8::from_le_bytes([*b]))).collect(),
        D::DtypeI16 => each::<2>(raw, |b| json!(i16::from_le_bytes(b))),
        D::DtypeU16 => each::<2>(raw, |b| json!(u16::from_le_bytes(b))),
        D::DtypeI32 => each::<4>(raw, |b| json!(i32::from_le_bytes(b))),
        D::DtypeU32 => each::<4>(raw, |b| json!(u32::from_le_bytes(b))),
        D::DtypeI64 => each::<8>(raw, |b| json!(i64::from_le_bytes(b))),
        D::DtypeU64 => each::<8>(raw, |b| json!(u64::from_le_bytes(b))),
        D::DtypeF32 => each::<4>(raw, |b| json!(f32::from_le_bytes(b))),
        D::DtypeF64 => each::<8>(raw, |b| json!(f64::from_le_bytes(b))),
        D::DtypeF16 => each::<2>(raw, |b| json!(half::f16::from_le_bytes(b).to_f32())),
        D::DtypeBf16 => each::<2>(raw, |b| json!(half::bf16::from_le_bytes(b).to_f32())),
        D::DtypeBytes => {
            let mut out = Vec::new();
            let mut rest = raw;
            while rest.len() >= 4 {
                let n = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let Some(s) = rest.get(4..4 + n) else { break };
                out.push(json!(String::from_utf8_lossy(s)));
                rest = &rest[4 + n..];
            }
            out
        }
        _ => Vec::new(),
    }
}

/// JSON elements (nested arrays flattened, row-major) in the raw layout of `dtype`, checking
/// their count, types and ranges.
pub fn json_to_raw(
    name: &str,
    dtype: pb::DType,
    data: &serde_json::Value,
    count: usize,
) -> Result<Bytes, InferError> {
    use pb::DType as D;
    fn flatten<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
        match v {
            serde_json::Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
            other => out.push(other),
        }
    }
    let mut flat = Vec::new();
    flatten(data, &mut flat);
    if flat.len() != count {
        return Err(invalid(format!(
            "input '{name}': its shape holds {count} elements but its data has {}",
            flat.len()
        )));
    }
    let wrong = |i: usize, what: &str| {
        invalid(format!(
            "input '{name}': element {i} is not {what} (datatype {})",
            datatype(dtype)
        ))
    };
    let mut out = BytesMut::new();
    for (i, v) in flat.iter().enumerate() {
        macro_rules! int {
            ($t:ty, $get:ident) => {{
                let x = v.$get().ok_or_else(|| wrong(i, "an integer"))?;
                let x = <$t>::try_from(x).map_err(|_| wrong(i, "in range"))?;
                out.extend_from_slice(&x.to_le_bytes());
            }};
        }
        match dtype {
            D::DtypeBool => out
                .extend_from_slice(&[u8::from(v.as_bool().ok_or_else(|| wrong(i, "a boolean"))?)]),
            D::DtypeI8 => int!(i8, as_i64),
            D::DtypeI16 => int!(i16, as_i64),
            D::DtypeI32 => int!(i32, as_i64),
            D::DtypeI64 => int!(i64, as_i64),
            D::DtypeU8 => int!(u8, as_u64),
            D::DtypeU16 => int!(u16, as_u64),
            D::DtypeU32 => int!(u32, as_u64),
            D::DtypeU64 => int!(u64, as_u64),
            D::DtypeF32 | D::DtypeF64 | D::DtypeF16 | D::DtypeBf16 => {
                let x = v.as_f64().ok_or_else(|| wrong(i, "a number"))?;
                match dtype {
                    D::DtypeF32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
                    D::DtypeF64 => out.extend_from_slice(&x.to_le_bytes()),
                    D::DtypeF16 => out.extend_from_slice(&half::f16::from_f64(x).to_le_bytes()),
                    _ => out.extend_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
                }
            }
            D::DtypeBytes => {
                let s = v.as_str().ok_or_else(|| wrong(i, "a string"))?;
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
            _ => return Err(invalid(format!("input '{name}': unsupported datatype"))),
        }
    }
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Bytes {
        v.iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>()
            .into()
    }

    fn t(name: &str, dtype: pb::DType, shape: &[i64], data: Bytes) -> Tensor {
        Tensor {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            data,
        }
    }

    #[test]
    fn datatypes_round_trip_and_unknown_ones_are_named() {
        for name in [
            "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
            "FP16", "BF16", "FP32", "FP64", "BYTES",
        ] {
            assert_eq!(datatype(dtype(name).expect("known")), name);
        }
        let e = dtype("FP8").expect_err("unknown");
        assert!(e.to_string().contains("'FP8'"), "{e}");
    }

    #[test]
    fn typed_contents_become_the_raw_layout_with_counts_and_ranges_checked() {
        let c = oip::InferTensorContents {
            int_contents: vec![1, -2, 300],
            ..Default::default()
        };
        let raw = typed_to_raw("x", pb::DType::DtypeI16, &c, 3).expect("fits");
        assert_eq!(&raw[..], &[1, 0, 0xfe, 0xff, 0x2c, 0x01]);
        assert!(
            typed_to_raw("x", pb::DType::DtypeI8, &c, 3).is_err(),
            "300 is not an i8"
        );
        assert!(
            typed_to_raw("x", pb::DType::DtypeI32, &c, 4).is_err(),
            "count"
        );
        let c = oip::InferTensorContents {
            bytes_contents: vec![b"ab".to_vec(), Vec::new()],
            ..Default::default()
        };
        let raw = typed_to_raw("s", pb::DType::DtypeBytes, &c, 2).expect("bytes");
        assert_eq!(&raw[..], &[2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
        assert!(
            typed_to_raw("h", pb::DType::DtypeF16, &c, 2).is_err(),
            "raw only"
        );
    }

    #[test]
    fn grpc_inputs_take_raw_or_typed_contents_but_not_both() {
        let input = |contents| oip::model_infer_request::InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![1, 2],
            contents,
            ..Default::default()
        };
        let mut req = oip::ModelInferRequest {
            inputs: vec![input(None)],
            raw_input_contents: vec![f32s(&[1.0, 2.0])],
            ..Default::default()
        };
        let got = grpc_inputs(&mut req).expect("raw");
        assert_eq!(got[0].data, f32s(&[1.0, 2.0]));
        let typed = oip::InferTensorContents {
            fp32_contents: vec![1.0, 2.0],
            ..Default::default()
        };
        let mut req = oip::ModelInferRequest {
            inputs: vec![input(Some(typed.clone()))],
            raw_input_contents: vec![f32s(&[1.0, 2.0])],
            ..Default::default()
        };
        assert!(grpc_inputs(&mut req).is_err());
        let mut req = oip::ModelInferRequest {
            inputs: vec![input(None)],
            raw_input_contents: vec![f32s(&[1.0])],
            ..Default::default()
        };
        let e = grpc_inputs(&mut req).expect_err("short");
        assert!(e.to_string().contains("needs 8 bytes"), "{e}");
    }

    #[test]
    fn inputs_split_into_items_by_rows_and_one_bytes_input_into_texts() {
        let x = t(
            "x",
            pb::DType::DtypeF32,
            &[2, 2],
            f32s(&[1.0, 2.0, 3.0, 4.0]),
        );
        let ids = t(
            "ids",
            pb::DType::DtypeI64,
            &[2],
            (0..2i64)
                .flat_map(i64::to_le_bytes)
                .collect::<Vec<u8>>()
                .into(),
        );
        let items = to_items(vec![x, ids], &HashMap::new(), 1 << 20).expect("split");
        assert_eq!(items.len(), 2);
        let Some(pb::item::Input::Tensors(second)) = &items[1].input else {
            panic!("tensors")
        };
        assert_eq!(
            second.tensors[0].shape,
            Vec::<i64>::new().into_iter().chain([2]).collect::<Vec<_>>()
        );
        assert_eq!(second.tensors[0].data, f32s(&[3.0, 4.0]));
        assert_eq!(second.tensors[1].shape, Vec::<i64>::new());
        let texts = t(
            "text",
            pb::DType::DtypeBytes,
            &[2],
            encode_bytes([&b"hi"[..], "é".as_bytes()]),
        );
        let items = to_items(vec![texts], &HashMap::new(), 1 << 20).expect("texts");
        let got: Vec<&str> = items
            .iter()
            .map(|i| match &i.input {
                Some(pb::item::Input::Text(t)) => t.text.as_str(),
                _ => panic!("text"),
            })
            .collect();
        assert_eq!(got, ["hi", "é"]);
        // Two BYTES per row stay tensors, sliced by element.
        let pairs = t(
            "p",
            pb::DType::DtypeBytes,
            &[2, 2],
            encode_bytes([&b"a"[..], b"bb", b"", b"c"]),
        );
        let items = to_items(vec![pairs], &HashMap::new(), 1 << 20).expect("pairs");
        let Some(pb::item::Input::Tensors(row)) = &items[1].input else {
            panic!("tensors")
        };
        assert_eq!(row.tensors[0].data, encode_bytes([&b""[..], b"c"]));
    }

    #[test]
    fn bad_splits_say_why() {
        let scalar = t("s", pb::DType::DtypeF32, &[], f32s(&[1.0]));
        assert!(to_items(vec![scalar], &HashMap::new(), 1 << 20).is_err());
        let a = t("a", pb::DType::DtypeF32, &[2], f32s(&[1.0, 2.0]));
        let b = t("b", pb::DType::DtypeF32, &[1], f32s(&[1.0]));
        let e = to_items(vec![a.clone(), b], &HashMap::new(), 1 << 20).expect_err("rows");
        assert!(e.to_string().contains("disagree"), "{e}");
        assert!(
            to_items(vec![a.clone(), a], &HashMap::new(), 1 << 20).is_err(),
            "twice"
        );
        let bad_utf8 = t(
            "t",
            pb::DType::DtypeBytes,
            &[1],
            encode_bytes([&[0xff_u8][..]]),
        );
        assert!(to_items(vec![bad_utf8], &HashMap::new(), 1 << 20).is_err());
    }

    /// A batch dimension of 2^32 rows with no data at all (zero elements) once aborted the
    /// server building one item per row; it is refused before anything is built per row.
    #[test]
    fn a_batch_past_the_limit_is_refused_before_any_row_is_built() {
        for shape in [vec![4_294_967_296, 0], vec![16_777_215, 0], vec![5, 0]] {
            let t = Tensor {
                name: "x".into(),
                dtype: pb::DType::DtypeF32,
                shape: shape.clone(),
                data: Bytes::new(),
            };
            check_data(&t).expect("zero elements, zero bytes");
            let e = to_items(vec![t], &HashMap::new(), 4).expect_err("too many rows");
            assert!(
                matches!(e, InferError::TooLarge { limit: 4, .. }),
                "{shape:?}: {e:?}"
            );
            assert!(e.never_fits());
        }
        let e = bytes_elements("t", &[5, 0, 0, 0, b'a'], 1).expect_err("short");
        assert!(e.to_string().contains("past the end"), "{e}");
    }

    #[test]
    fn json_elements_round_trip_through_the_raw_layout() {
        let v = serde_json::json!([[1, 2], [3, 4]]);
        let raw = json_to_raw("x", pb::DType::DtypeI16, &v, 4).expect("fits");
        assert_eq!(raw_to_json(pb::DType::DtypeI16, &raw), vec![1, 2, 3, 4]);
        let v = serde_json::json!(["hi", "é"]);
        let raw = json_to_raw("s", pb::DType::DtypeBytes, &v, 2).expect("strings");
        assert_eq!(raw_to_json(pb::DType::DtypeBytes, &raw), vec!["hi", "é"]);
        let v = serde_json::json!([0.5, 1.5]);
        let raw = json_to_raw("h", pb::DType::DtypeF16, &v, 2).expect("halves");
        assert_eq!(raw_to_json(pb::DType::DtypeF16, &raw), vec![0.5, 1.5]);
        assert!(json_to_raw("x", pb::DType::DtypeU8, &serde_json::json!([256]), 1).is_err());
        assert!(json_to_raw("x", pb::DType::DtypeI32, &serde_json::json!([1.5]), 1).is_err());
        let e = json_to_raw("x", pb::DType::DtypeF32, &serde_json::json!([1, 2, 3]), 4)
            .expect_err("count");
        assert!(
            e.to_string()
                .contains("holds 4 elements but its data has 3"),
            "{e}"
        );
    }

    #[test]
    fn outputs_stack_and_mismatches_are_the_models_fault() {
        let out = |v: &[f32]| pb::ItemOutput {
            tensors: vec![pb::TensorOutput {
                name: "y".into(),
                dtype: pb::DType::DtypeF32 as i32,
                shape: vec![v.len() as i64],
                data: f32s(v),
            }],
            parameters: HashMap::new(),
        };
        let s = stack("m", &[out(&[1.0, 2.0]), out(&[3.0, 4.0])], &[]).expect("stacks");
        assert_eq!(s[0].shape, vec![2, 2]);
        assert_eq!(s[0].data, f32s(&[1.0, 2.0, 3.0, 4.0]));
        let e = stack("m", &[out(&[1.0]), out(&[3.0, 4.0])], &[]).expect_err("shapes differ");
        assert_eq!(e.kind(), modelshare_serving::Kind::Internal);
        let e = stack("m", &[out(&[1.0])], &["z".into()]).expect_err("unknown output");
        assert_eq!(e.kind(), modelshare_serving::Kind::InvalidArgument);
    }
}
