//! [`DeviceThread`]: the thread of one device, started with its backend opened there, the loop
//! that runs its jobs and polls its watches, and the calls on the device as a whole
//! (allocate, adopt, memory figures).

use std::os::fd::OwnedFd;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{ArenaHandle, Backend, DeviceCtx, Executor, Msg, Reply};
use crate::backend::DeviceInfo;
use crate::error::{DeviceError, Result};

/// How often pending watches are polled while any is registered.
const WATCH_POLL: Duration = Duration::from_micros(50);

/// The device thread of one device, and what it said about the device when it opened.
#[derive(Debug, Clone)]
pub struct DeviceThread {
    pub(super) shared: Arc<Shared>,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) exec: Executor,
    info: DeviceInfo,
    join: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Jobs already queued run first; then the backend (context, staging buffers) goes.
        let _ = self.exec.tx.send(Msg::Stop);
        let handle = self.join.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle
            && !self.exec.is_current()
            && h.join().is_err()
        {
            tracing::warn!("a device thread panicked");
        }
    }
}

impl DeviceThread {
    /// Starts a device thread called `name` and opens its backend there with `open`. Returns
    /// once the backend is open (or failed to open).
    pub fn start<F>(name: &str, open: F) -> Result<Self>
    where
        F: FnOnce() -> Result<Box<dyn Backend>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Msg>();
        let (opened_tx, opened_rx) = mpsc::channel();
        let join = std::thread::Builder::new()
            .name(name.chars().take(15).collect())
            .spawn(move || {
                let backend = match open() {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = opened_tx.send(Err(e));
                        return;
                    }
                };
                let _ = opened_tx.send(Ok(backend.info()));
                run(
                    DeviceCtx {
                        backend,
                        watches: Vec::new(),
                    },
                    rx,
                );
            })
            .map_err(|e| DeviceError::Io {
                op: "starting a device thread",
                source: e,
            })?;
        let thread = join.thread().id();
        let info = match opened_rx.recv() {
            Ok(Ok(info)) => info,
            Ok(Err(e)) => {
                let _ = join.join();
                return Err(e);
            }
            Err(_) => {
                let _ = join.join();
                return Err(DeviceError::ThreadGone);
            }
        };
        Ok(Self {
            shared: Arc::new(Shared {
                exec: Executor { tx, thread },
                info,
                join: Mutex::new(Some(join)),
            }),
        })
    }

    /// What the backend said about its device when it opened.
    pub fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    /// The device's UUID (`"host"` for host memory).
    pub fn uuid(&self) -> &str {
        &self.shared.info.uuid
    }

    /// Allocates a zero-filled arena of `len` bytes, writable until sealed; `label` names it
    /// for debugging (e.g. `"llama@3"`).
    pub fn allocate(&self, len: u64, label: &str) -> Reply<ArenaHandle> {
        let label = label.to_owned();
        let exec = self.shared.exec.clone();
        self.shared.exec.call(move |ctx| {
            let arena = ctx.backend().allocate(len, &label)?;
            let kind = ctx.backend().info().backend;
            Ok(ArenaHandle::new(arena, exec, len, kind))
        })
    }

    /// Takes over an arena kept alive by a worker across a server restart (see
    /// [`Backend::adopt`]); it comes back sealed and ready to export.
    pub fn adopt(&self, fd: OwnedFd, alloc_len: u64, len: u64) -> Reply<ArenaHandle> {
        let exec = self.shared.exec.clone();
        self.shared.exec.call(move |ctx| {
            let arena = ctx.backend().adopt(fd, alloc_len, len)?;
            let kind = ctx.backend().info().backend;
            Ok(ArenaHandle::new(arena, exec, len, kind))
        })
    }

    /// Memory a new arena could take now (see [`Backend::free_bytes`]).
    pub fn free_bytes(&self) -> Reply<Option<u64>> {
        self.shared.exec.call(|ctx| Ok(ctx.backend().free_bytes()))
    }

    /// Device memory in use as the device reports it (`None` where unknown: host memory).
    pub fn used_bytes(&self) -> Reply<Option<u64>> {
        self.shared.exec.call(|ctx| Ok(ctx.backend().used_bytes()))
    }

    /// Runs `f` on the device thread (tests and diagnostics: e.g. to hold the device busy).
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut DeviceCtx) -> Result<T> + Send + 'static,
    ) -> Reply<T> {
        self.shared.exec.call(f)
    }
}

fn run(mut ctx: DeviceCtx, rx: mpsc::Receiver<Msg>) {
    loop {
        let msg = if ctx.watches.is_empty() {
            rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            rx.recv_timeout(WATCH_POLL)
        };
        match msg {
            Ok(Msg::Run(job)) => job(&mut ctx),
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {}
        }
        ctx.poll_watches();
    }
    // Let outstanding work finish before the backend goes.
    while !ctx.watches.is_empty() {
        ctx.poll_watches();
        std::thread::sleep(WATCH_POLL);
    }
}
