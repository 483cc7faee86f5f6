//! [`Reservation`]: address space set aside in a worker for an arena whose handle has not
//! arrived yet (CUDA VMM), made by [`crate::Mapping::reserve`] and mapped into by
//! [`crate::Mapping::import_reserved`].

use std::sync::Arc;

use crate::cuda::sys::AddressRange;

/// Address space set aside for an arena before its handle is received (CUDA VMM only), so that
/// the arena's address is known before the import: see [`crate::Mapping::reserve`]. Passed to
/// [`crate::Mapping::import_reserved`], it is where the arena is mapped. The range stays reserved (never
/// reused by another mapping) while any clone of it, or the mapping made in it, lives.
#[derive(Debug, Clone)]
pub struct Reservation(pub(crate) Arc<AddressRange>);

impl Reservation {
    /// The device address the arena will start at.
    pub fn device_ptr(&self) -> u64 {
        self.0.ptr()
    }

    /// The CUDA device (this process's ordinal) it is reserved on.
    pub fn ordinal(&self) -> usize {
        self.0.context().ordinal()
    }
}
