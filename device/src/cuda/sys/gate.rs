//! [`Gate`]: a host-side latch a stream is made to wait on through a host function
//! ([`enqueue_gate`]), so that work queued after it completes only once the gate opens.

use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex};

use cudarc::driver::{CudaStream, result};

use super::common::driver;
use crate::error::Result;

/// A host-side latch a stream can be made to wait on (through a host function), opened once.
#[derive(Debug, Default)]
pub struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    /// Opens the gate; the waiting stream proceeds. Idempotent.
    pub fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            open = self.cv.wait(open).unwrap_or_else(|e| e.into_inner());
        }
    }
}

unsafe extern "C" fn gate_wait(user: *mut c_void) {
    // SAFETY: `user` is the pointer `enqueue_gate` made with `Arc::into_raw`, handed to us once.
    let gate = unsafe { Arc::from_raw(user.cast::<Gate>().cast_const()) };
    gate.wait();
}

/// Enqueues on `stream` a host function that blocks until `gate` is opened: work queued after
/// it (an event record) completes only then. The gate must be opened eventually, or the stream
/// never drains (the arena opens it on seal, abandon and drop).
pub fn enqueue_gate(stream: &CudaStream, gate: &Arc<Gate>) -> Result<()> {
    let raw = Arc::into_raw(gate.clone()).cast_mut().cast::<c_void>();
    // SAFETY: the stream is live; the callback takes back the `Arc` it is given exactly once.
    let r = unsafe { result::stream::launch_host_function(stream.cu_stream(), gate_wait, raw) };
    if r.is_err() {
        // SAFETY: the driver refused the call, so the callback will never run: reclaim the Arc.
        drop(unsafe { Arc::from_raw(raw.cast::<Gate>().cast_const()) });
    }
    r.map_err(driver("cuLaunchHostFunc"))
}
