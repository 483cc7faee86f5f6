//! The devices served and how weights are loaded onto them: the backend, the device
//! selection, host memory standing in for devices, each device's byte cap, the load threads
//! and checksums, replication on attach.

use std::path::PathBuf;

use super::args::ServeArgs;
use super::error::ConfigError;
use super::file::FileConfig;
use super::settings::{BackendChoice, CudaHandles, DeviceSelection};

/// The most devices host memory may stand in for (`host_devices`).
pub const MAX_HOST_DEVICES: usize = 16;

/// The devices and loading of the merged configuration.
#[derive(Debug, Clone)]
pub(super) struct DeviceSettings {
    /// Backend choice.
    pub(super) backend: BackendChoice,
    /// How CUDA arenas are shared with workers.
    pub(super) cuda_handles: CudaHandles,
    /// The devices served.
    pub(super) devices: DeviceSelection,
    /// Most arena bytes on one device.
    pub(super) max_device_bytes: Option<u64>,
    /// Host memory standing in for this many devices (host backend).
    pub(super) host_devices: usize,
    /// The root host memory figures are read under.
    pub(super) proc_root: PathBuf,
    /// Threads per load.
    pub(super) load_threads: usize,
    /// Hash every loaded byte on the CPU even where the device checksums.
    pub(super) load_cpu_hash: bool,
    /// A worker attaching from a device without a copy of the version starts one there.
    pub(super) replicate_on_attach: bool,
    /// Which loads of bytes already held share that memory.
    pub(super) share_identical: super::settings::ShareIdentical,
}

impl DeviceSettings {
    /// Merges the flags over the file over the defaults, checking (in this order) the byte
    /// cap, the device selection, the host devices and the load threads.
    pub(super) fn merge(args: &ServeArgs, file: &FileConfig) -> Result<Self, ConfigError> {
        let max_device_bytes = match args.max_device_bytes.or(file.limits.max_device_bytes) {
            Some(0) => {
                return Err(ConfigError::Invalid(
                    "max_device_bytes must be at least 1".into(),
                ));
            }
            other => other,
        };
        Ok(Self {
            backend: args.backend.or(file.backend).unwrap_or_default(),
            cuda_handles: args.cuda_handles.or(file.cuda_handles).unwrap_or_default(),
            devices: selection(args, file)?,
            max_device_bytes,
            host_devices: match args.host_devices.or(file.host_devices) {
                Some(n @ 1..=MAX_HOST_DEVICES) => n,
                Some(n) => {
                    return Err(ConfigError::Invalid(format!(
                        "host_devices must be 1 to {MAX_HOST_DEVICES}, got {n}"
                    )));
                }
                None => 1,
            },
            proc_root: args
                .proc_root
                .clone()
                .or(file.proc_root.clone())
                .unwrap_or_else(|| PathBuf::from("/")),
            load_cpu_hash: args.load_cpu_hash.or(file.load_cpu_hash).unwrap_or(false),
            share_identical: args
                .share_identical
                .or(file.share_identical)
                .unwrap_or_default(),
            replicate_on_attach: args
                .replicate_on_attach
                .or(file.replicate_on_attach)
                .unwrap_or(false),
            load_threads: match args.load_threads.or(file.load_threads) {
                Some(0) => {
                    return Err(ConfigError::Invalid(
                        "load_threads must be at least 1".into(),
                    ));
                }
                Some(n) => n,
                None => modelshare_core::loader::default_threads(),
            },
        })
    }
}

/// The devices served: the flag's, else the file's `devices` or its old name `device` (not
/// both), else all.
fn selection(args: &ServeArgs, file: &FileConfig) -> Result<DeviceSelection, ConfigError> {
    Ok(match (&args.devices, &file.devices, &file.device) {
        (Some(flag), _, _) => flag.parse().map_err(ConfigError::Invalid)?,
        (None, Some(_), Some(_)) => {
            return Err(ConfigError::Invalid(
                "give `devices` or its old name `device`, not both".into(),
            ));
        }
        (None, Some(listed), None) => listed.clone().selection().map_err(ConfigError::Invalid)?,
        (None, None, Some(one)) => one.parse().map_err(ConfigError::Invalid)?,
        (None, None, None) => DeviceSelection::All,
    })
}
