//! What the registry lets go of under its lock, released after the lock is dropped.
//!
//! Freeing an arena is device work (on its device thread) and closing a ticket's descriptor is
//! a system call; neither belongs inside the registry's critical section. Whatever a section
//! releases — arena handles, ticket descriptors — goes to the graveyard, and the guard drops
//! it right after unlocking. Dropping the last [`ArenaHandle`] only queues the free on the
//! device thread, so even that never waits for the device.

use std::os::fd::OwnedFd;
use std::sync::MutexGuard;

use modelshare_device::ArenaHandle;

/// Released resources waiting for the lock to be dropped.
#[derive(Debug, Default)]
pub(super) struct Graveyard {
    pub(super) arenas: Vec<ArenaHandle>,
    pub(super) fds: Vec<OwnedFd>,
}

impl Graveyard {
    /// Buries an arena handle.
    pub(super) fn arena(&mut self, arena: ArenaHandle) {
        self.arenas.push(arena);
    }

    /// Buries a descriptor (an unredeemed ticket's).
    pub(super) fn fd(&mut self, fd: OwnedFd) {
        self.fds.push(fd);
    }
}

/// Something that carries a graveyard (the registry's state).
pub(super) trait Buries {
    fn graveyard(&mut self) -> &mut Graveyard;
}

/// The registry's lock guard: empties the graveyard after unlocking.
pub(super) struct Guard<'a, S: Buries> {
    guard: Option<MutexGuard<'a, S>>,
}

impl<'a, S: Buries> Guard<'a, S> {
    pub(super) fn new(guard: MutexGuard<'a, S>) -> Self {
        Self { guard: Some(guard) }
    }
}

impl<S: Buries> std::ops::Deref for Guard<'_, S> {
    type Target = S;
    fn deref(&self) -> &S {
        // Present until drop.
        self.guard
            .as_deref()
            .unwrap_or_else(|| unreachable!("guard taken before drop"))
    }
}

impl<S: Buries> std::ops::DerefMut for Guard<'_, S> {
    fn deref_mut(&mut self) -> &mut S {
        self.guard
            .as_deref_mut()
            .unwrap_or_else(|| unreachable!("guard taken before drop"))
    }
}

impl<S: Buries> Drop for Guard<'_, S> {
    fn drop(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            let dead = std::mem::take(guard.graveyard());
            drop(guard);
            drop(dead);
        }
    }
}
