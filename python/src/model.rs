//! `Model`: an attached model version (the SDK's [`modelshare_worker::Model`]) and the lease
//! its tensors share.

use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::arena::Arena;
use modelshare_proto::v1 as pb;
use modelshare_worker::WorkerError;

use crate::errors::{DeviceError, DtypeError, Timeout, from_worker};
use crate::lease::Lease;
use crate::runtime::seconds;
use crate::tensor::{Tensor, dtype_name};
use crate::views::{self, Unviewable};

/// How often `wait_ready` looks at a loading version's ready event.
const READY_POLL: Duration = Duration::from_millis(2);

/// An attached model version: its manifest, metadata files and tensors, mapped read-only.
/// The lease is held while this object or any tensor or array taken from it lives.
#[pyclass(module = "modelshare._native", name = "Model", frozen)]
#[derive(Debug)]
pub(crate) struct Model {
    lease: Lease,
}

impl Model {
    pub(crate) fn new(lease: Lease) -> Self {
        Self { lease }
    }

    /// The lease (the SDK's `Model`), for serving it.
    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }
}

#[pymethods]
impl Model {
    /// Model name.
    #[getter]
    fn name(&self) -> String {
        self.lease.name().to_owned()
    }

    /// Version attached now (after a reconnection, the version attached again).
    #[getter]
    fn version(&self) -> u32 {
        self.lease.version()
    }

    /// Id of the lease held now.
    #[getter]
    fn lease_id(&self) -> String {
        self.lease.lease_id()
    }

    /// Whether the arena is mapped read-only in this process (host memory, CUDA VMM); false
    /// for legacy CUDA IPC, whose mappings are writable.
    #[getter]
    fn read_only(&self) -> bool {
        self.lease.read_only()
    }

    /// The device the arena lives on: `"host"`, or a CUDA device's UUID (`GPU-…`).
    #[getter]
    fn device(&self) -> String {
        self.lease.view().device_uuid().to_owned()
    }

    /// Whether the arena is in device (CUDA) memory.
    #[getter]
    fn on_device(&self) -> bool {
        self.lease.view().is_on_device()
    }

    /// Whether the version was still loading when attached (CUDA only): see `wait_ready`.
    #[getter]
    fn attached_while_loading(&self) -> bool {
        self.lease.attached_while_loading()
    }

