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

use std::collections::HashSet;

use modelshare_proto::v1::DType;
use modelshare_worker::serve::{ItemFailure, Outcome, Output, OutputTensor, Parameter};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

/// The outcomes of `answers` (one per item of a batch of `items`): an answer that is not of
/// the form fails its item with INTERNAL, saying why; a list of another length fails every
/// item.
pub(crate) fn outcomes(answers: &Bound<'_, PyAny>, items: usize) -> Vec<Outcome> {
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
fn outcome(answer: &Bound<'_, PyAny>) -> Result<Outcome, String> {
    let (ok, first, second): (bool, Bound<'_, PyAny>, Bound<'_, PyAny>) = answer
        .extract()
        .map_err(|e| format!("an answer is not a 3-tuple: {e}"))?;
    if !ok {
        let code: String = first.extract().map_err(|e| format!("bad code: {e}"))?;
        let message: String = second.extract().map_err(|e| format!("bad message: {e}"))?;
        let number = modelshare_proto::codes::from_name(&code)
            .ok_or_else(|| format!("no status code is named {code:?}"))?;
        // OK is no failure: the SDK sends it as INTERNAL, as any failure needs a failing code.
        return Ok(Err(ItemFailure::new(
            tonic::Code::from_i32(number),
            message,
        )));
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
