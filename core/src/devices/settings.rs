//! The settings that pick and open the devices (`--backend`, `--devices`, `--cuda-handles`),
//! with their parsing; the server's configuration carries them.

use std::str::FromStr;

use serde::Deserialize;

/// Which backend allocates arenas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// CUDA when a driver and a device are found at run time, else host.
    #[default]
    Auto,
    /// Shared host memory (memfd).
    Host,
    /// CUDA device memory.
    Cuda,
}

/// How CUDA arenas are shared with workers (`--cuda-handles`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum CudaHandles {
    /// VMM when the device supports file-descriptor handles, else legacy.
    #[default]
    Auto,
    /// VMM file descriptors over the handle socket: workers map arenas read-only.
    Vmm,
    /// Legacy CUDA IPC handles: workers' mappings are writable (for workers that cannot
    /// receive a descriptor).
    Legacy,
}

impl From<CudaHandles> for modelshare_device::cuda::HandleChoice {
    fn from(c: CudaHandles) -> Self {
        match c {
            CudaHandles::Auto => Self::Auto,
            CudaHandles::Vmm => Self::Vmm,
            CudaHandles::Legacy => Self::Legacy,
        }
    }
}

/// Which devices one server serves (`--devices`): every device the driver sees, or a list of
/// ordinals and UUIDs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceSelection {
    /// Every device (the default).
    #[default]
    All,
    /// These devices, each an ordinal (`0`) or a UUID (`GPU-…`), in this order.
    Listed(Vec<String>),
}

impl FromStr for DeviceSelection {
    type Err = String;

    /// `all`, or a comma-separated list of ordinals and UUIDs without repeats.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("all") {
            return Ok(DeviceSelection::All);
        }
        Self::list(s.split(',').map(str::to_owned).collect())
    }
}

impl DeviceSelection {
    /// A list of ordinals and UUIDs: at least one, none empty, none twice.
    pub fn list(items: Vec<String>) -> Result<Self, String> {
        let items: Vec<String> = items.iter().map(|i| i.trim().to_owned()).collect();
        if let [all] = items.as_slice()
            && all.eq_ignore_ascii_case("all")
        {
            return Ok(DeviceSelection::All);
        }
        if items.is_empty() || items.iter().any(String::is_empty) {
            return Err(format!(
                "devices: expected 'all' or a list of ordinals and UUIDs (e.g. '0,1'), got {:?}",
                items.join(",")
            ));
        }
        for (i, item) in items.iter().enumerate() {
            if items[..i].iter().any(|o| o.eq_ignore_ascii_case(item)) {
                return Err(format!("devices: '{item}' is listed twice"));
            }
        }
        Ok(DeviceSelection::Listed(items))
    }
}
