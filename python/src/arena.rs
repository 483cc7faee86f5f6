//! `Arena`: a model's whole mapping as one DLPack tensor (`uint8`, the mapping's length), so
//! that `Model.torch()` makes one capsule and views for every tensor instead of one capsule per
//! tensor (a 256-tensor model: one export instead of 256). The views share its storage, and so
//! the lease it holds.

use modelshare_worker::Mapping;
use pyo3::prelude::*;

use crate::export::{self, Asked, Source};
use crate::lease::Lease;

/// A model's whole mapping, exported as one `uint8` tensor. Holds the lease while it (or a
/// consumer's tensor of it) lives.
#[pyclass(module = "modelshare._native", name = "Arena", frozen)]
#[derive(Debug)]
pub(crate) struct Arena {
    mapping: Mapping,
    lease: Lease,
}

impl Arena {
    pub(crate) fn new(lease: Lease) -> Self {
        Self {
            mapping: lease.view(),
            lease,
        }
    }

    /// The address of the mapping's first byte in this process (host or device memory).
    fn address(&self) -> u64 {
        match self.mapping.device_ptr() {
            Some(ptr) => ptr,
            None => self
                .mapping
                .host_bytes()
                .map_or(0, |bytes| bytes.as_ptr() as u64),
        }
    }
}

#[pymethods]
impl Arena {
    /// Length in bytes (the tensors' offsets count from its start).
    #[getter]
    fn byte_length(&self) -> u64 {
        self.mapping.len()
    }

    /// The address of the first byte in this process: host memory, or on the device.
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.address()
    }

    /// Whether every byte has landed: host memory always; device memory once the version's
    /// load has (a version attached while loading is not, until then). A ready arena's export
    /// needs no consumer stream to order after the load.
    #[getter]
    fn ready(&self) -> PyResult<bool> {
        self.mapping
            .is_ready()
            .map_err(|e| crate::errors::DeviceError::new_err(e.to_string()))
    }

    /// The DLPack device: `(1, 0)` for the CPU (host memory), `(2, ordinal)` for CUDA.
    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        let d = export::dl_device(&self.mapping, "the arena")?;
        Ok((d.device_type, d.device_id))
    }

    /// A DLPack capsule of the whole mapping as `uint8`, with no copy, flagged read-only where
    /// the mapping is (DLPack 1.x consumers). A version attached while loading is ordered after
    /// its load as for a tensor (the consumer's stream waits on the device).
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
        let owner = Box::new((self.mapping.clone(), self.lease.clone()));
        let part = export::whole_arena(self.mapping.len(), self.address(), owner)?;
        export::capsule(py, "the arena", Source::Mapped(&self.mapping), asked, part)
    }

    fn __repr__(&self) -> String {
        format!(
            "<modelshare.Arena of {} bytes{}>",
            self.mapping.len(),
            if self.mapping.is_on_device() {
                " on the device"
            } else {
                ""
            }
        )
    }
}
