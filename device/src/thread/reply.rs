//! [`Reply`]: the answer of a device-thread job, awaited or waited for.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::error::{DeviceError, Result};

/// The answer of a device-thread job: `.await` it, or [`wait`](Reply::wait) for it on a
/// thread that may block. If the device thread has stopped, the answer is
/// [`DeviceError::ThreadGone`].
#[must_use = "a reply does nothing unless awaited or waited for"]
#[derive(Debug)]
pub struct Reply<T>(pub(super) oneshot::Receiver<Result<T>>);

impl<T> Reply<T> {
    /// A reply that is already there.
    pub(super) fn ready(value: Result<T>) -> Self {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(value);
        Reply(rx)
    }

    /// Blocks the calling thread until the answer comes. Not for async tasks (`.await` it).
    pub fn wait(self) -> Result<T> {
        self.0
            .blocking_recv()
            .unwrap_or(Err(DeviceError::ThreadGone))
    }
}

impl<T> Future for Reply<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(DeviceError::ThreadGone)))
    }
}
