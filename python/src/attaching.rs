//! `Attaching`: an attach the server has granted whose arena is still being mapped (the SDK's
//! [`modelshare_worker::Attaching`]), and `ReservedArena`, the DLPack export of the address
//! space it is being mapped at. `Session.attach` makes the torch views of a loaded version over
//! CUDA VMM from it while the Rust side redeems and maps the handle without the GIL, instead of
//! after: torch's own making of hundreds of views is then no longer added to the attach.

use std::sync::{Arc, Mutex, OnceLock};

use modelshare_proto::v1 as pb;
use modelshare_worker::{Mapping, Reservation};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::{Error, from_worker};
use crate::export::{self, Asked, Source};
use crate::lease::Lease;
use crate::model::{Model, runs_of};
use crate::runtime::{OnRuntime, seconds, wait};

/// An attach granted, its arena being mapped. `finish()` gives the `Model`.
#[pyclass(module = "modelshare._native", name = "Attaching", frozen)]
#[derive(Debug)]
pub(crate) struct Attaching {
    /// Taken by `finish`. Dropped on the runtime otherwise: a mapping that ended meanwhile
    /// leaves its `Model` in the task's handle, whose drop releases the lease only there.
    pending: Mutex<Option<OnRuntime<modelshare_worker::Attaching>>>,
    manifest: Arc<pb::Manifest>,
    reservation: Option<Reservation>,
    loading: bool,
    /// What the early views' storage holds from then on, once `finish` has it.
    held: Arc<OnceLock<Held>>,
}

/// What an early view keeps, once mapped: the lease, and the mapping itself. The lease alone
/// would not do: after a reconnection the SDK re-attaches the model to a new mapping, and the
/// old one (these views' memory) would be unmapped with nothing else holding it.
type Held = (Lease, Mapping);

impl Attaching {
    pub(crate) fn new(pending: modelshare_worker::Attaching) -> Self {
        Self {
            manifest: pending.manifest().clone(),
            reservation: pending.reservation().cloned(),
            loading: pending.attached_while_loading(),
            pending: Mutex::new(Some(OnRuntime::new(pending))),
            held: Arc::new(OnceLock::new()),
        }
    }
}

#[pymethods]
impl Attaching {
    /// The address space the arena is being mapped at, as one `uint8` DLPack tensor, when its
    /// views can be made before the mapping ends: a loaded version over CUDA VMM. `None`
    /// otherwise (host memory, legacy IPC, or a version still loading). The views hold the
    /// range reserved and, once `finish` has returned, the lease and the mapping.
    fn arena(&self) -> Option<ReservedArena> {
        let reservation = self.reservation.as_ref().filter(|_| !self.loading)?;
        Some(ReservedArena {
            reservation: reservation.clone(),
            length: self.manifest.arena_bytes,
            held: self.held.clone(),
        })
    }

    /// `Model.runs()` (the plan of the views) over the granted manifest.
    #[pyo3(signature = (names=None))]
    fn runs<'py>(
        &self,
        py: Python<'py>,
        names: Option<Vec<String>>,
    ) -> PyResult<(Vec<Bound<'py, PyTuple>>, Vec<String>)> {
        runs_of(py, &self.manifest, names)
    }

    /// Waits (GIL released) for the mapping, at most `timeout` seconds: the attached `Model`,
    /// or the SDK's error (the lease is then released; views made of `arena()` must then be
    /// dropped, being views of nothing). Once only.
    #[pyo3(signature = (*, timeout=None))]
    fn finish(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Model> {
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .and_then(OnRuntime::take)
            .ok_or_else(|| Error::new_err("this attach was already finished"))?;
        let what = format!("mapping model '{}'", self.manifest.model);
        let model = wait(py, &what, seconds(timeout)?, pending.finish())?
            .map_err(|e| from_worker(py, &e))?;
        let mapping = model.view();
        let lease: Lease = Arc::new(OnRuntime::new(model));
        let _ = self.held.set((lease.clone(), mapping));
        Ok(Model::new(lease))
    }
}

/// The address space an early attach's arena is being mapped at, exported as one `uint8`
/// CUDA tensor of the arena's length.
#[pyclass(module = "modelshare._native", name = "ReservedArena", frozen)]
#[derive(Debug)]
pub(crate) struct ReservedArena {
    reservation: Reservation,
    length: u64,
    held: Arc<OnceLock<Held>>,
}

#[pymethods]
impl ReservedArena {
    /// Length in bytes.
    #[getter]
    fn byte_length(&self) -> u64 {
        self.length
    }

    /// The device address the arena starts at.
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.reservation.device_ptr()
    }

    /// The DLPack device: `(2, ordinal)`.
    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        let d = export::cuda_device(self.reservation.ordinal())?;
        Ok((d.device_type, d.device_id))
    }

    /// A DLPack capsule of the range as `uint8`, read-only; its consumer's tensors keep the
    /// range reserved and, once there are, the lease and the mapping.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let asked = Asked {
            stream,
            max_version,
            dl_device,
            copy,
        };
        let owner = Box::new((self.reservation.clone(), self.held.clone()));
        let part = export::whole_arena(self.length, self.reservation.device_ptr(), owner)?;
        export::capsule(
            py,
            "the arena",
            Source::Reserved(&self.reservation),
            asked,
            part,
        )
    }

    fn __repr__(&self) -> String {
        format!(
            "<modelshare.ReservedArena of {} bytes at {:#x}>",
            self.length,
            self.reservation.device_ptr()
        )
    }
}
