//! The deadline each step of an exchange runs under ([`HANDOFF_TIMEOUT`]), and the errors it
//! turns into [`DeviceError`]s.

use super::HANDOFF_TIMEOUT;
use crate::error::{DeviceError, Result};

/// Runs `fut`, turning an overrun of [`HANDOFF_TIMEOUT`] into an `Io` error of kind
/// `TimedOut` and any `std::io::Error` into an `Io` error named `op`.
pub(super) async fn with_timeout<T, E>(
    op: &'static str,
    fut: impl Future<Output = std::result::Result<T, E>>,
) -> Result<T>
where
    E: Into<IoOrDevice>,
{
    match tokio::time::timeout(HANDOFF_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(match e.into() {
            IoOrDevice::Io(source) => DeviceError::Io { op, source },
            IoOrDevice::Device(e) => e,
        }),
        Err(_) => Err(DeviceError::Io {
            op,
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no progress within {HANDOFF_TIMEOUT:?}"),
            ),
        }),
    }
}

/// The two error types the futures given to [`with_timeout`] return.
pub(super) enum IoOrDevice {
    Io(std::io::Error),
    Device(DeviceError),
}

impl From<std::io::Error> for IoOrDevice {
    fn from(e: std::io::Error) -> Self {
        IoOrDevice::Io(e)
    }
}

impl From<DeviceError> for IoOrDevice {
    fn from(e: DeviceError) -> Self {
        IoOrDevice::Device(e)
    }
}