    /// The manifest: one dict per tensor, in arena order, with name, dtype (the safetensors
    /// name: `"F32"`, `"BF16"`, ...), shape (list), offset and byte_length (bytes).
    fn manifest<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let manifest = self.lease.manifest();
        manifest
            .tensors
            .iter()
            .map(|t| {
                let d = PyDict::new(py);
                d.set_item("name", &t.name)?;
                d.set_item("dtype", dtype_name(t.dtype()))?;
                d.set_item("shape", t.shape.clone())?;
                d.set_item("offset", t.offset)?;
                d.set_item("byte_length", t.byte_length)?;
                Ok(d)
            })
            .collect()
    }

    /// The metadata files the server publishes with the version (`config.json`,
    /// `tokenizer.json`, ...): file name to bytes.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let manifest = self.lease.manifest();
        let d = PyDict::new(py);
        for f in &manifest.files {
            d.set_item(&f.name, PyBytes::new(py, &f.content))?;
        }
        Ok(d)
    }

    /// The `__metadata__` string map of the safetensors header(s).
    fn header_metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let manifest = self.lease.manifest();
        let d = PyDict::new(py);
        for (k, v) in &manifest.header_metadata {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// The plan of `Model.torch()`: runs of tensors of one dtype and shape at one spacing, each
    /// `(dtype, shape, strides, first, step, names)` (offsets and strides in elements of the
    /// dtype), covering `names` (default: every tensor; `modelshare.NotFound` for one that is
    /// not there), and the names in the order asked.
    #[pyo3(signature = (names=None))]
    fn runs<'py>(
        &self,
        py: Python<'py>,
        names: Option<Vec<String>>,
    ) -> PyResult<(Vec<Bound<'py, PyTuple>>, Vec<String>)> {
        runs_of(py, &self.lease.manifest(), names)
    }

    /// The whole mapping, exported as one `uint8` DLPack tensor (`Model.torch()` views it).
    fn arena(&self) -> Arena {
        Arena::new(self.lease.clone())
    }

    /// Every tensor, in arena order (all from the same mapping).
    fn tensors(&self) -> Vec<Tensor> {
        self.lease
            .tensors()
            .into_iter()
            .map(|t| Tensor::new(t, self.lease.clone()))
            .collect()
    }

    /// The tensor called `name` (`modelshare.NotFound` if there is none).
    fn tensor(&self, py: Python<'_>, name: &str) -> PyResult<Tensor> {
        self.lease
            .tensor(name)
            .map(|t| Tensor::new(t, self.lease.clone()))
            .map_err(|e| from_worker(py, &e))
    }

    /// The names of the tensors whose bytes do not hash to the manifest's checksum (empty when
    /// all match). Hashes in place on the host backend; copies device memory to the host first.
    /// Runs with the GIL released.
    fn verify(&self, py: Python<'_>) -> Vec<String> {
        let lease = self.lease.clone();
        py.detach(move || lease.verify())
    }

    /// Waits until the version is fully loaded (CUDA: a version attached while loading; a
    /// no-op otherwise), polling its ready event with the GIL released. `timeout` in seconds.
    #[pyo3(signature = (timeout=None))]
    fn wait_ready(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let limit = seconds(timeout)?;
        let view = self.lease.view();
        let start = Instant::now();
        loop {
            match view.is_ready() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(DeviceError::new_err(e.to_string())),
            }
            if limit.is_some_and(|l| start.elapsed() >= l) {
                return Err(Timeout::new_err(format!(
                    "model '{}' version {} was not ready within {:.3} s",
                    self.lease.name(),
                    self.lease.version(),
                    limit.unwrap_or_default().as_secs_f64()
                )));
            }
            py.detach(|| std::thread::sleep(READY_POLL));
            py.check_signals()?;
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<modelshare.Model {:?} version={} device={:?} tensors={}>",
            self.lease.name(),
            self.lease.version(),
            self.lease.view().device_uuid(),
            self.lease.manifest().tensors.len()
        )
    }
}

/// `Model.runs()` over `manifest` (see there): also what an early attach's views are made by.
pub(crate) fn runs_of<'py>(
    py: Python<'py>,
    manifest: &pb::Manifest,
    names: Option<Vec<String>>,
) -> PyResult<(Vec<Bound<'py, PyTuple>>, Vec<String>)> {
    let chosen: Vec<&pb::TensorInfo> = match &names {
        None => manifest.tensors.iter().collect(),
        Some(names) => {
            let mut chosen = Vec::with_capacity(names.len());
            for name in names {
                match manifest.tensors.iter().find(|t| &t.name == name) {
                    Some(t) => chosen.push(t),
                    None => {
                        // The SDK's error, naming the tensor and the model.
                        let e = WorkerError::NoSuchTensor {
                            model: manifest.model.clone(),
                            tensor: name.clone(),
                        };
                        return Err(from_worker(py, &e));
                    }
                }
            }
            // Views in arena order, whatever order they were asked in.
            chosen.sort_by_key(|t| t.offset);
            chosen
        }
    };
    let order = match names {
        Some(names) => names,
        None => manifest.tensors.iter().map(|t| t.name.clone()).collect(),
    };
    let runs = views::plan(chosen).map_err(|e| match e {
        Unviewable::Dtype { name } => {
            DtypeError::new_err(format!("tensor {name:?} has no element type to view"))
        }
        Unviewable::Misaligned { name, offset } => DtypeError::new_err(format!(
            "tensor {name:?} starts at byte {offset}, not on an element of its dtype"
        )),
    })?;
    let runs = runs
        .into_iter()
        .map(|r| {
            (
                dtype_name(r.dtype),
                PyTuple::new(py, r.shape)?,
                PyTuple::new(py, r.strides)?,
                r.first,
                r.step,
                r.names,
            )
                .into_pyobject(py)
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok((runs, order))
}
