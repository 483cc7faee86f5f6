//! What crosses from the server to a worker for one arena, whatever the backend: an
//! [`Export`] on the server side, an [`Import`] on the worker side. A handle kind says which
//! parts it uses: bytes that travel inside the attach reply, and/or one file descriptor that
//! travels by `SCM_RIGHTS` over the handle socket (see [`crate::handoff`]).

use std::os::fd::OwnedFd;

use crate::backend::BackendKind;

/// What the server hands over for one attach.
#[derive(Debug)]
pub struct Export {
    /// Which kind of handle this is.
    pub kind: BackendKind,
    /// The device the arena lives on (`"host"` for host memory).
    pub device_uuid: String,
    /// Opaque handle bytes that travel in the attach reply, in the order the kind defines
    /// (CUDA IPC: the memory handle, then the ready event's handle; CUDA VMM: the ready
    /// event's handle; host: none).
    pub handles: Vec<Vec<u8>>,
    /// A descriptor that travels by `SCM_RIGHTS` (host: a `dup` of the sealed memfd; CUDA
    /// VMM: a `dup` of the allocation's exported descriptor).
    pub fd: Option<OwnedFd>,
    /// The size of the allocation behind the descriptor where the worker must map all of it
    /// (CUDA VMM: the arena's length rounded up to the device's granularity); 0 otherwise.
    pub alloc_len: u64,
}

impl Export {
    /// A copy, when the export carries no descriptor (a descriptor is not copied here: each
    /// attach needs its own).
    pub(crate) fn without_fd(&self) -> Option<Export> {
        self.fd.is_none().then(|| Export {
            kind: self.kind,
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
    /// Which kind of handle this is.
    pub kind: BackendKind,
    /// The device the arena lives on, by UUID (the worker maps it to its own ordinal).
    pub device_uuid: String,
    /// The handle bytes of the attach reply, in the kind's order.
    pub handles: Vec<Vec<u8>>,
    /// The descriptor received over the handle socket, for kinds that pass one.
    pub fd: Option<OwnedFd>,
    /// The arena's length as the manifest gives it; the mapping is checked against it.
    pub len: u64,
    /// The allocation's size, for kinds that map a whole allocation (CUDA VMM); 0 otherwise.
    pub alloc_len: u64,
}

impl Import {
    /// Handle bytes `i`, which must be `N` bytes long (`what` names it in errors).
    pub(crate) fn handle<const N: usize>(&self, i: usize, what: &str) -> crate::Result<[u8; N]> {
        let bytes = self
            .handles
            .get(i)
            .ok_or_else(|| crate::DeviceError::BadHandle {
                reason: format!("{what} is missing"),
            })?;
        bytes
            .as_slice()
            .try_into()
            .map_err(|_| crate::DeviceError::BadHandle {
                reason: format!("{what} is {} bytes, not {N}", bytes.len()),
            })
    }
}
