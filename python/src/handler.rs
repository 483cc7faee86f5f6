//! [`PyHandler`]: the SDK's [`Handler`] over a Python callable.
//!
//! Batches run on `concurrency` threads of the handler's own, started with it and kept while
//! it serves, each with one Python thread state for its life: the runtime's threads, where the
//! session's heartbeats and the serve stream run, never wait for Python, and a slow handler
//! delays no heartbeat. The same few threads and thread states run every batch, so what Python
//! code and libraries keep per thread (`threading.local`, torch's per-thread state, its CPU
//! thread pool and cuBLAS handles) is made once, not for each batch as on the runtime's
//! blocking pool with a thread state per call.
//! The batches held beyond `concurrency` (up to `credits`) wait in the queue, ready, so the
//! next one starts as soon as a thread is free.
//!
//! The callable is `modelshare._serve`'s adapter around the user's handler: it takes
//! `(batch_id, version, items)` and returns the answers in `outcome`'s form, having turned the
//! user's exceptions into failed items. If it raises anyway, every item of the batch fails
//! with INTERNAL and the exception is printed.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use modelshare_worker::Handler;
use modelshare_worker::serve::{Batch, ItemFailure, Outcome};
use pyo3::prelude::*;
use pyo3::types::PyList;
use tokio::sync::oneshot;

use crate::item::Item;
use crate::outcome::outcomes;

/// A batch for a handler thread, and where its answers go.
type Job = (Batch, oneshot::Sender<Vec<Outcome>>);

/// A Python callable serving batches on threads of its own.
#[derive(Debug)]
pub(crate) struct PyHandler {
    /// The handler threads' queue.
    jobs: mpsc::Sender<Job>,
}

/// The handler's threads, joined by whoever started them once serving has ended.
#[derive(Debug)]
pub(crate) struct HandlerThreads {
    closed: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl HandlerThreads {
    /// Tells the threads to stop taking batches and waits for them to end (a batch running
    /// is finished first). Call without the GIL: they need it to end.
    pub(crate) fn join(self) {
        self.closed.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

impl PyHandler {
    /// `call` run on `concurrency` threads (at least 1), started now.
    pub(crate) fn new(
        call: Py<PyAny>,
        concurrency: usize,
    ) -> std::io::Result<(Self, HandlerThreads)> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let call = Arc::new(call);
        let closed = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for i in 0..concurrency.max(1) {
            let (queue, call, stop) = (queue.clone(), call.clone(), closed.clone());
            let started = std::thread::Builder::new()
                .name(format!("modelshare-handler-{i}"))
                .spawn(move || handler_thread(&queue, call, &stop));
            match started {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // Those started end at once.
                    HandlerThreads { closed, threads }.join();
                    return Err(e);
                }
            }
        }
        Ok((Self { jobs }, HandlerThreads { closed, threads }))
    }
}

/// How often a waiting handler thread looks whether serving has ended.
const CLOSED_CHECK: Duration = Duration::from_millis(50);

/// One handler thread: runs batches from `queue` until it closes or `closed` is set. It keeps
/// one Python thread state for its life (the GIL released while it waits for a batch), so
/// what Python code keeps per thread (`threading.local`, torch's per-thread state) lasts from
/// one batch to the next.
fn handler_thread(queue: &Mutex<mpsc::Receiver<Job>>, call: Arc<Py<PyAny>>, closed: &AtomicBool) {
    Python::attach(|py| {
        while !closed.load(Ordering::SeqCst) {
            // One thread waits on the queue at a time; the others wait for the lock.
            let job = py.detach(|| {
                queue
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .recv_timeout(CLOSED_CHECK)
            });
            let (batch, answer) = match job {
                Ok(job) => job,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            // Its caller stopped waiting (the stream broke or serving stopped, and the server
            // requeues its items): not run.
            if answer.is_closed() {
                continue;
            }
            let items = batch.items.len();
            let answers = std::panic::catch_unwind(AssertUnwindSafe(|| run(py, &call, batch)))
                .unwrap_or_else(|_| {
                    vec![
                        Err(ItemFailure::internal(
                            "the worker's handler thread failed".to_owned()
                        ));
                        items
                    ]
                });
            let _ = answer.send(answers);
        }
        // The callable's last reference, if this is it, goes with the GIL held.
        drop(call);
    });
}

impl Handler for PyHandler {
    async fn handle(&self, batch: Batch) -> Vec<Outcome> {
        let items = batch.items.len();
        let (answer, answers) = oneshot::channel();
        if self.jobs.send((batch, answer)).is_err() {
            return vec![
                Err(ItemFailure::internal(
                    "the worker's handler threads are gone".to_owned()
                ));
                items
            ];
        }
        answers.await.unwrap_or_else(|_| {
            vec![
                Err(ItemFailure::internal(
                    "the worker's handler thread ended".to_owned()
                ));
                items
            ]
        })
    }
}

/// Calls the handler on `batch` and reads its answers.
fn run(py: Python<'_>, call: &Py<PyAny>, batch: Batch) -> Vec<Outcome> {
    let count = batch.items.len();
    let answered = PyList::new(py, batch.items.into_iter().map(Item::new))
        .and_then(|items| call.call1(py, (batch.id, batch.version, items)));
    match answered {
        Ok(answers) => outcomes(answers.bind(py), count),
        Err(e) => {
            let message = format!("the worker's handler failed: {e}");
            e.print(py);
            vec![Err(ItemFailure::internal(message)); count]
        }
    }
}
