//! The tokio runtime the module owns, and how Python threads wait on it.
//!
//! The SDK is async: a session's supervisor task (heartbeats, events, reconnection) must keep
//! running while Python does something else, so the runtime is a multi-threaded one of its own
//! (two worker threads), made on first use. A Python thread that calls into the SDK runs the
//! call inside the runtime on its own thread with the GIL released ([`wait`]), waking every
//! 100 ms to let Python handle signals (Ctrl-C drops the call and raises `KeyboardInterrupt`).
//!
//! After `os.fork()` the child has none of the parent's threads: the first call in the child
//! makes a runtime of its own (the parent's is left alone, never dropped). Sessions opened
//! before the fork belong to the parent and cannot be used in the child.

use std::future::Future;
use std::ops::Deref;
use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

use crate::errors::{Error, Timeout};

/// How often a waiting thread takes the GIL back to let Python run its signal handlers.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// The runtime and the process it was made in.
static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);

/// The module's runtime (this process's: a forked child makes its own).
pub(crate) fn runtime() -> PyResult<&'static Runtime> {
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if let Some((owner, rt)) = *slot
        && owner == pid
    {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("modelshare-rt")
        .enable_all()
        .build()
        .map_err(|e| Error::new_err(format!("cannot start the modelshare runtime: {e}")))?;
    // Never dropped: tasks of sessions still open may run until the process exits.
    let rt: &'static Runtime = Box::leak(Box::new(rt));
    *slot = Some((pid, rt));
    Ok(rt)
}

/// Runs `fut` on the calling thread, inside the runtime (its timers and I/O; the tasks it
/// spawns run on the runtime's threads), with the GIL released, and returns its output.
/// `timeout` bounds the wait (`modelshare.Timeout`, naming `what`); a signal handler that
/// raises (Ctrl-C) drops the call and its exception is returned. Polling here rather than on
/// a spawned task saves two thread hand-offs per call (an attach is about a millisecond). An
/// attach cut short after the server granted its lease leaves that lease to the session's end
/// (the SDK had no `Model` yet to release it).
pub(crate) fn wait<F>(
    py: Python<'_>,
    what: &str,
    timeout: Option<Duration>,
    fut: F,
) -> PyResult<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let call = async move {
        match timeout {
            Some(limit) => tokio::time::timeout(limit, fut).await.ok(),
            None => Some(fut.await),
        }
    };
    match drive(py, call, None)? {
        Some(output) => Ok(output),
        None => Err(Timeout::new_err(format!(
            "{what} did not finish within {:.3} s",
            timeout.unwrap_or_default().as_secs_f64()
        ))),
    }
}

/// Runs `fut` as [`wait`] does, with no timeout, for a call that can stop cleanly: the first
/// signal handler that raises cancels `stop` and the call goes on to its clean end, after
/// which that exception is returned; a second one drops the call at once and is returned.
pub(crate) fn wait_stoppable<F>(
    py: Python<'_>,
    stop: &CancellationToken,
    fut: F,
) -> PyResult<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    drive(py, fut, Some(stop))
}

/// The one waiting loop: polls `fut` inside the runtime with the GIL released, waking every
/// [`SIGNAL_CHECK`] to run Python's signal handlers (see [`wait_stoppable`] for `stop`). A
/// call dropped before its end is dropped inside the runtime (its parts may spawn or need the
/// runtime's context to go).
fn drive<F>(py: Python<'_>, fut: F, stop: Option<&CancellationToken>) -> PyResult<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let rt = runtime()?;
    let mut call = Box::pin(fut);
    let mut interrupted: Option<PyErr> = None;
    let drop_inside = |call| {
        let _inside = rt.enter();
        drop(call);
    };
    loop {
        // The timer is made inside `block_on`, where the runtime's clock is at hand.
        let waited = py
            .detach(|| rt.block_on(async { tokio::time::timeout(SIGNAL_CHECK, &mut call).await }));
        match waited {
            Ok(output) => {
                drop_inside(call);
                return match interrupted {
                    Some(e) => Err(e),
                    None => Ok(output),
                };
            }
            Err(_still_running) => {
                if let Err(e) = py.check_signals() {
                    match stop {
                        Some(stop) if interrupted.is_none() => {
                            stop.cancel();
                            interrupted = Some(e);
                        }
                        _ => {
                            drop_inside(call);
                            return Err(e);
                        }
                    }
                }
            }
        }
    }
}

/// A timeout from Python (seconds, `None`: no limit); refuses a negative or non-finite one.
pub(crate) fn seconds(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    timeout
        .map(|s| {
            Duration::try_from_secs_f64(s).map_err(|_| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "timeout must be a number of seconds, 0 or more, not {s}"
                ))
            })
        })
        .transpose()
}

/// An SDK value dropped inside the runtime: dropping a `Model` spawns the release of its lease,
/// which needs a runtime at hand, and the last reference may go on any thread (a Python thread,
/// or a DLPack consumer's deleter).
#[derive(Debug)]
pub(crate) struct OnRuntime<T>(Option<T>);

impl<T> OnRuntime<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(Some(value))
    }

    /// The value, taken out (it is then dropped wherever the caller drops it).
    pub(crate) fn take(mut self) -> Option<T> {
        self.0.take()
    }
}

impl<T> Deref for OnRuntime<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // Only `take`, which consumes `self`, empties it.
        self.0
            .as_ref()
            .expect("an OnRuntime holds its value until dropped")
    }
}

impl<T> Drop for OnRuntime<T> {
    fn drop(&mut self) {
        let value = self.0.take();
        match runtime() {
            Ok(rt) => {
                let _inside = rt.enter();
                drop(value);
            }
            Err(_) => drop(value),
        }
    }
}
