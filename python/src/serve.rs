//! `serve`: the SDK's serve loop ([`modelshare_worker::Session::serve`]) on one attached model,
//! with a Python handler, until the server drains the stream or the worker stops; and `Stop`,
//! what stops it from any thread.
//!
//! The calling thread waits with the GIL released, taking it back every 100 ms to run Python's
//! signal handlers. A handler that raises (Ctrl-C's `KeyboardInterrupt`, when the Python side
//! installed none of its own) stops serving the way `Stop.stop()` does: the batches held are
//! answered and the stream closed; then the exception is raised. One raised while stopping
//! abandons the stream at once (the server requeues what it held) and is raised.

use std::time::Duration;

use modelshare_proto::v1 as pb;
use modelshare_worker::serve::{Accepts, ServeEnd, ServeOptions};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::errors::from_worker;
use crate::handler::PyHandler;
use crate::model::Model;
use crate::runtime::wait_stoppable;
use crate::session::Session;

/// Stops a `serve` call: no new batch is started, those held are answered, the stream closes
/// and `serve` returns None. Usable from any thread, and from a signal handler.
#[pyclass(module = "modelshare._native", name = "Stop", frozen)]
#[derive(Debug, Default)]
pub(crate) struct Stop {
    token: CancellationToken,
}

#[pymethods]
impl Stop {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Stops serving (idempotent).
    fn stop(&self) {
        self.token.cancel();
    }

    /// Whether `stop()` was called.
    #[getter]
    fn stopped(&self) -> bool {
        self.token.is_cancelled()
    }
}

/// An OIP tensor spec from `(name, datatype, shape)`; refuses a datatype the OIP lacks.
fn spec((name, datatype, shape): (String, String, Vec<i64>)) -> PyResult<pb::TensorSpec> {
    let known = (0..64)
        .filter_map(|n| pb::DType::try_from(n).ok())
        .any(|d| {
            d != pb::DType::DtypeUnspecified && modelshare_proto::dtype::oip_datatype(d) == datatype
        });
    if !known {
        return Err(PyValueError::new_err(format!(
            "tensor spec '{name}': {datatype:?} is not a datatype (\"FP32\", \"INT64\", \"BYTES\", ...)"
        )));
    }
    Ok(pb::TensorSpec {
        name,
        datatype,
        shape,
    })
}

/// The input kinds named in `accepts` (`"text"`, `"tensor"`).
fn accepts(names: &[String]) -> PyResult<Accepts> {
    let mut kinds = Accepts {
        text: false,
        tensor: false,
    };
    for name in names {
        match name.as_str() {
            "text" => kinds.text = true,
            "tensor" => kinds.tensor = true,
            other => {
                return Err(PyValueError::new_err(format!(
                    "accepts: {other:?} is not an input kind (\"text\", \"tensor\")"
                )));
            }
        }
    }
    Ok(kinds)
}

/// The most batches run at once (threads of the handler's), as the most credits.
const MAX_CONCURRENCY: u32 = 1024;

/// Serves the version of `model` attached now with `handler` (see `handler`; with `streams`
/// above 0 a streaming worker, whose items go to the adapter's `stream`) until the server
/// drains the stream (returns the server's reason) or `stop` is stopped (returns None). A
/// broken stream (a server restart) is offered again once the session has re-attached the
/// model. Raises what the SDK refuses: options over the server's limits, a model of another
/// session, a refusal retrying cannot fix, the model gone after a reconnection, the session
/// ended.
#[pyfunction]
#[pyo3(signature = (session, model, handler, *, stop, credits=2, concurrency=1, max_batch_items=32, max_batch_bytes=0, accepts_kinds=vec!["text".to_owned(), "tensor".to_owned()], inputs=vec![], outputs=vec![], heartbeat_interval=None, streams=0))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve(
    py: Python<'_>,
    session: &Session,
    model: &Model,
    handler: Py<PyAny>,
    stop: &Stop,
    credits: u32,
    concurrency: u32,
    max_batch_items: u32,
    max_batch_bytes: u64,
    accepts_kinds: Vec<String>,
    inputs: Vec<(String, String, Vec<i64>)>,
    outputs: Vec<(String, String, Vec<i64>)>,
    heartbeat_interval: Option<f64>,
    streams: u32,
) -> PyResult<Option<String>> {
    if !(1..=MAX_CONCURRENCY).contains(&concurrency) {
        return Err(PyValueError::new_err(format!(
            "concurrency must be 1 to {MAX_CONCURRENCY} (batches run at once, each on a thread), not {concurrency}"
        )));
    }
    let heartbeat_interval = heartbeat_interval
        .map(|s| {
            Duration::try_from_secs_f64(s).map_err(|_| {
                PyValueError::new_err(format!(
                    "heartbeat_interval must be a number of seconds above 0, not {s}"
                ))
            })
        })
        .transpose()?;
    let options = ServeOptions {
        credits,
        max_batch_items,
        max_batch_bytes,
        accepts: accepts(&accepts_kinds)?,
        streams,
        inputs: inputs.into_iter().map(spec).collect::<PyResult<_>>()?,
        outputs: outputs.into_iter().map(spec).collect::<PyResult<_>>()?,
        heartbeat_interval,
        stop: stop.token.clone(),
    };
    let sdk = session.sdk()?;
    let lease = model.lease().clone();
    let (handler, threads) = PyHandler::new(handler, concurrency as usize)
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the handler's threads: {e}")))?;
    let served = wait_stoppable(py, &stop.token, async move {
        let served = sdk.serve(&lease, options, handler).await;
        // Dropped here, on the runtime (a last reference releases the lease).
        drop(lease);
        drop(sdk);
        served
    });
    // The handler's threads end before `serve` returns (they need the GIL to end), so none
    // outlives the call into an interpreter shutting down.
    py.detach(|| threads.join());
    let served = served?;
    match served {
        Ok(ServeEnd::Drained { reason }) => Ok(Some(reason)),
        Ok(ServeEnd::Stopped) => Ok(None),
        Err(e) => Err(from_worker(py, &e)),
    }
}
