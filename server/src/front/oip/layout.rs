//! The raw layout: [`Tensor`], one tensor in it; how many elements a shape holds, where each
//! BYTES element lies, and the check that a tensor's data holds exactly what its shape and
//! dtype say.

use modelshare_proto::v1 as pb;
use prost::bytes::{Bytes, BytesMut};

use super::datatypes::{datatype, element_size};
use super::error::invalid;
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
