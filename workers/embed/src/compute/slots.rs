//! [`Slots`]: several compute threads, each owning an encoder of its own (on CUDA its own
//! stream, activation buffers and cuBLAS handle, in the process's one context), so that one
//! worker keeps several batches on the GPU at once, as several workers under MPS would,
//! without sharing a fault domain with other processes. A batch goes to the slot with the
//! fewest batches in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use modelshare_worker::CancellationToken;

use super::job::{Encoded, OnFatal};
use super::thread::ComputeThread;
use crate::encoder::{EncodeError, Encoder};
use crate::tokenize::Sequence;

/// The compute threads of one served version.
#[derive(Debug)]
pub struct Slots {
    /// Each thread, and its batches in flight.
    slots: Vec<(ComputeThread, AtomicUsize)>,
}

impl Slots {
    /// Starts `n` (at least 1) compute threads named `name-0`, `name-1`..., the encoder of
    /// slot `i` made by `make(i)` on its thread; `on_fatal` is called by a slot whose encoder
    /// cannot go on after a panic. Returns once every slot is built, or the first error (the
    /// slots already started are then joined).
    pub fn start<M, F>(
        n: usize,
        name: &str,
        make: M,
        on_fatal: Arc<dyn Fn(String) + Send + Sync>,
        profile: bool,
    ) -> Result<Self, EncodeError>
    where
        M: Fn(usize) -> F,
        F: FnOnce() -> Result<Box<dyn Encoder>, EncodeError> + Send + 'static,
    {
        let mut slots = Vec::with_capacity(n.max(1));
        for i in 0..n.max(1) {
            let fatal = on_fatal.clone();
            let on_fatal: OnFatal = Box::new(move |reason| fatal(reason));
            let thread = ComputeThread::start(&format!("{name}-{i}"), make(i), on_fatal, profile)?;
            slots.push((thread, AtomicUsize::new(0)));
        }
        Ok(Self { slots })
    }

    /// Length of a sentence vector.
    pub fn hidden(&self) -> usize {
        self.slots[0].0.hidden()
    }

    /// [`ComputeThread::encode`] on the slot with the fewest batches in flight (the first of
    /// those tied).
    pub async fn encode(
        &self,
        seqs: Vec<Sequence>,
        cancels: Vec<CancellationToken>,
    ) -> Result<Encoded, EncodeError> {
        let (thread, in_flight) = self
            .slots
            .iter()
            .min_by_key(|(_, in_flight)| in_flight.load(Ordering::Relaxed))
            .expect("a slot at least");
        in_flight.fetch_add(1, Ordering::Relaxed);
        let _done = InFlight(in_flight);
        thread.encode(seqs, cancels).await
    }
}

/// One batch in flight on a slot, counted off when it ends (or its caller goes away).
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
