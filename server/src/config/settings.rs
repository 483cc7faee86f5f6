//! Values of settings that both the flags and the file give, with their parsing: the backend,
//! start-up models, TLS, the Unix sockets' mode.

use std::path::PathBuf;
use std::str::FromStr;

use serde::Deserialize;

pub use modelshare_core::devices::settings::{BackendChoice, CudaHandles, DeviceSelection};
pub use modelshare_core::tenants::policy::ShareIdentical;

/// `devices` in the file: `"all"`, `"0,1"`, or a list (`["0", "GPU-…"]`, integers allowed).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub(super) enum FileDevices {
    One(String),
    Ordinal(u32),
    Many(Vec<FileDevice>),
}

/// One entry of a `devices` list in the file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub(super) enum FileDevice {
    Name(String),
    Ordinal(u32),
}

impl FileDevices {
    pub(super) fn selection(self) -> Result<DeviceSelection, String> {
        match self {
            FileDevices::One(s) => s.parse(),
            FileDevices::Ordinal(n) => DeviceSelection::list(vec![n.to_string()]),
            FileDevices::Many(items) => DeviceSelection::list(
                items
                    .into_iter()
                    .map(|d| match d {
                        FileDevice::Name(s) => s,
                        FileDevice::Ordinal(n) => n.to_string(),
                    })
                    .collect(),
            ),
        }
    }
}

/// A model loaded at start-up: `NAME=PATH` on the command line; in the file also its owner
/// and access.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartupModel {
    /// Model name.
    pub name: String,
    /// Path under the model root.
    pub path: String,
    /// Tenant that owns it (none: the admin).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Tenants it is shared with.
    #[serde(default)]
    pub share_with: Vec<String>,
    /// Visible to every tenant.
    #[serde(default)]
    pub public: bool,
    /// Devices to place it on (UUIDs, indexes in the server's list, or `["all"]`); empty: the
    /// server picks.
    #[serde(default)]
    pub devices: Vec<String>,
    /// Replicas on the least-used devices, when `devices` is empty (default 1).
    #[serde(default)]
    pub replicas: u32,
}

/// Whether the TLS listener asks for client certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// A client certificate signed by the client CA is required.
    #[default]
    Required,
    /// A client certificate is checked when given, but not required.
    Optional,
}

/// TLS of the TCP listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// Server certificate chain (PEM).
    pub cert: PathBuf,
    /// Server private key (PEM).
    pub key: PathBuf,
    /// CA that signs client certificates (PEM); none: no client certificates.
    pub client_ca: Option<PathBuf>,
    /// Whether a client certificate is required (with `client_ca`).
    pub client_auth: ClientAuth,
}

impl FromStr for StartupModel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, path) = s
            .split_once('=')
            .ok_or_else(|| format!("expected NAME=PATH, got '{s}'"))?;
        if name.is_empty() || path.is_empty() {
            return Err(format!("expected NAME=PATH, got '{s}'"));
        }
        Ok(Self {
            name: name.to_owned(),
            path: path.to_owned(),
            tenant: None,
            share_with: Vec::new(),
            public: false,
            devices: Vec::new(),
            replicas: 0,
        })
    }
}

/// Parses an octal file mode such as `0660`.
pub(super) fn parse_mode(s: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("'{s}' is not an octal mode such as 0660"))?;
    if mode > 0o777 {
        return Err(format!("'{s}' is more than 0777"));
    }
    Ok(mode)
}
