//! `Session`: a worker's session with the server (the SDK's [`modelshare_worker::Session`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use modelshare_proto::v1 as pb;
use modelshare_worker::{ConnectOptions, SessionOptions, Token, WorkerError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::attaching::Attaching;
use crate::errors::{SessionEnded, from_worker};
use crate::model::Model;
use crate::runtime::{OnRuntime, seconds, wait};

/// A worker's session with a modelshare server: heartbeats run in the background, and the
/// session reconnects (and attaches its models again) after a server restart. Open one with
/// `Session.open`.
#[pyclass(module = "modelshare._native", name = "Session", frozen)]
#[derive(Debug)]
pub(crate) struct Session {
    address: String,
    worker_name: String,
    /// `None` once closed.
    inner: Mutex<Option<OnRuntime<modelshare_worker::Session>>>,
}

impl Session {
    /// A clone of the SDK session (each clone keeps it open), or `SessionEnded` once closed.
    pub(crate) fn sdk(&self) -> PyResult<modelshare_worker::Session> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|s| modelshare_worker::Session::clone(s))
            .ok_or_else(|| SessionEnded::new_err("the session was closed"))
    }
}

/// The connection settings: the environment's (`MODELSHARE_TOKEN`, `MODELSHARE_TOKEN_FILE`,
/// `MODELSHARE_TLS_*`, as the SDK reads them), with `token` or `token_file` in place of the
/// environment's token when given.
fn connect_options(
    py: Python<'_>,
    token: Option<String>,
    token_file: Option<PathBuf>,
) -> PyResult<ConnectOptions> {
    let given = token.is_some() || token_file.is_some();
    // A token given here makes the environment's irrelevant (even both of them set at once).
    let options = if given {
        ConnectOptions::from_lookup(|name| {
            (!name.starts_with("MODELSHARE_TOKEN"))
                .then(|| std::env::var_os(name))
                .flatten()
        })
    } else {
        ConnectOptions::from_env()
    }
    .map_err(|e| from_worker(py, &e))?;
    match (token, token_file) {
        (Some(_), Some(_)) => Err(PyValueError::new_err("give token or token_file, not both")),
        (Some(token), None) => {
            let token = Token::new(token).map_err(|e| from_worker(py, &e))?;
            Ok(options.with_token(token))
        }
        (None, Some(path)) => Ok(options.with_token_file(path)),
        (None, None) => Ok(options),
    }
}

/// A `DeviceInfo` as a dict: backend (`"host"`, `"cuda_ipc"`, `"cuda_vmm"`), uuid, name,
/// total_bytes.
fn device_dict<'py>(py: Python<'py>, d: &pb::DeviceInfo) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    let backend = d
        .backend()
        .as_str_name()
        .trim_start_matches("BACKEND_KIND_")
        .to_ascii_lowercase();
    dict.set_item("backend", backend)?;
    dict.set_item("uuid", &d.uuid)?;
    dict.set_item("name", &d.name)?;
    dict.set_item("total_bytes", d.total_bytes)?;
    Ok(dict)
}

