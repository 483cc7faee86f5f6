//! JSON elements, as the REST door carries them in `data`, to and from the raw layout.

use modelshare_proto::v1 as pb;
use prost::bytes::{Bytes, BytesMut};

use super::datatypes::datatype;
use super::error::invalid;
use modelshare_serving::InferError;

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
