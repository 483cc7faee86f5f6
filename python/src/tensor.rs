//! `Tensor`: one tensor of an attached model, as numpy and DLPack consumers take it.
//!
//! numpy: `__array_interface__` describes the tensor's bytes in the mapping as a read-only
//! array of `uint8` (the Python side views it as the tensor's dtype and shape): numpy keeps the
//! `Tensor` as the array's base, so the array holds the lease. No buffer protocol is needed
//! (it is not in the limited API before Python 3.11).
//!
//! DLPack: `__dlpack__` hands out a capsule (see `dlpack`) whose managed tensor owns a clone of
//! the tensor and of the lease, released by the consumer's call to its deleter.

use modelshare_proto::v1::DType;
use modelshare_worker::Mapping;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::dlpack::{DLDataType, DLDevice};
use crate::errors::{DeviceError, DtypeError, from_worker};
use crate::export::{self, Asked, Part, Source};
use crate::lease::Lease;

/// The safetensors name of a dtype (`"F32"`, `"BF16"`, `"F8_E4M3"`, ...).
pub(crate) fn dtype_name(dtype: DType) -> &'static str {
    let name = dtype.as_str_name();
    name.strip_prefix("DTYPE_").unwrap_or(name)
}

/// The bytes of one element of `dtype` (`None` for `BYTES` and unspecified).
pub(crate) fn element_bytes(dtype: DType) -> Option<u64> {
    dl_dtype(dtype).map(|t| u64::from(t.bits) / 8)
}

/// DLPack's type of a dtype: its code (`kDLInt` 0, `kDLUInt` 1, `kDLFloat` 2, `kDLBfloat` 4,
/// `kDLComplex` 5, `kDLBool` 6, the float8 codes of DLPack 1.1) and bits.
fn dl_dtype(dtype: DType) -> Option<DLDataType> {
    use DType as D;
    let (code, bits) = match dtype {
        D::DtypeBool => (6, 8),
        D::DtypeU8 => (1, 8),
        D::DtypeI8 => (0, 8),
        D::DtypeI16 => (0, 16),
        D::DtypeU16 => (1, 16),
        D::DtypeF16 => (2, 16),
        D::DtypeBf16 => (4, 16),
        D::DtypeI32 => (0, 32),
        D::DtypeU32 => (1, 32),
        D::DtypeF32 => (2, 32),
        D::DtypeF64 => (2, 64),
        D::DtypeI64 => (0, 64),
        D::DtypeU64 => (1, 64),
        D::DtypeC64 => (5, 64),
        // safetensors' F8_E4M3 is the "fn" variant (no infinities), as torch.float8_e4m3fn.
        D::DtypeF8E4m3 => (10, 8),
        D::DtypeF8E5m2 => (12, 8),
        D::DtypeF8E8m0 => (14, 8),
        D::DtypeBytes | D::DtypeUnspecified => return None,
    };
    Some(DLDataType {
        code,
        bits,
        lanes: 1,
    })
}

/// One tensor of an attached model: its name, dtype and shape, and its bytes in the shared
/// mapping. Holds the model's lease while it lives.
#[pyclass(module = "modelshare._native", name = "Tensor", frozen)]
#[derive(Debug)]
pub(crate) struct Tensor {
    tensor: modelshare_worker::Tensor,
    /// The mapping the model had when the tensor was taken (the tensor's own, unless the
    /// session re-attached in between): its device and readiness.
    mapping: Mapping,
    lease: Lease,
}

impl Tensor {
    pub(crate) fn new(tensor: modelshare_worker::Tensor, lease: Lease) -> Self {
        Self {
            mapping: lease.view(),
            tensor,
            lease,
        }
    }

    /// Where the tensor's first byte is in this process: a host address, or a device address
    /// on the CUDA backend.
    fn address(&self) -> u64 {
        match self.tensor.device_ptr() {
            Some(ptr) => ptr,
            None => self.tensor.bytes().as_ptr() as u64,
        }
    }

    /// The DLPack device of the tensor's mapping.
    fn dl_device(&self) -> PyResult<DLDevice> {
        export::dl_device(&self.mapping, &format!("tensor '{}'", self.tensor.name()))
    }
}

