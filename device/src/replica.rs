//! Copies of a sealed arena to another device of the same server (replicas): what the source
//! hands over ([`PeerSource`]), taken on the source's device thread and used on the
//! destination's.
//!
//! CUDA: the source's device address and context; the destination copies device-to-device
//! (`cuMemcpyPeerAsync`, over NVLink or PCIe), after the source's device thread granted the
//! destination device read access (VMM memory) or the destination enabled peer access (legacy
//! memory). Host memory: a descriptor of the sealed memfd, copied in the kernel.
//!
//! The server keeps its handle to the source arena until the copy has finished: the source
//! cannot be freed under the copy.

use std::os::fd::OwnedFd;
use std::sync::Arc;

/// The source of a replica copy.
#[derive(Debug)]
pub enum PeerSource {
    /// A CUDA arena: its device address in this process and the context it belongs to.
    Cuda {
        /// The source context (its device).
        ctx: Arc<cudarc::driver::CudaContext>,
        /// The source arena's device address.
        ptr: u64,
        /// Bytes to copy (the arena's length).
        len: u64,
    },
    /// A host arena: a descriptor of its sealed memfd.
    Host {
        /// The descriptor (read from offset 0).
        fd: OwnedFd,
        /// Bytes to copy.
        len: u64,
    },
}

impl PeerSource {
    /// Bytes the copy moves.
    pub fn len(&self) -> u64 {
        match self {
            PeerSource::Cuda { len, .. } | PeerSource::Host { len, .. } => *len,
        }
    }

    /// Whether there is nothing to copy.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