#[pymethods]
impl Session {
    /// Connects to `server` and opens a session named `name` (shown by `modelshare ps`).
    ///
    /// `server`: `unix:/path/to/socket`, `http://host:port` or `https://host:port`; `None`: the
    /// SDK's discovery rule (`MODELSHARE_SERVER`, this user's socket, the container socket,
    /// `127.0.0.1:50051`; a failure names every place it looked). The token:
    /// `token`, else the file `token_file` (read again at every reconnection), else
    /// `MODELSHARE_TOKEN` / `MODELSHARE_TOKEN_FILE`; TLS settings from `MODELSHARE_TLS_*`.
    /// `timeout` (seconds) bounds the connection and the handshake.
    #[staticmethod]
    #[pyo3(signature = (server=None, *, name, token=None, token_file=None, labels=None, reconnect=true, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        server: Option<String>,
        name: String,
        token: Option<String>,
        token_file: Option<PathBuf>,
        labels: Option<HashMap<String, String>>,
        reconnect: bool,
        timeout: Option<f64>,
    ) -> PyResult<Self> {
        let options = SessionOptions {
            worker_name: name.clone(),
            labels: labels.unwrap_or_default(),
            no_reconnect: !reconnect,
            connect: connect_options(py, token, token_file)?,
            // The device: the SDK's choice (MODELSHARE_DEVICE_UUID, else CUDA device 0 on a
            // server of several devices); and whatever else a newer SDK adds, its defaults.
            ..SessionOptions::default()
        };
        let server = modelshare_worker::discover(server.as_deref())
            .map_err(|e| from_worker(py, &WorkerError::from(e)))?
            .address;
        let address = server.clone();
        let opened = wait(
            py,
            &format!("opening a session with {server}"),
            seconds(timeout)?,
            async move { modelshare_worker::Session::open_with(&address, options).await },
        )?
        .map_err(|e| from_worker(py, &e))?;
        Ok(Self {
            address: server,
            worker_name: name,
            inner: Mutex::new(Some(OnRuntime::new(opened))),
        })
    }

    /// The server address the session connects to.
    #[getter]
    fn server(&self) -> &str {
        &self.address
    }

    /// The worker name the session was opened with.
    #[getter]
    fn name(&self) -> &str {
        &self.worker_name
    }

    /// The current session id (it changes after a reconnection); empty while reconnecting.
    #[getter]
    fn id(&self) -> PyResult<String> {
        Ok(self.sdk()?.id())
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// The server's devices, in its order: dicts with backend, uuid, name, total_bytes.
    #[getter]
    fn devices<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let sdk = self.sdk()?;
        sdk.devices().iter().map(|d| device_dict(py, d)).collect()
    }

    /// Attaches to `version` of `model` (`None`: the latest ready version) and maps its arena.
    /// `timeout` (seconds) bounds the call.
    #[pyo3(signature = (model, version=None, *, timeout=None))]
    fn attach(
        &self,
        py: Python<'_>,
        model: String,
        version: Option<u32>,
        timeout: Option<f64>,
    ) -> PyResult<Model> {
        let version = requested(version)?;
        let entered = std::time::Instant::now();
        let sdk = self.sdk()?;
        let what = format!("attaching to model '{model}'");
        let attached = wait(py, &what, seconds(timeout)?, async move {
            let attached = sdk.attach_version(&model, version).await;
            // Dropped here, on the runtime: the session lives on in the model.
            drop(sdk);
            attached
        })?
        .map_err(|e| from_worker(py, &e))?;
        tracing::trace!(
            binding_us = entered.elapsed().as_micros() as u64,
            "attach: back in the binding"
        );
        Ok(Model::new(Arc::new(OnRuntime::new(attached))))
    }

    /// Attaches as `attach` does, in two steps: returns once the server has granted the lease
    /// (the manifest known, and on CUDA VMM the address the arena will be mapped at), while the
    /// handle is redeemed and mapped in the background; `Attaching.finish()` gives the `Model`.
    /// `timeout` (seconds) bounds this first step.
    #[pyo3(signature = (model, version=None, *, timeout=None))]
    fn attach_early(
        &self,
        py: Python<'_>,
        model: String,
        version: Option<u32>,
        timeout: Option<f64>,
    ) -> PyResult<Attaching> {
        let version = requested(version)?;
        let sdk = self.sdk()?;
        let what = format!("attaching to model '{model}'");
        let pending = wait(py, &what, seconds(timeout)?, async move {
            let pending = sdk.attach_early(&model, version).await;
            // Dropped here, on the runtime: the session lives on in the mapping task.
            drop(sdk);
            pending
        })?
        .map_err(|e| from_worker(py, &e))?;
        Ok(Attaching::new(pending))
    }

    /// Ends the session now: the server releases every lease it holds, even those of models
    /// and arrays still alive (on the host backend their mappings stay readable; on CUDA do
    /// not use them afterwards). Waits for the server's acknowledgement (about a second at
    /// most). Dropping every reference to the session and its models ends it too.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(sdk) = taken.and_then(OnRuntime::take) {
            wait(py, "closing the session", None, sdk.close())?;
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { "closed" } else { "open" };
        format!(
            "<modelshare.Session {state} name={:?} server={:?}>",
            self.worker_name, self.address
        )
    }
}

/// The SDK's version number for `version` (`None`: the latest, 0); refuses 0, which Python
/// would otherwise take for a version.
fn requested(version: Option<u32>) -> PyResult<u32> {
    match version {
        Some(0) => Err(PyValueError::new_err(
            "versions count from 1 (None: the latest)",
        )),
        v => Ok(v.unwrap_or(0)),
    }
}
