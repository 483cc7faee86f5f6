//! The arena's **ready event**: an inter-process event that completes only after the last
//! copy of a load, so that a worker may attach while a version is still loading and its first
//! kernels wait on the device, with no host round trip.
//!
//! The event is recorded *when the arena is created*, on a gate stream, behind a host function
//! that blocks until the load is complete ([`sys::Gate`]). A worker's `cuStreamWaitEvent`
//! therefore always refers to a record that has been issued and that completes only after the
//! last copy. (Waiting on an event that was never recorded would not wait at all.) A failed
//! load opens the gate too; the server then ends the sessions that held the version.
//!
//! The gate streams and ready events live in a **separate (non-primary) context** of the same
//! device. A stream blocked on a gate must never be waited for by a context-wide
//! synchronisation of the working context, which several driver calls perform implicitly
//! (`cuMemFree`, lazy kernel loading): in one context, freeing another version's arena during
//! a load, or the first launch of a kernel, would wait for the gate, and the gate for the load.
//! For the same reason the checksum kernel is loaded once when the backend opens.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use super::sys;
use crate::error::{DeviceError, Result};

/// A ready event with its gate, in the gate context.
#[derive(Debug)]
pub(crate) struct ReadyEvent {
    ctx: Arc<CudaContext>,
    event: sys::Event,
    gate: Arc<sys::Gate>,
    stream: Arc<CudaStream>,
}

impl ReadyEvent {
    /// Records a new inter-process event in `gate_ctx` behind a closed gate.
    pub(crate) fn gated(gate_ctx: &Arc<CudaContext>) -> Result<Self> {
        let event = sys::Event::interprocess(gate_ctx)?;
        let gate = Arc::new(sys::Gate::default());
        gate_ctx.bind_to_thread().map_err(|e| DeviceError::Cuda {
            op: "cuCtxSetCurrent",
            source: e,
        })?;
        let stream = gate_ctx.new_stream().map_err(|e| DeviceError::Cuda {
            op: "cuStreamCreate",
            source: e,
        })?;
        sys::enqueue_gate(&stream, &gate)?;
        if let Err(e) = event.record(&stream) {
            gate.open();
            return Err(e);
        }
        Ok(Self {
            ctx: gate_ctx.clone(),
            event,
            gate,
            stream,
        })
    }

    /// Lets the event complete (after the copies already enqueued). Idempotent.
    pub(crate) fn open(&self) {
        self.gate.open();
    }

    /// The event's IPC handle.
    pub(crate) fn ipc_handle(&self) -> Result<[u8; sys::IPC_HANDLE_BYTES]> {
        self.event.ipc_handle()
    }
}

impl Drop for ReadyEvent {
    fn drop(&mut self) {
        // Never leave the gate stream blocked: open the gate, let the stream drain, then the
        // event goes (fields drop after this).
        self.gate.open();
        if self.ctx.bind_to_thread().is_ok()
            && let Err(e) = self.stream.synchronize()
        {
            tracing::warn!(error = %e, "gate stream did not drain");
        }
    }
}
