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
//!
//! A streaming worker's items come one at a time ([`Handler::handle_stream`]) and run the same
//! way, on the same threads: the adapter's `stream(batch_id, version, item, streamed, parts)`
//! iterates the user's generator, handing each part to `parts` ([`Parts`]), which waits until
//! the serve loop has sent it within the item's window; it returns the final answer. An item
//! holds its thread while it streams, so a streaming worker has a thread per stream.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use modelshare_worker::Handler;
use modelshare_worker::serve::{Batch, Item as SdkItem, ItemFailure, Outcome, Output, PartSink};
use pyo3::prelude::*;
use pyo3::types::PyList;
use tokio::sync::{mpsc as parts_channel, oneshot};

use crate::item::Item;
use crate::outcome::{outcome, outcomes};
use crate::parts::Parts;

/// Work for a handler thread, and where its answers go.
enum Job {
    /// A batch.
    Batch(Batch, oneshot::Sender<Vec<Outcome>>),
    /// One item of a streaming worker: its parts go to `parts`, its final answer to `answer`.
    Stream {
        item: SdkItem,
        batch_id: u64,
        version: u32,
        streamed: bool,
        parts: parts_channel::Sender<Output>,
        answer: oneshot::Sender<Outcome>,
    },
}

impl Job {
    /// Whether whoever waits for the answer stopped waiting.
    fn abandoned(&self) -> bool {
        match self {
            Job::Batch(_, answer) => answer.is_closed(),
            Job::Stream { answer, .. } => answer.is_closed(),
        }
    }
}

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
            let job = match job {
                Ok(job) => job,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            // Its caller stopped waiting (the stream broke or serving stopped, and the server
            // requeues its items): not run.
            if job.abandoned() {
                continue;
            }
            match job {
                Job::Batch(batch, answer) => {
                    let items = batch.items.len();
                    let answers =
                        std::panic::catch_unwind(AssertUnwindSafe(|| run(py, &call, batch)))
                            .unwrap_or_else(|_| vec![Err(thread_failed()); items]);
                    let _ = answer.send(answers);
                }
                Job::Stream {
                    item,
                    batch_id,
                    version,
                    streamed,
                    parts,
                    answer,
                } => {
                    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        run_stream(py, &call, (batch_id, version, item, streamed), parts)
                    }))
                    .unwrap_or_else(|_| Err(thread_failed()));
                    let _ = answer.send(outcome);
                }
            }
        }
        // The callable's last reference, if this is it, goes with the GIL held.
        drop(call);
    });
}

fn thread_failed() -> ItemFailure {
    ItemFailure::internal("the worker's handler thread failed".to_owned())
}

impl Handler for PyHandler {
    async fn handle(&self, batch: Batch) -> Vec<Outcome> {
        let items = batch.items.len();
        let (answer, answers) = oneshot::channel();
        if self.jobs.send(Job::Batch(batch, answer)).is_err() {
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

    /// Runs the item on a handler thread and sends each part it yields within the item's
    /// window; a part that cannot be sent (the item cancelled, the stream gone) closes the
    /// parts' channel, and the handler's generator is stopped at its next part.
    async fn handle_stream(&self, item: SdkItem, mut sink: PartSink) -> Outcome {
        let (parts, mut sent) = parts_channel::channel(1);
        let (answer, mut answered) = oneshot::channel();
        // A cancel answers the item at once, even while the handler computes without yielding
        // or its job waits for a thread: the server frees its slot; the handler's generator
        // is closed at its next part.
        let cancelled = item.cancellation();
        let job = Job::Stream {
            item,
            batch_id: sink.batch_id(),
            version: sink.version(),
            streamed: sink.is_streamed(),
            parts,
            answer,
        };
        if self.jobs.send(job).is_err() {
            return Err(ItemFailure::internal(
                "the worker's handler threads are gone".to_owned(),
            ));
        }
        loop {
            // Parts first: the thread sends its last part before its answer.
            tokio::select! {
                biased;
                part = sent.recv() => match part {
                    Some(part) => {
                        if sink.send(part).await.is_err() {
                            sent.close();
                        }
                    }
                    None => break,
                },
                outcome = &mut answered => {
                    // The thread sends its last part before its answer, but both may come
                    // between the polls above (the channel looked empty, then the answer was
                    // there): what it sent first goes first, or the part would be lost.
                    while let Ok(part) = sent.try_recv() {
                        if sink.send(part).await.is_err() {
                            break;
                        }
                    }
                    return outcome.unwrap_or_else(|_| Err(thread_failed()));
                }
                () = cancelled.cancelled() => {
                    sent.close();
                    return Err(ItemFailure::cancelled("the server cancelled the item"));
                }
            }
        }
        tokio::select! {
            outcome = answered => outcome.unwrap_or_else(|_| Err(thread_failed())),
            () = cancelled.cancelled() => Err(ItemFailure::cancelled("the server cancelled the item")),
        }
    }
}

/// Calls the adapter's `stream` on one item of a streaming worker: its parts go through
/// `parts` ([`Parts`]), and its final answer is read as one of `outcome`'s form.
fn run_stream(
    py: Python<'_>,
    call: &Py<PyAny>,
    (batch_id, version, item, streamed): (u64, u32, SdkItem, bool),
    parts: parts_channel::Sender<Output>,
) -> Outcome {
    let answered = call.call_method1(
        py,
        "stream",
        (
            batch_id,
            version,
            Item::new(item),
            streamed,
            Parts::new(parts),
        ),
    );
    match answered {
        Ok(answer) => outcome(answer.bind(py)).unwrap_or_else(|why| {
            Err(ItemFailure::internal(format!(
                "the worker's handler gave a bad answer: {why}"
            )))
        }),
        Err(e) => {
            let message = format!("the worker's handler failed: {e}");
            e.print(py);
            Err(ItemFailure::internal(message))
        }
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
