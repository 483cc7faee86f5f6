//! `Parts`: how a streaming handler's parts leave its thread. The Python side
//! (`modelshare._serve`) calls it with each part in `outcome`'s form; it hands the part to the
//! serve loop (`handler`'s `handle_stream`, which sends it within the item's window) and waits,
//! without the GIL, until the loop has room for it (one part at most waits between the two):
//! so a closed window or a slow reader holds the handler's generator, never a buffer. It answers False once the item is cancelled or its
//! stream has ended: the Python side then stops the generator.

use modelshare_worker::serve::Output;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tokio::sync::mpsc;

use crate::outcome::outcome;

/// Sends one item's parts (see the module's documentation).
#[pyclass(module = "modelshare._native", name = "Parts", frozen)]
#[derive(Debug)]
pub(crate) struct Parts {
    tx: mpsc::Sender<Output>,
}

impl Parts {
    pub(crate) fn new(tx: mpsc::Sender<Output>) -> Self {
        Self { tx }
    }
}

#[pymethods]
impl Parts {
    /// Sends `part` (`(True, tensors, parameters)`), waiting until the serve loop has room:
    /// True when sent, False when the item was cancelled or its stream ended. A part that is
    /// not of the form raises ValueError.
    fn __call__(&self, py: Python<'_>, part: &Bound<'_, PyAny>) -> PyResult<bool> {
        let output = match outcome(part) {
            Ok(Ok(output)) => output,
            Ok(Err(_)) => {
                return Err(PyValueError::new_err(
                    "a part cannot be an error: raise it from the handler instead",
                ));
            }
            Err(why) => return Err(PyValueError::new_err(format!("a bad part: {why}"))),
        };
        let tx = self.tx.clone();
        Ok(py.detach(move || tx.blocking_send(output).is_ok()))
    }
}
