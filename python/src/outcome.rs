//! The handler's answers, as the Python side hands them over (`modelshare._serve` turns what a
//! handler returns into this form), made into the SDK's [`Outcome`]s and checked: one per
//! item, each output tensor's bytes matching its dtype and shape, names given once.
//!
//! The form, one tuple per item:
//! - `(True, tensors, parameters)`: `tensors` a list of `(name, dtype, shape, data)` (the
//!   safetensors dtype name or `"BYTES"`, a sequence of ints, `bytes`), `parameters` a dict of
//!   bool, int, float or str values;
//! - `(False, code, message)`: the item failed with the status code named `code`
//!   (`"INVALID_ARGUMENT"`, ...) and `message`.
//!
//! Or, for the whole batch at once (`modelshare.BatchOutput`), one tuple
//! `("batch", tensors, parameters, failures)`: `tensors` a list of `(name, dtype, shape, data)`
//! whose first dimension is the batch's items (the data split along it here, without a copy
//! per item), `parameters` a dict of lists (one value per item), `failures` a dict of item index
//! to `(code, message)` (those items fail; their rows are ignored).

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use modelshare_proto::v1::DType;
use modelshare_worker::serve::{ItemFailure, Outcome, Output, OutputTensor, Parameter};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

/// The outcomes of `answers` (one per item of a batch of `items`): an answer that is not of
/// the form fails its item with INTERNAL, saying why; a list of another length fails every
/// item.
pub(crate) fn outcomes(answers: &Bound<'_, PyAny>, items: usize) -> Vec<Outcome> {
    if let Ok((kind, tensors, parameters, failures)) =
        answers.extract::<(String, Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>)>()
        && kind == "batch"
    {
        return batch_outcomes(&tensors, &parameters, &failures, items)
            .unwrap_or_else(|why| vec![Err(internal(why)); items]);
    }
    let list: Vec<Bound<'_, PyAny>> = match answers.extract() {
        Ok(list) => list,
        Err(e) => return vec![Err(internal(format!("the answers are not a list: {e}"))); items],
    };
    if list.len() != items {
        let why = format!(
            "the handler returned {} answer(s) for a batch of {items} item(s)",
            list.len()
        );
        return vec![Err(internal(why)); items];
    }
    list.iter()
        .map(|answer| outcome(answer).unwrap_or_else(|why| Err(internal(why))))
        .collect()
}

fn internal(why: String) -> ItemFailure {
    ItemFailure::internal(format!("the worker's handler gave a bad answer: {why}"))
}

/// One answer; `Err` says why it is not of the form.
pub(crate) fn outcome(answer: &Bound<'_, PyAny>) -> Result<Outcome, String> {
    let (ok, first, second): (bool, Bound<'_, PyAny>, Bound<'_, PyAny>) = answer
        .extract()
        .map_err(|e| format!("an answer is not a 3-tuple: {e}"))?;
    if !ok {
        let code: String = first.extract().map_err(|e| format!("bad code: {e}"))?;
        let message: String = second.extract().map_err(|e| format!("bad message: {e}"))?;
        return Ok(Err(failure(&code, message)?));
    }
    let tensors: Vec<(String, String, Vec<i64>, Vec<u8>)> =
        first.extract().map_err(|e| format!("bad tensors: {e}"))?;
    let mut output = Output::new();
    let mut names = HashSet::new();
    for (name, dtype, shape, data) in tensors {
        if !names.insert(name.clone()) {
            return Err(format!("output '{name}' is given twice"));
        }
        output = output.with_tensor(tensor(name, &dtype, shape, data)?);
    }
    let parameters = second
        .cast::<PyDict>()
        .map_err(|_| "the parameters are not a dict".to_owned())?;
    for (name, value) in parameters.iter() {
        let name: String = name
            .extract()
            .map_err(|_| "a parameter's name is not a str".to_owned())?;
        let value = parameter(&value)
            .ok_or_else(|| format!("parameter '{name}' is not a bool, int, float or str"))?;
        output = output.with_parameter(name, value);
    }
    Ok(Ok(output))
}

