//! What every DLPack export of the crate shares (a tensor's, the whole arena's): [`capsule`],
//! which takes a `__dlpack__` call's arguments ([`Asked`]) and the part of a mapping to hand out
//! ([`Part`]): the DLPack device of the mapping, the checks of the consumer's request
//! (`dl_device`, `copy`), the ordering after a version attached while loading, the capsule.

use std::time::Duration;

use modelshare_device::ForeignStream;
use modelshare_worker::{Mapping, Reservation};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

use crate::dlpack::{self, DLDataType, DLDevice, Export};
use crate::errors::DeviceError;

/// The keyword arguments of a `__dlpack__` call.
pub(crate) struct Asked<'py> {
    pub(crate) stream: Option<Bound<'py, PyAny>>,
    pub(crate) max_version: Option<(u32, u32)>,
    pub(crate) dl_device: Option<(i32, i32)>,
    pub(crate) copy: Option<bool>,
}

/// What is handed out of a mapping: the address of its first byte (0 when it has none), its
/// DLPack type and shape, and what the consumer's tensor keeps alive (the lease among it).
pub(crate) struct Part {
    pub(crate) address: u64,
    pub(crate) dtype: DLDataType,
    pub(crate) shape: Vec<i64>,
    pub(crate) owner: Box<dyn Send>,
}

/// What a capsule hands out part of: a mapping, or the address space reserved for an arena
/// still being mapped (an early attach of a loaded version over CUDA VMM: read-only, and
/// nothing to order after).
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    Mapped(&'a Mapping),
    Reserved(&'a Reservation),
}

/// DLPack's `uint8`: `kDLUInt`, 8 bits.
const U8: DLDataType = DLDataType {
    code: 1,
    bits: 8,
    lanes: 1,
};

/// A whole arena of `len` bytes at `address` as one `uint8` part, `owner` kept alive by the
/// consumer's tensor (the arena's address is 0 when it has no bytes).
pub(crate) fn whole_arena(len: u64, address: u64, owner: Box<dyn Send>) -> PyResult<Part> {
    let length = i64::try_from(len)
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("an arena past i64"))?;
    Ok(Part {
        address: if length == 0 { 0 } else { address },
        dtype: U8,
        shape: vec![length],
        owner,
    })
}

/// A DLPack capsule of `part` of `source` (`what` names it in errors), with no copy: a
/// consumer asking for DLPack 1.x gets a versioned tensor, flagged read-only where the mapping
/// is; older ones get the legacy `dltensor`. A version attached while loading is ordered after
/// its load first ([`wait_loaded`]).
pub(crate) fn capsule<'py>(
    py: Python<'py>,
    what: &str,
    source: Source<'_>,
    asked: Asked<'py>,
    part: Part,
) -> PyResult<Bound<'py, PyAny>> {
    let (device, read_only) = match source {
        Source::Mapped(mapping) => (dl_device(mapping, what)?, mapping.read_only()),
        Source::Reserved(reserved) => (cuda_device(reserved.ordinal())?, true),
    };
    check_request(what, device, asked.dl_device, asked.copy)?;
    let stream = dlpack::consumer_stream(asked.stream.as_ref())?;
    if let Source::Mapped(mapping) = source {
        wait_loaded(py, mapping, stream)?;
    }
    let export = Export {
        address: part.address,
        device,
        dtype: part.dtype,
        shape: part.shape,
        read_only,
        owner: part.owner,
    };
    let versioned = asked.max_version.is_some_and(|(major, _)| major >= 1);
    dlpack::capsule(py, export, versioned)
}

/// DLPack's device type codes.
const DL_CPU: i32 = 1;
const DL_CUDA: i32 = 2;

/// How often an export looks at a loading version's ready event.
const READY_POLL: Duration = Duration::from_millis(2);

/// The DLPack device of `mapping`: the CPU, or the CUDA device (this process's ordinal) of the
/// arena. `what` names the export in errors.
pub(crate) fn dl_device(mapping: &Mapping, what: &str) -> PyResult<DLDevice> {
    if !mapping.is_on_device() {
        return Ok(DLDevice {
            device_type: DL_CPU,
            device_id: 0,
        });
    }
    let ordinal = mapping.context().map(|ctx| ctx.ordinal()).ok_or_else(|| {
        DeviceError::new_err(format!("{what} is in device memory without a CUDA context"))
    })?;
    cuda_device(ordinal)
}

/// The DLPack device of CUDA device `ordinal` (this process's).
pub(crate) fn cuda_device(ordinal: usize) -> PyResult<DLDevice> {
    Ok(DLDevice {
        device_type: DL_CUDA,
        device_id: i32::try_from(ordinal)
            .map_err(|_| DeviceError::new_err(format!("CUDA device ordinal {ordinal}")))?,
    })
}

/// Orders the consumer's use of a version attached while loading after the load: with the
/// consumer's `stream`, that stream waits on the device for the ready event (no host round
/// trip: the export returns at once); without one, this thread waits (GIL released) until the
/// load has landed. CUDA only; host arenas are always ready.
fn wait_loaded(py: Python<'_>, mapping: &Mapping, stream: Option<ForeignStream>) -> PyResult<()> {
    if !mapping.is_on_device() {
        return Ok(());
    }
    let ready = || {
        mapping
            .is_ready()
            .map_err(|e| DeviceError::new_err(e.to_string()))
    };
    // A version loaded before the attach (the usual case) needs no ordering: one query of its
    // event costs less than making the consumer's stream wait on it.
    if ready()? {
        return Ok(());
    }
    if let Some(stream) = stream {
        return mapping
            .wait_ready_foreign(stream)
            .map_err(|e| DeviceError::new_err(e.to_string()));
    }
    loop {
        py.detach(|| std::thread::sleep(READY_POLL));
        py.check_signals()?;
        if ready()? {
            return Ok(());
        }
    }
}

/// Refuses what a consumer asks and modelshare does not do: another device (no copy across
/// devices), or a copy.
fn check_request(
    what: &str,
    device: DLDevice,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<()> {
    if let Some((kind, id)) = dl_device
        && (kind, id) != (device.device_type, device.device_id)
    {
        return Err(PyBufferError::new_err(format!(
            "{what} is on DLPack device ({}, {}), not ({kind}, {id}): modelshare does not copy",
            device.device_type, device.device_id
        )));
    }
    if copy == Some(true) {
        return Err(PyBufferError::new_err(
            "modelshare tensors are shared, never copied on export: copy in the consumer",
        ));
    }
    Ok(())
}
