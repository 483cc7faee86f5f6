//! A request's tensors split into the items of the request path: one item per row of the
//! batch (first) dimension, or one text item per element of a lone BYTES input.

use std::collections::HashMap;

use modelshare_proto::v1 as pb;
use prost::bytes::Bytes;

use super::datatypes::element_size;
use super::error::invalid;
use super::layout::{Tensor, bytes_elements, element_count};
use modelshare_serving::InferError;

/// A request's items, and the input its text items came from (a worker that declares its
/// inputs refuses a name it did not declare).
#[derive(Debug)]
pub struct Items {
    pub items: Vec<pb::Item>,
    /// The lone BYTES input's name, when the items are texts.
    pub text_input: Option<String>,
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
) -> Result<Items, InferError> {
    let Some(first) = inputs.first() else {
        return Err(invalid("the request has no inputs".into()));
    };
    check_names(&inputs)?;
    let n = batch(&inputs, first)?;
    if n > max_items {
        return Err(InferError::TooLarge {
            items: n,
            limit: max_items,
        });
    }
    let text = inputs.len() == 1
        && first.dtype == pb::DType::DtypeBytes
        && (first.shape.len() == 1 || (first.shape.len() == 2 && first.shape[1] == 1));
    if text {
        return Ok(Items {
            items: text_items(first, n, parameters)?,
            text_input: Some(first.name.clone()),
        });
    }
    Ok(Items {
        items: tensor_items(&inputs, n, parameters)?,
        text_input: None,
    })
}

/// Refuses an input named twice.
fn check_names(inputs: &[Tensor]) -> Result<(), InferError> {
    let mut names = std::collections::HashSet::new();
    for t in inputs {
        if !names.insert(t.name.as_str()) {
            return Err(invalid(format!("input '{}' is given twice", t.name)));
        }
    }
    Ok(())
}

/// The rows of the batch, which every input must have and agree on (`first` named when they
/// do not).
fn batch(inputs: &[Tensor], first: &Tensor) -> Result<usize, InferError> {
    let n = rows(first)?;
    for t in inputs {
        let m = rows(t)?;
        if m != n {
            return Err(invalid(format!(
                "inputs disagree on the batch dimension: '{}' has {n} rows, '{}' has {m}",
                first.name, t.name
            )));
        }
    }
    Ok(n)
}

/// The rows of one input: its first dimension, at least 1.
fn rows(t: &Tensor) -> Result<usize, InferError> {
    match t.shape.first() {
        Some(n) if *n >= 1 => Ok(usize::try_from(*n).unwrap_or(usize::MAX)),
        _ => Err(invalid(format!(
            "input '{}': shape {:?} has no batch dimension (the first dimension, at least 1, is the batch)",
            t.name, t.shape
        ))),
    }
}

/// One item of the request, with its parameters.
fn item(input: pb::item::Input, parameters: &HashMap<String, pb::Parameter>) -> pb::Item {
    pb::Item {
        input: Some(input),
        parameters: parameters.clone(),
        ..Default::default()
    }
}

/// The `n` elements of a lone BYTES input as text items, each UTF-8.
fn text_items(
    input: &Tensor,
    n: usize,
    parameters: &HashMap<String, pb::Parameter>,
) -> Result<Vec<pb::Item>, InferError> {
    let elements = bytes_elements(&input.name, &input.data, n)?;
    elements
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let text = std::str::from_utf8(&input.data[r]).map_err(|_| {
                invalid(format!(
                    "input '{}': element {i} is not UTF-8 text",
                    input.name
                ))
            })?;
            Ok(item(
                pb::item::Input::Text(pb::TextInput {
                    text: text.to_owned(),
                }),
                parameters,
            ))
        })
        .collect()
}

/// The `n` rows of the inputs as items of tensors, each input's row a slice of its data.
fn tensor_items(
    inputs: &[Tensor],
    n: usize,
    parameters: &HashMap<String, pb::Parameter>,
) -> Result<Vec<pb::Item>, InferError> {
    // Each input's rows, as slices of its data.
    let mut per_input: Vec<Vec<Bytes>> = Vec::with_capacity(inputs.len());
    for t in inputs {
        per_input.push(row_slices(t, n)?);
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
            item(
                pb::item::Input::Tensors(pb::Tensors { tensors }),
                parameters,
            )
        })
        .collect())
}

/// The `n` rows of one input, as slices of its data (a BYTES row from its first element's
/// length to its last element's end).
fn row_slices(t: &Tensor, n: usize) -> Result<Vec<Bytes>, InferError> {
    let row_elements = element_count(&t.name, &t.shape[1..])?;
    Ok(match element_size(t.dtype) {
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
    })
}