#[pymethods]
impl Tensor {
    /// Name as in the weight file.
    #[getter]
    fn name(&self) -> &str {
        self.tensor.name()
    }

    /// The safetensors name of the dtype: `"F32"`, `"F16"`, `"BF16"`, `"I64"`, `"BOOL"`, ...
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.tensor.dtype())
    }

    /// Dimensions, outermost first (`()` for a scalar).
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.tensor.shape())
    }

    /// Byte offset inside the arena.
    #[getter]
    fn offset(&self) -> u64 {
        self.tensor.offset()
    }

    /// Length in bytes.
    #[getter]
    fn byte_length(&self) -> u64 {
        self.tensor.byte_length()
    }

    /// Whether the tensor is in device (CUDA) memory.
    #[getter]
    fn on_device(&self) -> bool {
        self.tensor.is_on_device()
    }

    /// Whether the mapping is read-only in this process (see `Model.read_only`).
    #[getter]
    fn read_only(&self) -> bool {
        self.mapping.read_only()
    }

    /// The address of the first byte in this process: in host memory, or on the device.
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.address()
    }

    /// The numpy array interface (version 3) of the tensor's bytes: a read-only `uint8` array
    /// of `byte_length` elements over the shared mapping (host memory only).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.tensor.is_on_device() {
            return Err(DeviceError::new_err(format!(
                "tensor '{}' is in device memory: read it with torch() (DLPack) or to_bytes() (a copy)",
                self.tensor.name()
            )));
        }
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.tensor.bytes().len(),))?;
        d.set_item("typestr", "|u1")?;
        // (address, read-only): numpy makes the array non-writeable, and refuses to make it
        // writeable again (its base exposes no writable buffer).
        d.set_item("data", (self.address(), true))?;
        d.set_item("strides", py.None())?;
        Ok(d)
    }

    /// A copy of the tensor's bytes (device memory is copied to the host, after the load).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        if !self.tensor.is_on_device() {
            return Ok(PyBytes::new(py, self.tensor.bytes()));
        }
        let tensor = self.tensor.clone();
        let copied = py.detach(move || tensor.to_host());
        copied
            .map(|bytes| PyBytes::new(py, &bytes))
            .map_err(|e| from_worker(py, &e))
    }

    /// Whether the bytes hash to the manifest's checksum (GIL released while hashing).
    fn verify(&self, py: Python<'_>) -> bool {
        let tensor = self.tensor.clone();
        py.detach(move || tensor.verify())
    }

    /// The DLPack device: `(1, 0)` for the CPU (host memory), `(2, ordinal)` for CUDA.
    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        let d = self.dl_device()?;
        Ok((d.device_type, d.device_id))
    }

    /// A DLPack capsule of the tensor, with no copy. A consumer asking for DLPack 1.x gets a
    /// versioned tensor, flagged read-only where the mapping is; older ones get the legacy
    /// `dltensor`. On CUDA, a version attached while loading is ordered after its load: the
    /// consumer's `stream` waits on the device for the ready event (the call returns at once),
    /// or, without a stream, this thread waits until the load has landed.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dtype = dl_dtype(self.tensor.dtype()).ok_or_else(|| {
            DtypeError::new_err(format!(
                "tensor '{}' has dtype {}, which DLPack cannot describe",
                self.tensor.name(),
                self.dtype()
            ))
        })?;
        let shape = self
            .tensor
            .shape()
            .iter()
            .map(|&d| i64::try_from(d))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| DtypeError::new_err("a dimension past i64"))?;
        let asked = Asked {
            stream,
            max_version,
            dl_device,
            copy,
        };
        let part = Part {
            address: if self.tensor.byte_length() == 0 {
                0
            } else {
                self.address()
            },
            dtype,
            shape,
            owner: Box::new((self.tensor.clone(), self.lease.clone())),
        };
        let what = format!("tensor '{}'", self.tensor.name());
        export::capsule(py, &what, Source::Mapped(&self.mapping), asked, part)
    }

    fn __repr__(&self) -> String {
        format!(
            "<modelshare.Tensor {:?} {} {:?}>",
            self.tensor.name(),
            self.dtype(),
            self.tensor.shape()
        )
    }
}
