//! DLPack: the C structures of `dlpack.h` (v1.1 layout; the legacy `DLManagedTensor` and the
//! versioned `DLManagedTensorVersioned`) and the capsule a tensor is handed out in. The one
//! place of the crate with `unsafe`: building the capsule over a raw allocation and the two C
//! callbacks (the capsule's destructor and the managed tensor's deleter).
//!
//! Ownership follows the DLPack protocol: [`capsule`] boxes a managed tensor whose context
//! owns its shape, strides and an owner value (the tensor and the model's lease), and wraps it
//! in a capsule named `dltensor` (`dltensor_versioned`). A consumer takes the pointer, renames
//! the capsule `used_dltensor` (`used_dltensor_versioned`) and calls the deleter when it is done
//! with the memory; a capsule dropped without a consumer calls the deleter itself. The deleter
//! frees the box, and with it the owner: the last one releases the lease. It may run on any
//! thread, with or without the GIL: it touches no Python object.

use std::ffi::{CStr, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;

use pyo3::ffi;
use pyo3::prelude::*;

use crate::errors::DtypeError;
use modelshare_device::ForeignStream;

/// Name of an unconsumed legacy capsule.
const LEGACY: &CStr = c"dltensor";
/// Name of an unconsumed versioned capsule.
const VERSIONED: &CStr = c"dltensor_versioned";
/// The DLPack version of these structures.
const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 1 };
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;

/// `DLDevice`: a device type (`kDLCPU` 1, `kDLCUDA` 2) and its index.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DLDevice {
    pub(crate) device_type: i32,
    pub(crate) device_id: i32,
}

/// `DLDataType`: a type code, its width in bits, and lanes (1).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DLDataType {
    pub(crate) code: u8,
    pub(crate) bits: u8,
    pub(crate) lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[derive(Debug)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor` (the legacy, unversioned form).
#[repr(C)]
#[derive(Debug)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensorVersioned`.
#[repr(C)]
#[derive(Debug)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// What the managed tensor points into and keeps alive. `Vec`s, not boxes: moving a `Vec`
/// leaves pointers into its heap buffer valid.
struct Context {
    shape: Vec<i64>,
    strides: Vec<i64>,
    _owner: Box<dyn Send>,
}

/// A legacy managed tensor and its context in one allocation; the managed tensor first, so a
/// pointer to it is a pointer to the whole.
#[repr(C)]
struct LegacyBox {
    managed: DLManagedTensor,
    context: Context,
}

/// A versioned managed tensor and its context in one allocation (as [`LegacyBox`]).
#[repr(C)]
struct VersionedBox {
    managed: DLManagedTensorVersioned,
    context: Context,
}

/// A tensor to export.
pub(crate) struct Export {
    /// Address of the first element in this process (host or device); 0 for an empty tensor.
    pub(crate) address: u64,
    pub(crate) device: DLDevice,
    pub(crate) dtype: DLDataType,
    pub(crate) shape: Vec<i64>,
    /// Whether writes through the memory are impossible (flagged in a versioned tensor).
    pub(crate) read_only: bool,
    /// Kept alive until the consumer is done (the tensor and the model's lease).
    pub(crate) owner: Box<dyn Send>,
}

/// Row-major strides, in elements, of `shape`.
fn row_major(shape: &[i64]) -> Option<Vec<i64>> {
    let mut strides = vec![0i64; shape.len()];
    let mut step: i64 = 1;
    for (stride, &dim) in strides.iter_mut().zip(shape).rev() {
        *stride = step;
        step = step.checked_mul(dim.max(1))?;
    }
    Some(strides)
}

/// The tensor `export` describes as a DLPack capsule: versioned (`dltensor_versioned`) or
/// legacy (`dltensor`).
pub(crate) fn capsule(
    py: Python<'_>,
    export: Export,
    versioned: bool,
) -> PyResult<Bound<'_, PyAny>> {
    let ndim = i32::try_from(export.shape.len())
        .map_err(|_| DtypeError::new_err("too many dimensions for DLPack"))?;
    let strides = row_major(&export.shape)
        .ok_or_else(|| DtypeError::new_err("the tensor's element count overflows i64"))?;
    let mut context = Context {
        shape: export.shape,
        strides,
        _owner: export.owner,
    };
    let (shape, strides) = if ndim == 0 {
        (ptr::null_mut(), ptr::null_mut())
    } else {
        (context.shape.as_mut_ptr(), context.strides.as_mut_ptr())
    };
    let dl_tensor = DLTensor {
        data: ptr::with_exposed_provenance_mut(export.address as usize),
        device: export.device,
        ndim,
        dtype: export.dtype,
        shape,
        strides,
        byte_offset: 0,
    };
    if versioned {
        let raw = Box::into_raw(Box::new(VersionedBox {
            managed: DLManagedTensorVersioned {
                version: VERSION,
                manager_ctx: ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags: if export.read_only { FLAG_READ_ONLY } else { 0 },
                dl_tensor,
            },
            context,
        }));
        // SAFETY: `raw` is a live allocation that the capsule takes over: from here on it is
        // freed only by `delete_versioned`, called by the consumer or by `destroy_versioned`
        // (the capsule's destructor) when no consumer took it; the name is a static string.
        let made =
            unsafe { ffi::PyCapsule_New(raw.cast(), VERSIONED.as_ptr(), Some(destroy_versioned)) };
        if made.is_null() {
            // SAFETY: no capsule was made, so `raw` is still only ours: freed once, here.
            drop(unsafe { Box::from_raw(raw) });
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `made` is a new, non-null reference returned by PyCapsule_New.
        Ok(unsafe { Bound::from_owned_ptr(py, made) })
    } else {
        let raw = Box::into_raw(Box::new(LegacyBox {
            managed: DLManagedTensor {
                dl_tensor,
                manager_ctx: ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            context,
        }));
        // SAFETY: as above, for the legacy box, `delete_legacy` and `destroy_legacy`.
        let made = unsafe { ffi::PyCapsule_New(raw.cast(), LEGACY.as_ptr(), Some(destroy_legacy)) };
        if made.is_null() {
            // SAFETY: no capsule was made, so `raw` is still only ours: freed once, here.
            drop(unsafe { Box::from_raw(raw) });
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `made` is a new, non-null reference returned by PyCapsule_New.
        Ok(unsafe { Bound::from_owned_ptr(py, made) })
    }
}

/// Frees a [`LegacyBox`]: the managed tensor's deleter, called once by its owner.
///
/// # Safety
/// `managed` is null or a pointer made by [`capsule`] for a legacy tensor, not freed yet.
unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: per the contract, `managed` is the first field of a `LegacyBox` (repr(C)) that
    // `Box::into_raw` made, and the protocol calls the deleter once.
    let boxed = unsafe { Box::from_raw(managed.cast::<LegacyBox>()) };
    // Dropping the owner releases the lease (spawned on the runtime); a panic must not cross
    // into C.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(boxed)));
}

/// Frees a [`VersionedBox`]: the managed tensor's deleter, called once by its owner.
///
/// # Safety
/// `managed` is null or a pointer made by [`capsule`] for a versioned tensor, not freed yet.
unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: as in `delete_legacy`, for a `VersionedBox`.
    let boxed = unsafe { Box::from_raw(managed.cast::<VersionedBox>()) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(boxed)));
}

