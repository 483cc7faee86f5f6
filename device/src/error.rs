//! The crate's one error type, [`DeviceError`], and its [`Result`] alias.
//!
//! Messages are lowercase and name the thing; the cause, where there is one, is the error's
//! `source()`, not repeated in the message.

/// What can go wrong with an arena, a mapping or a handoff.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A read or write touches bytes past the arena's end.
    #[error("{op} of {len} bytes at offset {offset} runs past the arena's {arena_len} bytes")]
    OutOfRange {
        /// `"write"` or `"read"`.
        op: &'static str,
        /// Where the access starts.
        offset: u64,
        /// How many bytes it touches.
        len: u64,
        /// The arena's length.
        arena_len: u64,
    },
    /// A write came after the arena was sealed.
    #[error("the arena is sealed: its contents can no longer change")]
    Sealed,
    /// An arena was exported before it was sealed.
    #[error("the arena is not sealed yet: seal it before exporting it")]
    NotSealed,
    /// A system call failed for a reason other than those with their own variant.
    #[error("{op} failed")]
    Io {
        /// The operation, e.g. `"pwrite to the arena"`.
        op: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The memory could not be had (no memory, no space, file too large, out of descriptors).
    #[error("allocating {bytes} bytes failed: {reason}")]
    AllocationFailed {
        /// The size asked for.
        bytes: u64,
        /// Why it failed.
        reason: String,
    },
    /// An imported handle is not what it claims to be (wrong size, not sealed, ...).
    #[error("bad memory handle: {reason}")]
    BadHandle {
        /// What is wrong with it.
        reason: String,
    },
    /// The handle server answered a ticket with a refusal.
    #[error("the handle server refused the ticket: {reason}")]
    HandoffRefused {
        /// The server's reason, as it sent it.
        reason: String,
    },
    /// A handoff message broke the wire protocol.
    #[error("malformed handoff message: {reason}")]
    Protocol {
        /// What was wrong with it.
        reason: String,
    },
    /// A CUDA driver call failed.
    #[error("{op}: {source}")]
    Cuda {
        /// The driver call.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// A shared library the backend needs could not be loaded.
    #[error("cannot load {library}: {hint}")]
    LibraryMissing {
        /// The library looked for.
        library: String,
        /// What to do about it.
        hint: String,
    },
    /// No device matches the selector (ordinal or UUID), or it cannot be used.
    #[error("no usable CUDA device '{device}': {reason}")]
    NoSuchDevice {
        /// The selector.
        device: String,
        /// Why.
        reason: String,
    },
    /// A device kernel (checksum) failed.
    #[error("kernel: {0}")]
    Kernel(String),
    /// The device thread has stopped (the server is shutting down), or never started.
    #[error("the device thread has stopped")]
    ThreadGone,
    /// A device-owned object was touched off its device thread (a bug in the caller).
    #[error("a device object was used off its device thread")]
    WrongThread,
    /// The backend cannot do this.
    #[error("{what} is not supported by this backend")]
    Unsupported {
        /// What was asked for.
        what: String,
    },
}

impl DeviceError {
    /// Whether the error means a resource ran out (memory, space, descriptors), so that the
    /// server can answer `RESOURCE_EXHAUSTED` rather than `INTERNAL`.
    pub fn is_resource_exhausted(&self) -> bool {
        match self {
            DeviceError::AllocationFailed { .. } => true,
            // Out of descriptors (`EMFILE`, `ENFILE`), e.g. duplicating one for a worker.
            DeviceError::Io { source, .. } => matches!(source.raw_os_error(), Some(23 | 24)),
            DeviceError::OutOfRange { .. }
            | DeviceError::Sealed
            | DeviceError::NotSealed
            | DeviceError::BadHandle { .. }
            | DeviceError::HandoffRefused { .. }
            | DeviceError::Protocol { .. }
            | DeviceError::Unsupported { .. }
            | DeviceError::Cuda { .. }
            | DeviceError::LibraryMissing { .. }
            | DeviceError::NoSuchDevice { .. }
            | DeviceError::Kernel(_)
            | DeviceError::ThreadGone
            | DeviceError::WrongThread => false,
        }
    }

    /// An [`DeviceError::Io`] from a rustix errno.
    pub(crate) fn io(op: &'static str, errno: rustix::io::Errno) -> Self {
        DeviceError::Io {
            op,
            source: errno.into(),
        }
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, DeviceError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Running out of descriptors is a resource running out (RESOURCE_EXHAUSTED), said as
    /// what it is, not as a failed allocation.
    #[test]
    fn out_of_descriptors_is_exhaustion_named_for_what_it_is() {
        let e = DeviceError::Io {
            op: "duplicating the arena's memfd descriptor",
            source: std::io::Error::from_raw_os_error(24),
        };
        assert!(e.is_resource_exhausted());
        assert!(!e.to_string().contains("allocating"), "{e}");
        let other = DeviceError::Io {
            op: "pwrite to the arena",
            source: std::io::Error::from_raw_os_error(5),
        };
        assert!(!other.is_resource_exhausted());
    }
}
