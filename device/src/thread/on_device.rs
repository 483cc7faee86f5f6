//! [`OnDevice`]: a value owned by a device thread, read only by jobs there and dropped there
//! wherever its owner lets go of it.

use std::fmt;

use super::{Executor, OnDevice};
use crate::error::{DeviceError, Result};

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
