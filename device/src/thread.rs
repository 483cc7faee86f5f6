//! One thread per device that makes every driver call for it, and the traits a backend
//! implements there ([`Backend`], [`Arena`]).
//!
//! A [`DeviceThread`] owns its [`Backend`] (the CUDA context, staging buffers, kernels, or the
//! host backend's nothing-at-all) on a dedicated OS thread, fed by a channel. Everything that
//! touches the device — allocation, copy submission, event records and queries, exports,
//! checksums, frees and memory queries — is sent there as a job and answered on a one-shot
//! channel ([`Reply`]), which an async caller `.await`s and a blocking caller
//! [`wait`](Reply::wait)s for. No caller ever makes a driver call, holds a lock across one, or
//! blocks the async runtime on one.
//!
//! Objects that own device resources ([`Arena`]s, CUDA streams, pinned buffers) are wrapped in
//! [`OnDevice`]: they may be *referred to* from any thread, but are touched only by jobs on
//! their device thread, and when the last reference goes on another thread the value is sent
//! to the device thread to be dropped there (so `cuMemFree` runs on the device thread too).
//!
//! The thread also polls *watches*: non-blocking checks (an event query) registered by jobs,
//! run between jobs while any is pending, so that a loading thread learns that its staging
//! buffer's copy is done without making a driver call or blocking the device thread.

use std::fmt;
use std::future::Future;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::backend::{ArenaWriter, BufferedWriter, DeviceInfo};
use crate::error::{DeviceError, Result};
use crate::export::Export;

/// A device that allocates arenas. Lives on its device thread: every method runs there.
pub trait Backend: std::fmt::Debug {
    /// Describes the device.
    fn info(&self) -> DeviceInfo;

    /// Allocates a zero-filled arena of `len` bytes (`len` may be 0: the arena is still valid),
    /// writable until sealed. `label` names it (e.g. `"llama-7b@3"`) for debugging (the memfd's
    /// name on the host backend).
    fn allocate(&mut self, len: u64, label: &str) -> Result<Box<dyn Arena>>;

    /// Device memory in use as the device reports it; `None` where unknown (host).
    fn used_bytes(&mut self) -> Option<u64>;

    /// Memory a new arena could take now (CUDA: the device's free memory; host: the kernel's
    /// `MemAvailable`, bounded by the cgroup's limit: [`crate::host_memory`]); `None` where
    /// unknown.
    fn free_bytes(&mut self) -> Option<u64> {
        None
    }

    /// Takes over an arena that outlived the server that made it: `fd` is a descriptor of it
    /// that a worker kept (an allocation of `alloc_len` bytes holding an arena of `len`). The
    /// arena comes back sealed and ready to export; whether its bytes are the right ones is
    /// the caller's to check. Kinds that pass no descriptor cannot be adopted.
    fn adopt(&mut self, fd: OwnedFd, alloc_len: u64, len: u64) -> Result<Box<dyn Arena>> {
        let _ = (fd, alloc_len, len);
        Err(DeviceError::Unsupported {
            what: format!("adopting an arena on the {:?} backend", self.info().backend),
        })
    }
}

/// One allocation: written, then sealed, then exported to workers. Its methods run on its
/// device thread; it is dropped there too.
pub trait Arena: Send + Sync + std::fmt::Debug {
    /// The arena's length in bytes.
    fn len(&self) -> u64;

    /// Whether the arena has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `bytes` into the arena at `offset`. Fails if the range runs past the end or the
    /// arena is sealed.
    fn write_at(&self, offset: u64, bytes: &[u8]) -> Result<()>;

    /// Ends writing: the contents become immutable (host: adds `F_SEAL_WRITE`). Idempotent.
    fn seal(&self) -> Result<()>;

    /// A handle to hand to a worker process. The host backend exports only sealed arenas.
    fn export(&self) -> Result<Export>;

