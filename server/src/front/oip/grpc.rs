//! A gRPC ModelInfer request's inputs, each turned into a [`Tensor`] in the raw layout from
//! its typed `contents` or its `raw_input_contents`, and its parameters as the worker
//! protocol carries them.

use std::collections::HashMap;

use modelshare_proto::inference as oip;
use modelshare_proto::v1 as pb;
use prost::bytes::Bytes;

use super::datatypes::{datatype, dtype};
use super::error::invalid;
use super::layout::{Tensor, check_data, element_count, encode_bytes};
use modelshare_serving::InferError;

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

/// Checks that a typed field holds the `count` elements of the input's shape.
fn check(name: &str, got: usize, count: usize, field: &str) -> Result<(), InferError> {
    if got == count {
        Ok(())
    } else {
        Err(invalid(format!(
            "input '{name}': its shape holds {count} elements but {field} holds {got}"
        )))
    }
}

/// The values of a typed field in the raw layout, each narrowed by `conv` to its datatype
/// (`None`: out of its range).
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