/// The outcomes of a batch-level answer (see the module docs): each tensor split along its
/// first dimension into the items' rows, zero-copy slices of one buffer.
fn batch_outcomes(
    tensors: &Bound<'_, PyAny>,
    parameters: &Bound<'_, PyAny>,
    failures: &Bound<'_, PyAny>,
    items: usize,
) -> Result<Vec<Outcome>, String> {
    let tensors: Vec<(String, String, Vec<i64>, Vec<u8>)> = tensors
        .extract()
        .map_err(|e| format!("bad batch tensors: {e}"))?;
    let mut split: Vec<(String, DType, Vec<i64>, Vec<Bytes>)> = Vec::with_capacity(tensors.len());
    let mut names = HashSet::new();
    for (name, dtype, shape, data) in tensors {
        if !names.insert(name.clone()) {
            return Err(format!("output '{name}' is given twice"));
        }
        let Some((&rows, row_shape)) = shape.split_first() else {
            return Err(format!(
                "batch output '{name}' is a scalar; its first dimension must be the items"
            ));
        };
        if usize::try_from(rows).ok() != Some(items) {
            return Err(format!(
                "batch output '{name}' has {rows} rows for a batch of {items} item(s)"
            ));
        }
        // Checks the whole tensor's bytes against its dtype and shape, then splits them.
        let whole = tensor(name.clone(), &dtype, shape.clone(), data)?;
        if whole.dtype == DType::DtypeBytes {
            return Err(format!(
                "batch output '{name}' is BYTES: answer per item for strings"
            ));
        }
        let row = whole.data.len() / items.max(1);
        let rows = (0..items)
            .map(|i| whole.data.slice(i * row..(i + 1) * row))
            .collect();
        split.push((name, whole.dtype, row_shape.to_vec(), rows));
    }
    let parameters = parameters
        .cast::<PyDict>()
        .map_err(|_| "the batch parameters are not a dict".to_owned())?;
    let mut per_item: Vec<Vec<(String, Parameter)>> = vec![Vec::new(); items];
    for (name, values) in parameters.iter() {
        let name: String = name
            .extract()
            .map_err(|_| "a parameter's name is not a str".to_owned())?;
        let values: Vec<Bound<'_, PyAny>> = values
            .extract()
            .map_err(|_| format!("batch parameter '{name}' is not a list of one value per item"))?;
        if values.len() != items {
            return Err(format!(
                "batch parameter '{name}' has {} values for {items} item(s)",
                values.len()
            ));
        }
        for (slot, value) in per_item.iter_mut().zip(&values) {
            let value = parameter(value)
                .ok_or_else(|| format!("parameter '{name}' is not a bool, int, float or str"))?;
            slot.push((name.clone(), value));
        }
    }
    let failures: HashMap<usize, (String, String)> = failures
        .extract()
        .map_err(|e| format!("bad batch failures: {e}"))?;
    let mut outcomes = Vec::with_capacity(items);
    for (i, params) in per_item.into_iter().enumerate() {
        if let Some((code, message)) = failures.get(&i) {
            outcomes.push(Err(failure(code, message.clone())?));
            continue;
        }
        let mut output = Output::new();
        for (name, dtype, shape, rows) in &split {
            output = output.with_tensor(OutputTensor::new(
                name.clone(),
                *dtype,
                shape.clone(),
                rows[i].clone(),
            ));
        }
        for (name, value) in params {
            output = output.with_parameter(name, value);
        }
        outcomes.push(Ok(output));
    }
    Ok(outcomes)
}

/// An item's failure with the status code named `code` (`"INVALID_ARGUMENT"`, ...).
fn failure(code: &str, message: String) -> Result<ItemFailure, String> {
    let number = modelshare_proto::codes::from_name(code)
        .ok_or_else(|| format!("no status code is named {code:?}"))?;
    // OK is no failure: the SDK sends it as INTERNAL, as any failure needs a failing code.
    Ok(ItemFailure::new(tonic::Code::from_i32(number), message))
}

/// One output tensor, its bytes checked against its dtype and shape.
fn tensor(
    name: String,
    dtype: &str,
    shape: Vec<i64>,
    data: Vec<u8>,
) -> Result<OutputTensor, String> {
    let kind = if dtype == "BYTES" {
        DType::DtypeBytes
    } else {
        modelshare_proto::dtype::from_safetensors_name(dtype)
            .ok_or_else(|| format!("output '{name}' has an unknown dtype {dtype:?}"))?
    };
    let count = shape.iter().try_fold(1usize, |n, &d| {
        usize::try_from(d).ok().and_then(|d| n.checked_mul(d))
    });
    let Some(count) = count else {
        return Err(format!("output '{name}' has an impossible shape {shape:?}"));
    };
    if let Some(size) = modelshare_proto::dtype::size_of(kind)
        && count.checked_mul(size) != Some(data.len())
    {
        return Err(format!(
            "output '{name}' ({dtype}, shape {shape:?}) has {} bytes",
            data.len()
        ));
    }
    Ok(OutputTensor::new(name, kind, shape, data))
}

/// A parameter value: bool, int (int64, or uint64 above it), float or str.
fn parameter(value: &Bound<'_, PyAny>) -> Option<Parameter> {
    // bool before int: a Python bool is an int.
    if value.is_instance_of::<PyBool>() {
        return value.extract().ok().map(Parameter::Bool);
    }
    if value.is_instance_of::<PyInt>() {
        if let Ok(v) = value.extract::<i64>() {
            return Some(Parameter::Int64(v));
        }
        return value.extract::<u64>().ok().map(Parameter::Uint64);
    }
    if value.is_instance_of::<PyFloat>() {
        return value.extract().ok().map(Parameter::Double);
    }
    if value.is_instance_of::<PyString>() {
        return value.extract().ok().map(Parameter::String);
    }
    None
}