    /// The export, if it is the same for every attach and carries no descriptor (CUDA IPC:
    /// the memory and event handles, fixed at allocation). The server then answers attaches
    /// without a round trip to the device thread.
    fn fixed_export(&self) -> Option<Export> {
        None
    }

    /// Reads back `buf.len()` bytes at `offset` (server-side checks and tests).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// A writer for one loading thread (`this` is the server's handle to this arena). It may
    /// stage bytes and queue copies asynchronously (CUDA: pinned buffers and a copy stream,
    /// copies submitted to the device thread). The default sends every chunk to the device
    /// thread's [`Arena::write_at`].
    fn writer(&self, this: &ArenaHandle) -> Result<Box<dyn ArenaWriter + Send>> {
        let arena = this.clone();
        Ok(Box::new(BufferedWriter::new(
            move |offset, bytes: &[u8]| arena.write_at(offset, bytes.to_vec()).wait(),
        )))
    }

    /// Whether a worker may attach before the arena is sealed: true where the backend orders a
    /// worker's first use after the load on the device itself (a ready event).
    fn attach_while_loading(&self) -> bool {
        false
    }

    /// Checksums of byte ranges `(offset, len)` computed where the bytes live, if the backend
    /// computes any (CUDA: ms64 on the device). Called after every writer has finished.
    fn device_checksums(&self, _ranges: &[(u64, u64)]) -> Result<Option<Vec<u64>>> {
        Ok(None)
    }

    /// The load failed or was cancelled: release anything waiting for the arena to be ready.
    /// Idempotent; the contents are undefined afterwards.
    fn abandon(&self) {}

    /// The device ordinal this arena is on, as this process numbers devices (CUDA only).
    fn ordinal(&self) -> Option<usize> {
        None
    }

    /// This sealed arena as the source of a replica copy to the device `to` (an ordinal, for
    /// CUDA: granted read access here first; see [`crate::replica`]).
    fn peer_source(&self, _to: Option<usize>) -> Result<crate::PeerSource> {
        Err(crate::DeviceError::Unsupported {
            what: "replica copies from this kind of arena".into(),
        })
    }

    /// Fills this (unsealed) arena with all of `source`, on this device; returns once the
    /// bytes are here. The arena is sealed by the caller, after checking them.
    fn copy_from(&self, _source: &crate::PeerSource) -> Result<()> {
        Err(crate::DeviceError::Unsupported {
            what: "replica copies into this kind of arena".into(),
        })
    }
}

/// How often pending watches are polled while any is registered.
const WATCH_POLL: Duration = Duration::from_micros(50);

/// What a job gets on the device thread.
pub struct DeviceCtx {
    backend: Box<dyn Backend>,
    watches: Vec<Box<dyn FnMut() -> bool>>,
}

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

    fn poll_watches(&mut self) {
        self.watches.retain_mut(|check| !check());
    }
}

type Job = Box<dyn FnOnce(&mut DeviceCtx) + Send>;

enum Msg {
    Run(Job),
    Stop,
}

