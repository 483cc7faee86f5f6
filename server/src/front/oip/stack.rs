//! The items' outputs stacked back into the tensors of one answer.

use modelshare_proto::v1 as pb;
use prost::bytes::BytesMut;

use super::datatypes::datatype;
use super::error::invalid;
use super::layout::{Tensor, check_data};
use modelshare_serving::InferError;

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
