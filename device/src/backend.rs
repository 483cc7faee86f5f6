//! The vocabulary every backend shares: which kind of memory it hands out ([`BackendKind`]),
//! what it says of its device ([`DeviceInfo`]), how a loading thread streams bytes into an
//! arena ([`ArenaWriter`]), and what a worker-side mapping provides ([`Mapped`]).
//!
//! The traits a backend implements *on its device thread* ([`crate::Backend`],
//! [`crate::Arena`]) live beside the thread, in [`crate::thread`].

use crate::error::Result;

/// Which kind of memory a backend hands out, and so which handle a worker gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Shared host memory (`memfd`), passed as a file descriptor.
    Host,
    /// CUDA legacy IPC (`cuMemAlloc` + `CUipcMemHandle`): bytes in the attach reply. Mappings
    /// of this kind are writable by the worker.
    CudaIpc,
    /// CUDA VMM (`cuMemCreate`): a POSIX file descriptor passed over the handle socket, mapped
    /// read-only by the worker.
    CudaVmm,
}

impl BackendKind {
    /// Whether a worker's mapping of this kind keeps the memory alive after the server lets it
    /// go (or dies): kinds passed as descriptors.
    pub fn outlives_server(self) -> bool {
        matches!(self, BackendKind::Host | BackendKind::CudaVmm)
    }

    /// Whether no worker can write the memory, whatever code it runs: a sealed memfd. (A VMM
    /// mapping is read-only as the SDK maps it, but the worker could import the descriptor
    /// again with write access; legacy IPC mappings are writable.)
    pub fn immutable_to_workers(self) -> bool {
        matches!(self, BackendKind::Host)
    }
}

/// What a backend says about its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The backend.
    pub backend: BackendKind,
    /// The device's UUID as it goes on the wire (`"host"` for host memory).
    pub uuid: String,
    /// A human-readable name.
    pub name: String,
    /// The device's total memory in bytes (0 where unknown).
    pub total_bytes: u64,
    /// The NUMA node the device sits on, where the machine has several and says which
    /// (see [`crate::numa`]); `None` otherwise.
    pub numa_node: Option<u32>,
}

/// Streams bytes into an arena during a load, from a loading thread.
///
/// Ask for a [`buffer`](ArenaWriter::buffer) for an arena offset, fill it, then
/// [`submit`](ArenaWriter::submit) the bytes it holds for that offset. Writers that stage
/// (CUDA) hand out page-aligned buffers whose length is a multiple of [`PAGE`], so that a
/// caller may fill one with direct I/O (`O_DIRECT`, which reads whole aligned blocks) and
/// submit only the wanted bytes, from `skip` on.
pub trait ArenaWriter {
    /// Whether buffers are page-aligned staging buffers, fit for direct I/O (see above).
    fn staged(&self) -> bool {
        false
    }

    /// A buffer for bytes bound for the arena at `offset` (never empty).
    fn buffer(&mut self, offset: u64) -> Result<&mut [u8]>;

    /// Queues `len` bytes of the last buffer, from byte `skip` on (`skip` is 0 unless the
    /// writer is [`staged`](ArenaWriter::staged)), for the offset that buffer was asked for.
    fn submit(&mut self, skip: usize, len: usize) -> Result<()>;

    /// Waits until everything submitted is in the arena.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// The alignment (and length granularity) of a staged writer's buffers: what direct I/O asks
/// of file offsets, lengths and memory.
pub const PAGE: usize = 4096;

/// The bytes of one [`BufferedWriter`] buffer.
pub(crate) const BUFFERED_BYTES: usize = 4 << 20;

/// The simplest writer: a plain buffer, each submitted chunk handed to `write` (offset, bytes).
pub(crate) struct BufferedWriter<W> {
    buf: Vec<u8>,
    offset: Option<u64>,
    write: W,
}

impl<W: FnMut(u64, &[u8]) -> Result<()>> BufferedWriter<W> {
    pub(crate) fn new(write: W) -> Self {
        Self {
            buf: vec![0; BUFFERED_BYTES],
            offset: None,
            write,
        }
    }
}

impl<W: FnMut(u64, &[u8]) -> Result<()>> ArenaWriter for BufferedWriter<W> {
    fn buffer(&mut self, offset: u64) -> Result<&mut [u8]> {
        self.offset = Some(offset);
        Ok(&mut self.buf)
    }

