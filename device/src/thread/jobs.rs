//! How work reaches a device thread: the [`DeviceCtx`] a job gets (the backend, and the
//! watches polled between jobs), and the [`Executor`] that queues jobs, hands values over and
//! makes calls whose answer comes back as a [`Reply`].

use std::fmt;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::{Backend, DeviceCtx, Executor, Msg, Reply};
use crate::error::Result;

impl fmt::Debug for DeviceCtx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceCtx")
            .field("backend", &self.backend)
            .field("watches", &self.watches.len())
            .finish()
    }
}

impl DeviceCtx {
    /// The backend this thread owns.
    pub fn backend(&mut self) -> &mut dyn Backend {
        self.backend.as_mut()
    }

    /// Registers a non-blocking check, polled between jobs until it returns true.
    pub(crate) fn watch(&mut self, check: Box<dyn FnMut() -> bool>) {
        self.watches.push(check);
    }

    pub(super) fn poll_watches(&mut self) {
        self.watches.retain_mut(|check| !check());
    }
}

impl fmt::Debug for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executor")
            .field("thread", &self.thread)
            .finish()
    }
}

impl Executor {
    /// Whether the calling thread is this device thread.
    pub(crate) fn is_current(&self) -> bool {
        std::thread::current().id() == self.thread
    }

    /// Queues `job` without waiting for it; false if the thread has stopped.
    pub(crate) fn post(&self, job: impl FnOnce(&mut DeviceCtx) + Send + 'static) -> bool {
        self.tx.send(Msg::Run(Box::new(job))).is_ok()
    }

    /// Sends `value` to the device thread and runs `f` with it there, without waiting. If the
    /// thread is gone (the server is exiting), `value` is leaked rather than dropped here: its
    /// drop may be a driver call, and the process is about to release everything anyway.
    pub(crate) fn hand_over<T: Send + 'static>(
        &self,
        value: T,
        f: impl FnOnce(&mut DeviceCtx, T) + Send + 'static,
    ) {
        let slot = Arc::new(Mutex::new(Some(value)));
        let moved = slot.clone();
        let posted = self.post(move |ctx| {
            let value = moved.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(value) = value {
                f(ctx, value);
            }
        });
        if !posted && let Some(value) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
            std::mem::forget(value);
        }
    }

    /// Runs `f` on the device thread; its result comes back through the [`Reply`].
    pub(crate) fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut DeviceCtx) -> Result<T> + Send + 'static,
    ) -> Reply<T> {
        let (tx, rx) = oneshot::channel();
        self.post(move |ctx| {
            let _ = tx.send(f(ctx));
        });
        Reply(rx)
    }
}
