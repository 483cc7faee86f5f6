//! [`PyHandler`]: the SDK's [`Handler`] over a Python callable.
//!
//! Each batch runs on a thread of the runtime's blocking pool (`spawn_blocking`), which takes
//! the GIL to call Python: the runtime's own threads, where the session's heartbeats and the
//! serve stream run, never wait for Python, so a slow handler delays no heartbeat. Up to
//! `credits` batches run at once, each on its own thread (they share the GIL, released by
//! numpy, torch and I/O as usual).
//!
//! The callable is `modelshare._serve`'s adapter around the user's handler: it takes
//! `(batch_id, version, items)` and returns the answers in `outcome`'s form, having turned the
//! user's exceptions into failed items. If it raises anyway, every item of the batch fails
//! with INTERNAL and the exception is printed.

use std::sync::Arc;

use modelshare_worker::Handler;
use modelshare_worker::serve::{Batch, ItemFailure, Outcome};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::item::Item;
use crate::outcome::outcomes;

/// A Python callable serving batches.
#[derive(Debug, Clone)]
pub(crate) struct PyHandler {
    call: Arc<Py<PyAny>>,
}

impl PyHandler {
    pub(crate) fn new(call: Py<PyAny>) -> Self {
        Self {
            call: Arc::new(call),
        }
    }
}

impl Handler for PyHandler {
    async fn handle(&self, batch: Batch) -> Vec<Outcome> {
        let items = batch.items.len();
        let call = self.call.clone();
        match tokio::task::spawn_blocking(move || Python::attach(|py| run(py, &call, batch))).await
        {
            Ok(answers) => answers,
            Err(e) => vec![
                Err(ItemFailure::internal(format!(
                    "the worker's handler thread failed: {e}"
                )));
                items
            ],
        }
    }
}

/// Calls the handler on `batch` and reads its answers.
fn run(py: Python<'_>, call: &Py<PyAny>, batch: Batch) -> Vec<Outcome> {
    let count = batch.items.len();
    let answered = PyList::new(py, batch.items.into_iter().map(Item::new))
        .and_then(|items| call.call1(py, (batch.id, batch.version, items)));
    match answered {
        Ok(answers) => outcomes(answers.bind(py), count),
        Err(e) => {
            let message = format!("the worker's handler failed: {e}");
            e.print(py);
            vec![Err(ItemFailure::internal(message)); count]
        }
    }
}
