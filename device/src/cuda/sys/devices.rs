//! The driver's libraries and devices: whether `libcuda.so` and `libnvrtc.so` load, `cuInit`,
//! the number of devices and their UUIDs.

use cudarc::driver::{result, sys};

use super::common::driver;
use crate::error::{DeviceError, Result};

/// Whether the CUDA driver library (`libcuda.so`) can be loaded. Must be checked before any
/// other call here: cudarc panics when the library is missing.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library with dlopen; no symbol is called.
    unsafe { sys::is_culib_present() }
}

/// Whether NVRTC (`libnvrtc.so`) can be loaded; checked before compiling (cudarc panics when
/// the library is missing).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library with dlopen; no symbol is called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// `cuInit`.
pub fn init() -> Result<()> {
    result::init().map_err(driver("cuInit"))
}

/// Number of devices.
pub fn device_count() -> Result<usize> {
    let n = result::device::get_count().map_err(driver("cuDeviceGetCount"))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The device's UUID in nvidia-smi's form: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn device_uuid(ordinal: usize) -> Result<String> {
    let ord = i32::try_from(ordinal).map_err(|_| DeviceError::NoSuchDevice {
        device: ordinal.to_string(),
        reason: "ordinal out of range".into(),
    })?;
    let dev = result::device::get(ord).map_err(driver("cuDeviceGet"))?;
    let uuid = result::device::get_uuid(dev).map_err(driver("cuDeviceGetUuid"))?;
    let b: Vec<u8> = uuid.bytes.iter().map(|c| *c as u8).collect();
    let hex = |r: std::ops::Range<usize>| -> String {
        b.get(r)
            .unwrap_or(&[])
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect()
    };
    Ok(format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    ))
}
