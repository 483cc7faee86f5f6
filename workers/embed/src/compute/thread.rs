//! [`ComputeThread`], the handle on the compute thread: starting it with its encoder, sending
//! it jobs, and joining it when dropped.

use std::sync::mpsc;
use std::thread::{self, JoinHandle};

use modelshare_worker::CancellationToken;
use tokio::sync::oneshot;
use tracing::{debug, error};

use super::job::{Encoded, Job, OnFatal, ThreadEnd};
use super::panics::panic_message;
use super::serve::serve;
use crate::encoder::{EncodeError, Encoder};
use crate::tokenize::Sequence;

/// The handle on the compute thread. Dropping it ends the thread: its channel closes, the
/// thread finishes the job at hand (and those queued whose callers still wait), drops the
/// encoder and is joined.
#[derive(Debug)]
pub struct ComputeThread {
    /// `None` only while dropping.
    jobs: Option<mpsc::Sender<Job>>,
    /// `None` only while dropping.
    thread: Option<JoinHandle<ThreadEnd>>,
    hidden: usize,
}

impl ComputeThread {
    /// Starts the thread and builds the encoder on it with `make` (a CUDA encoder binds its
    /// context to the thread that makes it). Returns once it is built, or its error (the
    /// thread joined).
    /// With `profile`, the thread logs where its time went when it ends (see
    /// [`crate::worker::Config::profile`]).
    pub fn start<F>(
        name: &str,
        make: F,
        on_fatal: OnFatal,
        profile: bool,
    ) -> Result<Self, EncodeError>
    where
        F: FnOnce() -> Result<Box<dyn Encoder>, EncodeError> + Send + 'static,
    {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || match make() {
                Ok(encoder) => {
                    let _ = ready_tx.send(Ok(encoder.hidden()));
                    drop(ready_tx);
                    serve(encoder, rx, on_fatal, profile)
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    Ok(())
                }
            })
            .map_err(|e| EncodeError::Device(format!("cannot start the compute thread: {e}")))?;
        let mut compute = Self {
            jobs: Some(jobs),
            thread: Some(thread),
            hidden: 0,
        };
        match ready_rx.recv() {
            Ok(Ok(hidden)) => {
                compute.hidden = hidden;
                Ok(compute)
            }
            Ok(Err(e)) => Err(e),
            // `make` panicked: the thread has ended; its panic is logged when it is joined.
            Err(_) => {
                let reason = compute
                    .join()
                    .err()
                    .unwrap_or_else(|| "it ended".to_owned());
                Err(EncodeError::Device(format!(
                    "the compute thread failed while starting: {reason}"
                )))
            }
        }
    }

    /// Length of a sentence vector.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// The sentence vectors of `seqs`, `[seqs.len(), hidden]` row-major, in their order;
    /// `cancels` (one per sequence, or none) are looked at between groups.
    pub async fn encode(
        &self,
        seqs: Vec<Sequence>,
        cancels: Vec<CancellationToken>,
    ) -> Result<Encoded, EncodeError> {
        let ended = || EncodeError::Stopped("the compute thread has ended".into());
        let (reply, answer) = oneshot::channel();
        self.jobs
            .as_ref()
            .ok_or_else(ended)?
            .send(Job {
                seqs,
                sent: std::time::Instant::now(),
                cancels,
                reply,
            })
            .map_err(|_| ended())?;
        // The thread drops a job unanswered only as it ends (after a panic).
        answer.await.unwrap_or_else(|_| Err(ended()))
    }

    /// Closes the channel and joins the thread, logging how it ended; `Err` with a panic's
    /// message if it panicked outside the loop's own catch (in `make`, or dropping the
    /// encoder). This blocks (on the runtime, where the handler is dropped) for the job at
    /// hand at most: the serve loop has answered every batch before it drops the handler,
    /// and jobs whose callers went away are skipped.
    fn join(&mut self) -> Result<(), String> {
        drop(self.jobs.take());
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        match thread.join() {
            Ok(Ok(())) => {
                debug!("the compute thread has ended");
                Ok(())
            }
            // Logged at error level when it happened.
            Ok(Err(reason)) => {
                debug!(%reason, "the compute thread had stopped");
                Ok(())
            }
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                error!(panic = %message, "the compute thread panicked");
                Err(message)
            }
        }
    }
}

impl Drop for ComputeThread {
    fn drop(&mut self) {
        let _ = self.join();
    }
}
