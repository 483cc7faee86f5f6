//! What every DLPack export of the crate shares (a tensor's, the whole arena's): the DLPack
//! device of a mapping, waiting for a version attached while loading, and the checks of a
//! consumer's request (`dl_device`, `copy`).

use std::time::Duration;

use modelshare_device::ForeignStream;
use modelshare_worker::Mapping;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

use crate::dlpack::DLDevice;
use crate::errors::DeviceError;

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
pub(crate) fn wait_loaded(
    py: Python<'_>,
    mapping: &Mapping,
    stream: Option<ForeignStream>,
) -> PyResult<()> {
    if !mapping.is_on_device() {
        return Ok(());
    }
    if let Some(stream) = stream {
        return mapping
            .wait_ready_foreign(stream)
            .map_err(|e| DeviceError::new_err(e.to_string()));
    }
    loop {
        match mapping.is_ready() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(DeviceError::new_err(e.to_string())),
        }
        py.detach(|| std::thread::sleep(READY_POLL));
        py.check_signals()?;
    }
}

/// Refuses what a consumer asks and modelshare does not do: another device (no copy across
/// devices), or a copy.
pub(crate) fn check_request(
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
