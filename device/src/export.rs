//! What crosses from the server to a worker for one arena, whatever the backend: an
//! [`Export`] on the server side, an [`Import`] on the worker side. A handle kind says which
//! parts it uses: bytes that travel inside the attach reply, and/or one file descriptor that
//! travels by `SCM_RIGHTS` over the handle socket (see [`crate::handoff`]).

use std::os::fd::OwnedFd;

use crate::backend::BackendKind;

/// The handle bytes that travel inside the attach reply, by kind: each kind's parts by name,
/// never by position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handles {
    /// Host memory: none (the sealed memfd's descriptor is the whole handle).
    Host,
    /// Legacy CUDA IPC: the memory's and the ready event's IPC handles.
    CudaIpc {
        /// The memory's IPC handle (64 bytes).
        memory: Vec<u8>,
        /// The ready event's IPC handle (64 bytes).
        event: Vec<u8>,
    },
    /// CUDA VMM: the ready event's IPC handle; the memory travels as a descriptor.
    CudaVmm {
        /// The ready event's IPC handle (64 bytes).
        event: Vec<u8>,
    },
}

impl Handles {
    /// The kind of handle.
    pub fn kind(&self) -> BackendKind {
        match self {
            Handles::Host => BackendKind::Host,
            Handles::CudaIpc { .. } => BackendKind::CudaIpc,
            Handles::CudaVmm { .. } => BackendKind::CudaVmm,
        }
    }
}

/// What the server hands over for one attach.
#[derive(Debug)]
pub struct Export {
    /// The device the arena lives on (`"host"` for host memory).
    pub device_uuid: String,
    /// The handle bytes that travel in the attach reply; their variant is the kind.
    pub handles: Handles,
    /// A descriptor that travels by `SCM_RIGHTS` (host: a `dup` of the sealed memfd; CUDA
    /// VMM: a `dup` of the allocation's exported descriptor).
    pub fd: Option<OwnedFd>,
    /// The size of the allocation behind the descriptor where the worker must map all of it
    /// (CUDA VMM: the arena's length rounded up to the device's granularity); 0 otherwise.
    pub alloc_len: u64,
}

impl Export {
    /// Which kind of handle this is.
    pub fn kind(&self) -> BackendKind {
        self.handles.kind()
    }

    /// A copy, when the export carries no descriptor (a descriptor is not copied here: each
    /// attach needs its own).
    pub(crate) fn without_fd(&self) -> Option<Export> {
        self.fd.is_none().then(|| Export {
            device_uuid: self.device_uuid.clone(),
            handles: self.handles.clone(),
            fd: None,
            alloc_len: self.alloc_len,
        })
    }
}

/// What a worker received for one attach, to [`import`](crate::Mapping::import).
#[derive(Debug)]
pub struct Import {
    /// The device the arena lives on, by UUID (the worker maps it to its own ordinal).
    pub device_uuid: String,
    /// The handle bytes of the attach reply; their variant is the kind.
    pub handles: Handles,
    /// The descriptor received over the handle socket, for kinds that pass one.
    pub fd: Option<OwnedFd>,
    /// The arena's length as the manifest gives it; the mapping is checked against it.
    pub len: u64,
    /// The allocation's size, for kinds that map a whole allocation (CUDA VMM); 0 otherwise.
    pub alloc_len: u64,
}

impl Import {
    /// Which kind of handle this is.
    pub fn kind(&self) -> BackendKind {
        self.handles.kind()
    }
}

/// Handle bytes that must be `N` bytes long (`what` names them in errors).
pub(crate) fn key<const N: usize>(bytes: &[u8], what: &str) -> crate::Result<[u8; N]> {
    bytes.try_into().map_err(|_| crate::DeviceError::BadHandle {
        reason: format!("{what} is {} bytes, not {N}", bytes.len()),
    })
}