/// Sends jobs to one device thread. Cheap to clone.
#[derive(Clone)]
pub struct Executor {
    tx: mpsc::Sender<Msg>,
    thread: ThreadId,
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

/// The answer of a device-thread job: `.await` it, or [`wait`](Reply::wait) for it on a
/// thread that may block. If the device thread has stopped, the answer is
/// [`DeviceError::ThreadGone`].
#[must_use = "a reply does nothing unless awaited or waited for"]
#[derive(Debug)]
pub struct Reply<T>(oneshot::Receiver<Result<T>>);

impl<T> Reply<T> {
    /// A reply that is already there.
    fn ready(value: Result<T>) -> Self {
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

/// A value owned by a device thread: readable only by jobs on that thread, and dropped there
/// wherever its owner lets go of it.
pub struct OnDevice<T: Send + 'static> {
    value: Option<T>,
    exec: Executor,
}

impl<T: Send + 'static> fmt::Debug for OnDevice<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnDevice")
            .field("thread", &self.exec.thread)
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> OnDevice<T> {
    /// Wraps `value`, owned by `exec`'s thread.
    pub(crate) fn new(value: T, exec: Executor) -> Self {
        Self {
            value: Some(value),
            exec,
        }
    }

    /// The value, for a job running on its device thread.
    pub(crate) fn get(&self) -> Result<&T> {
        if !self.exec.is_current() {
            return Err(DeviceError::WrongThread);
        }
        self.value.as_ref().ok_or(DeviceError::ThreadGone)
    }
}

impl<T: Send + 'static> Drop for OnDevice<T> {
    fn drop(&mut self) {
        let Some(value) = self.value.take() else {
            return;
        };
        if self.exec.is_current() {
            drop(value);
            return;
        }
        self.exec.hand_over(value, |_, value| drop(value));
    }
}

/// The device thread of one device, and what it said about the device when it opened.
#[derive(Debug, Clone)]
pub struct DeviceThread {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    exec: Executor,
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
            let outlives_server = ctx.backend().info().backend.outlives_server();
            Ok(ArenaHandle::new(arena, exec, len, outlives_server))
        })
    }

    /// Takes over an arena kept alive by a worker across a server restart (see
    /// [`Backend::adopt`]); it comes back sealed and ready to export.
    pub fn adopt(&self, fd: OwnedFd, alloc_len: u64, len: u64) -> Reply<ArenaHandle> {
        let exec = self.shared.exec.clone();
        self.shared.exec.call(move |ctx| {
            let arena = ctx.backend().adopt(fd, alloc_len, len)?;
            let outlives_server = ctx.backend().info().backend.outlives_server();
            Ok(ArenaHandle::new(arena, exec, len, outlives_server))
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

/// The server's handle to one arena. Clones refer to the same arena; the arena is freed (on
/// its device thread) when the last handle, and the last writer, are gone.
#[derive(Debug, Clone)]
pub struct ArenaHandle {
    inner: Arc<OnDevice<Box<dyn Arena>>>,
    exec: Executor,
    len: u64,
    attach_while_loading: bool,
    /// The arena's export when it never changes (see [`Arena::fixed_export`]).
    fixed: Option<Arc<Export>>,
    /// Whether workers' mappings keep the memory alive after the server lets it go (kinds
    /// passed as descriptors: host, CUDA VMM).
    outlives_server: bool,
}

impl ArenaHandle {
    fn new(arena: Box<dyn Arena>, exec: Executor, len: u64, outlives_server: bool) -> Self {
        let attach_while_loading = arena.attach_while_loading();
        let fixed = arena.fixed_export().map(Arc::new);
        ArenaHandle {
            inner: Arc::new(OnDevice::new(arena, exec.clone())),
            exec,
            len,
            attach_while_loading,
            fixed,
            outlives_server,
        }
    }

    /// Whether workers' mappings keep the memory alive after the server lets it go (host
    /// memfds, CUDA VMM; not legacy IPC).
    pub fn outlives_server(&self) -> bool {
        self.outlives_server
    }

    /// The arena's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the arena has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether a worker may attach before the arena is sealed: true where the backend orders a
    /// worker's first use after the load on the device itself (a ready event).
    pub fn attach_while_loading(&self) -> bool {
        self.attach_while_loading
    }

    fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Arena) -> Result<T> + Send + 'static,
    ) -> Reply<T> {
        let inner = self.inner.clone();
        self.exec.call(move |_| f(inner.get()?.as_ref()))
    }

    /// A handle to hand to a worker process (the host backend exports only sealed arenas).
    /// An export that never changes comes back at once, without a round trip.
    pub fn export(&self) -> Reply<Export> {
        if let Some(fixed) = &self.fixed
            && let Some(export) = fixed.without_fd()
        {
            return Reply::ready(Ok(export));
        }
        self.with(|a| a.export())
    }

    /// Ends writing: the contents become immutable. Idempotent.
    pub fn seal(&self) -> Reply<()> {
        self.with(|a| a.seal())
    }

    /// The load failed or was cancelled: release anything waiting for the arena to be ready.
    /// Queued without waiting (safe to call under a lock).
    pub fn abandon(&self) {
        let inner = self.inner.clone();
        self.exec.post(move |_| {
            if let Ok(a) = inner.get() {
                a.abandon();
            }
        });
    }

    /// Checksums of `(offset, len)` ranges computed where the bytes live, if the backend
    /// computes any (CUDA: ms64 on the device). Call after every writer has finished.
    pub fn checksums(&self, ranges: Vec<(u64, u64)>) -> Reply<Option<Vec<u64>>> {
        self.with(move |a| a.device_checksums(&ranges))
    }

    /// Copies `bytes` into the arena at `offset`.
    pub fn write_at(&self, offset: u64, bytes: Vec<u8>) -> Reply<()> {
        self.with(move |a| a.write_at(offset, &bytes))
    }

    /// Reads back `len` bytes at `offset` (server-side checks and tests).
    pub fn read_at(&self, offset: u64, len: usize) -> Reply<Vec<u8>> {
        self.with(move |a| {
            let mut buf = vec![0u8; len];
            a.read_at(offset, &mut buf)?;
            Ok(buf)
        })
    }

    /// A writer for one loading thread (see [`ArenaWriter`]). Each is finished before
    /// [`ArenaHandle::seal`].
    pub fn writer(&self) -> Reply<Box<dyn ArenaWriter + Send>> {
        let me = self.clone();
        self.exec.call(move |_| me.inner.get()?.writer(&me))
    }

    /// The device ordinal the arena is on (CUDA), from its device thread.
    pub fn ordinal(&self) -> Reply<Option<usize>> {
        self.with(|a| Ok(a.ordinal()))
    }

    /// The arena (sealed) as the source of a replica copy to device ordinal `to` (see
    /// [`Arena::peer_source`]). Keep this handle until the copy is done.
    pub fn peer_source(&self, to: Option<usize>) -> Reply<crate::PeerSource> {
        self.with(move |a| a.peer_source(to))
    }

    /// Fills the arena with all of `source` on its device thread (see [`Arena::copy_from`]).
    pub fn copy_from(&self, source: crate::PeerSource) -> Reply<()> {
        self.with(move |a| {
            if source.len() != a.len() {
                return Err(crate::DeviceError::Protocol {
                    reason: format!(
                        "a replica copy of {} bytes into an arena of {}",
                        source.len(),
                        a.len()
                    ),
                });
            }
            a.copy_from(&source)
        })
    }

    /// The executor of the arena's device thread (for writers that submit copies).
    pub(crate) fn executor(&self) -> &Executor {
        &self.exec
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::HostBackend;
    use crate::test_util::random_bytes;

    /// Host arenas go through the same seam: allocate, write through writers from several
    /// threads, seal, export, read back — all on the device thread.
    #[test]
    fn a_host_arena_round_trips_through_the_thread() {
        let device = HostBackend::thread().unwrap();
        assert_eq!(device.uuid(), "host");
        let data = random_bytes(3 * 1024 * 1024 + 5, 3);
        let arena = device.allocate(data.len() as u64, "t@1").wait().unwrap();
        let chunk = 1024 * 1024;
        std::thread::scope(|s| {
            for (i, part) in data.chunks(chunk).enumerate() {
                let arena = arena.clone();
                s.spawn(move || {
                    let mut w = arena.writer().wait().unwrap();
                    let buf = w.buffer((i * chunk) as u64).unwrap();
                    buf[..part.len()].copy_from_slice(part);
                    w.submit(0, part.len()).unwrap();
                    w.finish().unwrap();
                });
            }
        });
        assert_eq!(arena.checksums(vec![(0, 8)]).wait().unwrap(), None);
        assert!(matches!(arena.export().wait(), Err(DeviceError::NotSealed)));
        arena.seal().wait().unwrap();
        let export = arena.export().wait().unwrap();
        assert!(export.fd.is_some());
        assert_eq!(arena.read_at(0, data.len()).wait().unwrap(), data);
        assert_eq!(device.used_bytes().wait().unwrap(), None);
    }

    /// An arena's last handle may go on any thread: it is freed on its device thread, and a
    /// device object cannot be touched elsewhere.
    #[test]
    fn device_objects_stay_on_their_thread() {
        let device = HostBackend::thread().unwrap();
        let arena = device.allocate(16, "t@2").wait().unwrap();
        assert!(matches!(arena.inner.get(), Err(DeviceError::WrongThread)));
        let other = std::thread::spawn(move || drop(arena));
        other.join().unwrap();
        // The free was queued behind nothing else and the thread still answers.
        assert_eq!(device.used_bytes().wait().unwrap(), None);
    }

    /// A caller awaiting the device thread is answered in order; a long job delays, but does
    /// not lose, what comes after it.
    #[tokio::test]
    async fn replies_come_in_order_behind_a_busy_device() {
        let device = HostBackend::thread().unwrap();
        let started = Instant::now();
        let busy = device.run(|_| {
            std::thread::sleep(Duration::from_millis(100));
            Ok(1)
        });
        let after = device.used_bytes();
        assert_eq!(busy.await.unwrap(), 1);
        assert_eq!(after.await.unwrap(), None);
        assert!(started.elapsed() >= Duration::from_millis(100));
    }

    /// An arena whose export never changes.
    #[derive(Debug)]
    struct Fixed;

    impl Arena for Fixed {
        fn len(&self) -> u64 {
            0
        }
        fn write_at(&self, _: u64, _: &[u8]) -> Result<()> {
            Ok(())
        }
        fn seal(&self) -> Result<()> {
            Ok(())
        }
        fn export(&self) -> Result<Export> {
            self.fixed_export().ok_or(DeviceError::ThreadGone)
        }
        fn fixed_export(&self) -> Option<Export> {
            Some(Export {
                device_uuid: "GPU-test".into(),
                handles: crate::Handles::CudaIpc {
                    memory: vec![1; 64],
                    event: vec![2; 64],
                },
                fd: None,
                alloc_len: 0,
            })
        }
        fn read_at(&self, _: u64, _: &mut [u8]) -> Result<()> {
            Ok(())
        }
    }

    #[derive(Debug)]
    struct FixedBackend;

    impl Backend for FixedBackend {
        fn info(&self) -> DeviceInfo {
            HostBackend::new().info()
        }
        fn allocate(&mut self, _: u64, _: &str) -> Result<Box<dyn Arena>> {
            Ok(Box::new(Fixed))
        }
        fn used_bytes(&mut self) -> Option<u64> {
            None
        }
    }

    /// An export that never changes is answered without the device thread: an attach does not
    /// wait behind device work.
    #[test]
    fn a_fixed_export_needs_no_round_trip() {
        let device =
            DeviceThread::start("fixed", || Ok(Box::new(FixedBackend) as Box<dyn Backend>))
                .unwrap();
        let arena = device.allocate(0, "f@1").wait().unwrap();
        let (release, held) = mpsc::channel::<()>();
        let busy = device.run(move |_| Ok(held.recv_timeout(Duration::from_secs(5)).is_ok()));
        let export = arena.export().wait().unwrap();
        assert_eq!(
            export.handles,
            crate::Handles::CudaIpc {
                memory: vec![1; 64],
                event: vec![2; 64]
            }
        );
        release.send(()).unwrap();
        assert!(
            busy.wait().unwrap(),
            "the export waited for the busy device thread"
        );
    }

    /// Once the thread has stopped, calls fail with ThreadGone instead of hanging.
    #[test]
    fn a_stopped_thread_answers_thread_gone() {
        let device = HostBackend::thread().unwrap();
        let exec = device.shared.exec.clone();
        drop(device);
        let r: Reply<()> = exec.call(|_| Ok(()));
        assert!(matches!(r.wait(), Err(DeviceError::ThreadGone)));
    }
}