/// The legacy capsule's destructor: frees the tensor unless a consumer took it (and renamed
/// the capsule `used_dltensor`, becoming the one to call the deleter).
///
/// # Safety
/// Called by Python with the capsule being destroyed.
unsafe extern "C" fn destroy_legacy(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is a live capsule (Python is destroying it). PyCapsule_IsValid sets no
    // exception; on a capsule still named `dltensor`, PyCapsule_GetPointer returns the pointer
    // `capsule()` stored, which nobody else owns, so calling its deleter here frees it once.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let managed =
                ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr()).cast::<DLManagedTensor>();
            delete_legacy(managed);
        }
    }
}

/// The versioned capsule's destructor (see [`destroy_legacy`]).
///
/// # Safety
/// Called by Python with the capsule being destroyed.
unsafe extern "C" fn destroy_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `destroy_legacy`, for a capsule named `dltensor_versioned`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            delete_versioned(managed);
        }
    }
}

/// The consumer's stream of a `__dlpack__(stream=...)` call on CUDA memory, as the DLPack
/// protocol passes it: `None` or -1, no stream (the producer synchronises on the host, or not at
/// all); 1, the legacy default stream; 2, the per-thread default stream; any other integer, a
/// `cudaStream_t` of the consumer's current device (0, which the protocol forbids as ambiguous,
/// is taken as the legacy default, as CUDA reads it).
pub(crate) fn consumer_stream(
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<ForeignStream>> {
    let Some(stream) = stream.filter(|s| !s.is_none()) else {
        return Ok(None);
    };
    let raw: i64 = stream.extract().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err("stream must be an integer (a CUDA stream handle)")
    })?;
    let raw = match raw {
        -1 => return Ok(None),
        0 => 1,
        raw => usize::try_from(raw).map_err(|_| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "stream {raw} is no CUDA stream handle"
            ))
        })?,
    };
    // SAFETY: the DLPack protocol has the consumer pass a stream of its current device that
    // lives through this call, in which the stream is only made to wait on the ready event
    // (torch passes its current stream, of the device's primary context, where the arena is
    // mapped).
    Ok(Some(unsafe { ForeignStream::from_raw(raw) }))
}