    fn submit(&mut self, skip: usize, len: usize) -> Result<()> {
        let offset = self.offset.take().ok_or(crate::DeviceError::Protocol {
            reason: "submit without a buffer".into(),
        })?;
        let bytes = skip
            .checked_add(len)
            .and_then(|end| self.buf.get(skip..end))
            .ok_or(crate::DeviceError::OutOfRange {
                op: "submit",
                offset,
                len: len as u64,
                arena_len: self.buf.len() as u64,
            })?;
        (self.write)(offset, bytes)
    }

    fn finish(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// Reads an arena's bytes back on a thread of the caller's (a load comparing its files with
/// memory already loaded): each [`read`](ArenaReader::read) returns the bytes at an offset,
/// valid until the next call. CUDA copies through a pinned buffer of its own, the copy
/// submitted to the device thread; host memory is read with `pread` on the caller's thread.
pub trait ArenaReader {
    /// The most bytes one read returns.
    fn capacity(&self) -> usize;

    /// The `len` bytes (at most [`capacity`](ArenaReader::capacity)) at `offset`.
    fn read(&mut self, offset: u64, len: usize) -> Result<&[u8]>;
}

/// The simplest reader: a plain buffer that `read` (offset, bytes) fills.
pub(crate) struct BufferedReader<R> {
    buf: Vec<u8>,
    read: R,
}

impl<R: FnMut(u64, &mut [u8]) -> Result<()>> BufferedReader<R> {
    pub(crate) fn new(read: R) -> Self {
        Self {
            buf: vec![0; BUFFERED_BYTES],
            read,
        }
    }
}

impl<R: FnMut(u64, &mut [u8]) -> Result<()>> ArenaReader for BufferedReader<R> {
    fn capacity(&self) -> usize {
        self.buf.len()
    }

    fn read(&mut self, offset: u64, len: usize) -> Result<&[u8]> {
        let buf = self
            .buf
            .get_mut(..len)
            .ok_or(crate::DeviceError::OutOfRange {
                op: "read back",
                offset,
                len: len as u64,
                arena_len: BUFFERED_BYTES as u64,
            })?;
        (self.read)(offset, buf)?;
        Ok(buf)
    }
}

/// What each kind of worker-side mapping provides (see [`crate::Mapping`], the neutral view
/// the SDK uses).
pub trait Mapped: Send + Sync + std::fmt::Debug {
    /// The kind of handle it was imported from.
    fn kind(&self) -> BackendKind;
    /// The arena's length in bytes.
    fn len(&self) -> u64;
    /// Whether the arena has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether writes through the mapping are impossible.
    fn read_only(&self) -> bool;
    /// The device the arena lives on.
    fn device_uuid(&self) -> &str;
    /// The bytes, where they are mapped into this process's address space.
    fn host_bytes(&self) -> Option<&[u8]>;
    /// The device address in this process, where the arena is in device memory.
    fn device_ptr(&self) -> Option<u64>;
    /// The CUDA context the arena is mapped in (device memory only).
    fn context(&self) -> Option<&std::sync::Arc<cudarc::driver::CudaContext>>;
    /// Makes `stream` wait, on the device, until the arena is loaded.
    fn wait_ready(&self, stream: &cudarc::driver::CudaStream) -> Result<()>;
    /// Makes another library's `stream` wait, on the device, until the arena is loaded.
    fn wait_ready_foreign(&self, stream: crate::ForeignStream) -> Result<()>;
    /// Whether the load has completed.
    fn is_ready(&self) -> Result<bool>;
    /// Copies `dst.len()` bytes at `offset` to the host (after the load completed).
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()>;
    /// The size of the allocation behind the mapping (CUDA VMM: the arena's length rounded up
    /// to the device's granularity; otherwise the arena's length).
    fn allocation_len(&self) -> u64 {
        self.len()
    }
    /// The descriptor the arena came as, kept while the mapping lives (kinds that pass one:
    /// host, CUDA VMM): what a restarted server adopts the memory by.
    fn descriptor(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

/// Checks that `len` bytes at `offset` lie within an arena of `arena_len` bytes.
pub(crate) fn check_range(op: &'static str, offset: u64, len: usize, arena_len: u64) -> Result<()> {
    let len = len as u64;
    match offset.checked_add(len) {
        Some(end) if end <= arena_len => Ok(()),
        _ => Err(crate::DeviceError::OutOfRange {
            op,
            offset,
            len,
            arena_len,
        }),
    }
}
