//! The server's descriptors: [`raise_fd_limit`] at start, and accepting connections without
//! spinning: when `accept` fails (descriptors exhausted,
//! `EMFILE`/`ENFILE`, or any other error), the listener waits before it tries again, and says
//! so in the log at most every [`WARN_EVERY`], instead of retrying at once in a loop that
//! takes a whole core and floods nothing but the CPU. Once a descriptor frees, accepting
//! resumes by itself.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_stream::{Stream, StreamExt};
use tracing::warn;

/// How long a listener waits after a failed accept.
pub const PAUSE: Duration = Duration::from_millis(100);
/// The most often a listener logs its failed accepts.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// `incoming`, waiting [`PAUSE`] after each error it yields (the error is still passed on).
pub fn paced<S, T>(incoming: S, listener: &'static str) -> impl Stream<Item = io::Result<T>>
where
    S: Stream<Item = io::Result<T>>,
{
    let warned: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    incoming.then(move |conn| {
        let warned = warned.clone();
        async move {
            if let Err(e) = &conn {
                pause(listener, e, &warned).await;
            }
            conn
        }
    })
}

/// Logs `e` unless logged within [`WARN_EVERY`], then waits [`PAUSE`].
pub async fn pause(listener: &str, e: &io::Error, warned: &Mutex<Option<Instant>>) {
    let now = Instant::now();
    let due = {
        let mut last = warned.lock().unwrap_or_else(|p| p.into_inner());
        let due = last.is_none_or(|at| now.duration_since(at) >= WARN_EVERY);
        if due {
            *last = Some(now);
        }
        due
    };
    if due {
        let hint = if matches!(e.raw_os_error(), Some(23 | 24)) {
            "; out of file descriptors: raise the limit (ulimit -n) or close idle clients"
        } else {
            ""
        };
        warn!(listener, error = %e, "accepting a connection failed{hint}; pausing before the next");
    }
    tokio::time::sleep(PAUSE).await;
}

/// Raises the soft limit on open files to the hard limit (every connection, session pidfd,
/// ticket and arena holds descriptors; the soft default of 1024 is easily reached). Returns
/// `(before, after)` when it changed, for the start-up log.
pub fn raise_fd_limit() -> Option<(u64, u64)> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let (Some(soft), hard) = (limit.current, limit.maximum) else {
        return None; // already unlimited
    };
    let target = hard.unwrap_or(u64::MAX);
    if target <= soft {
        return None;
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: hard,
            maximum: hard,
        },
    )
    .ok()?;
    Some((soft, target))
}

/// The soft limit on open files; `None` when unlimited.
pub fn fd_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}
