//! The driver, devices and contexts: finding a device by ordinal or UUID, and the one primary
//! context per device that everything in a process shares.

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

use super::sys;
use crate::error::{DeviceError, Result};

/// Checks that the driver library is there, then initialises it.
pub fn init_driver() -> Result<()> {
    if !sys::driver_present() {
        return Err(DeviceError::LibraryMissing {
            library: "libcuda.so (the CUDA driver)".into(),
            hint: "install the NVIDIA driver, or add its directory (e.g. /usr/local/nvidia/lib64) to LD_LIBRARY_PATH".into(),
        });
    }
    sys::init()
}

/// How many CUDA devices this process sees. Fails (naming the library) if the driver is
/// missing. Creates no context, so it is cheap enough to decide `--backend auto`.
pub fn device_count() -> Result<usize> {
    init_driver()?;
    sys::device_count()
}

/// The ordinal of the device with `uuid` (`GPU-…`), as this process numbers devices (which
/// depends on its `CUDA_VISIBLE_DEVICES`).
pub fn ordinal_of(uuid: &str) -> Result<usize> {
    init_driver()?;
    for ordinal in 0..sys::device_count()? {
        if sys::device_uuid(ordinal)?.eq_ignore_ascii_case(uuid) {
            return Ok(ordinal);
        }
    }
    Err(DeviceError::NoSuchDevice {
        device: uuid.to_owned(),
        reason: "no visible device has this UUID (check CUDA_VISIBLE_DEVICES)".into(),
    })
}

/// The ordinal a selector names: an ordinal (`"0"`) or a UUID (`"GPU-…"`).
pub(crate) fn resolve(selector: &str) -> Result<usize> {
    init_driver()?;
    if selector.to_ascii_uppercase().starts_with("GPU-") {
        return ordinal_of(selector);
    }
    let n: usize = selector.parse().map_err(|_| DeviceError::NoSuchDevice {
        device: selector.to_owned(),
        reason: "expected an ordinal (0, 1, ...) or a UUID (GPU-...)".into(),
    })?;
    let count = sys::device_count()?;
    if n >= count {
        return Err(DeviceError::NoSuchDevice {
            device: selector.to_owned(),
            reason: format!("{count} device(s) visible"),
        });
    }
    Ok(n)
}

/// The UUID (nvidia-smi's form, `GPU-…`) of the device this process numbers `ordinal` (its
/// `CUDA_VISIBLE_DEVICES` decides which). Fails, naming the library, without a driver.
pub fn uuid(ordinal: usize) -> Result<String> {
    init_driver()?;
    sys::device_uuid(ordinal)
}

/// The primary context of `ordinal`, shared by everything in this process.
pub fn primary(ordinal: usize) -> Result<Arc<CudaContext>> {
    static CONTEXTS: Mutex<Vec<(usize, Arc<CudaContext>)>> = Mutex::new(Vec::new());
    let mut all = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, c)) = all.iter().find(|(o, _)| *o == ordinal) {
        return Ok(c.clone());
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| DeviceError::NoSuchDevice {
        device: ordinal.to_string(),
        reason: format!("cannot create its context: {e}"),
    })?;
    all.push((ordinal, ctx.clone()));
    Ok(ctx)
}

/// A separate (non-primary) context of `ordinal`, for the gate streams of ready events (see
/// the module docs of [`super::event`]).
pub(crate) fn separate(ordinal: usize) -> Result<Arc<CudaContext>> {
    CudaContext::new_non_primary(ordinal, 0).map_err(|e| DeviceError::Cuda {
        op: "cuCtxCreate",
        source: e,
    })
}
