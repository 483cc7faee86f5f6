//! `Item`: one request of a batch as the handler sees it (the SDK's
//! [`modelshare_worker::serve::Item`]): its input (text, or named tensors as bytes the Python
//! side views as numpy arrays), parameters, deadline and whether the server has cancelled it.

use std::time::UNIX_EPOCH;

use modelshare_worker::serve::{Input, Parameter};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::tensor::dtype_name;

/// One request of a batch. The Python side (`modelshare.Item`) wraps it.
#[pyclass(module = "modelshare._native", name = "Item", frozen)]
#[derive(Debug)]
pub(crate) struct Item {
    item: modelshare_worker::serve::Item,
}

impl Item {
    pub(crate) fn new(item: modelshare_worker::serve::Item) -> Self {
        Self { item }
    }
}

/// A request parameter as a Python value.
fn parameter<'py>(py: Python<'py>, p: &Parameter) -> PyResult<Bound<'py, PyAny>> {
    Ok(match p {
        Parameter::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Parameter::Int64(v) => v.into_pyobject(py)?.into_any(),
        Parameter::Uint64(v) => v.into_pyobject(py)?.into_any(),
        Parameter::Double(v) => v.into_pyobject(py)?.into_any(),
        Parameter::String(s) => s.into_pyobject(py)?.into_any(),
    })
}

#[pymethods]
impl Item {
    /// Identifier of the item, unique within the server.
    #[getter]
    fn id(&self) -> u64 {
        self.item.id
    }

    /// The text input (OpenAI-style requests), or None for a tensor input.
    #[getter]
    fn text(&self) -> Option<&str> {
        match &self.item.input {
            Input::Text(s) => Some(s),
            Input::Tensors(_) => None,
        }
    }

    /// The tensor inputs (KServe v2 requests), in the request's order, as tuples
    /// `(name, dtype, shape, data)`: the safetensors dtype name (`"F32"`, ..., or `"BYTES"`),
    /// the shape as a tuple, and the little-endian bytes (BYTES: each element's 4-byte length,
    /// then its bytes); an empty list for a text input. Checked by the SDK: the bytes match the
    /// shape.
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        if let Input::Tensors(tensors) = &self.item.input {
            for t in tensors {
                let shape = PyTuple::new(py, &t.shape)?;
                let data = PyBytes::new(py, &t.data);
                list.append((t.name.as_str(), dtype_name(t.dtype), shape, data))?;
            }
        }
        Ok(list)
    }

    /// Request parameters passed through from the front door (`dimensions`, ...): bool, int,
    /// float or str values.
    fn parameters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (name, value) in &self.item.parameters {
            dict.set_item(name, parameter(py, value)?)?;
        }
        Ok(dict)
    }

    /// When the caller stops waiting, in seconds since the epoch (as `time.time()`), or None.
    #[getter]
    fn deadline(&self) -> Option<f64> {
        self.item
            .deadline
            .and_then(|d| d.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs_f64())
    }

    /// The request's id (the caller's `x-request-id`, or the server's; "" from older servers).
    #[getter]
    fn request_id(&self) -> &str {
        &self.item.request_id
    }

    /// The caller's W3C `traceparent`, if it sent a well-formed one.
    #[getter]
    fn traceparent(&self) -> Option<&str> {
        self.item.traceparent.as_deref()
    }

    /// Whether the server has cancelled the item (the caller went away, or its deadline
    /// passed): whatever is answered for it now is discarded.
    #[getter]
    fn cancelled(&self) -> bool {
        self.item.is_cancelled()
    }

    fn __repr__(&self) -> String {
        let input = match &self.item.input {
            Input::Text(s) => format!("text of {} bytes", s.len()),
            Input::Tensors(t) => format!("{} tensor(s)", t.len()),
        };
        format!("<modelshare.Item {} {input}>", self.item.id)
    }
}
