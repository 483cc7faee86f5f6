//! [`BodyBudget`]: the request-body bytes the server receives at once, over every door (the
//! REST doors' bodies, the gRPC `ModelInfer` messages), `max_body_bytes_in_flight` in all.
//! A body reserves its size before it is buffered and gives it back when it is dropped; a
//! caller that finds the budget spent is refused at once (503 / UNAVAILABLE, retry), so that
//! many stalled or slow uploads cannot grow the server's memory without end.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Budgets are counted in KiB (a semaphore's permits are counted in `u32`).
const UNIT: usize = 1024;

/// The request-body bytes being received at once over all the server's doors.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    units: Arc<Semaphore>,
}

impl BodyBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Self {
        let units = bytes.div_ceil(UNIT).min(Semaphore::MAX_PERMITS);
        Self {
            units: Arc::new(Semaphore::new(units)),
        }
    }

    /// Bytes free now.
    pub fn available(&self) -> usize {
        self.units.available_permits().saturating_mul(UNIT)
    }

    /// Reserves `bytes` now, or `None` when the budget has not that much free.
    pub fn reserve(&self, bytes: usize) -> Option<BodyPermit> {
        let units = u32::try_from(bytes.div_ceil(UNIT).max(1)).ok()?;
        self.units
            .clone()
            .try_acquire_many_owned(units)
            .ok()
            .map(BodyPermit)
    }
}

/// Bytes reserved from a [`BodyBudget`], given back when dropped.
#[derive(Debug)]
pub struct BodyPermit(#[allow(dead_code)] OwnedSemaphorePermit);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_given_back_when_dropped() {
        let b = BodyBudget::new(4096);
        let one = b.reserve(3000).expect("fits");
        assert!(b.reserve(2000).is_none(), "past the budget");
        let two = b.reserve(1).expect("a KiB is left");
        assert_eq!(b.available(), 0);
        drop((one, two));
        assert_eq!(b.available(), 4096);
        assert!(b.reserve(usize::MAX).is_none());
    }
}
