//! The worker process's life: what the SDK's `serve::run_process` does (a runtime, then
//! `serve_latest` until SIGTERM or SIGINT), with one more way to stop: [`Stop::fail`], which
//! the compute thread calls when its encoder panicked and cannot go on. That stop is served
//! like a signal's (no new batch is taken, the batches held are answered, the lease is
//! released, the session is closed, the compute thread is joined), so the server requeues
//! nothing of this worker's; then the process exits with [`FAILED`] for its supervisor to
//! start a fresh one.

use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use modelshare_worker::serve::{ServeOptions, Target, serve_latest, stop_on_signals};
use modelshare_worker::{CancellationToken, Handler, Model, WorkerError, report};
use tracing::{error, info};

/// The exit status after [`Stop::fail`]: `EX_SOFTWARE`, an internal error.
const FAILED: u8 = 70;

/// How the worker is told to stop: a signal, or a failure it cannot serve past.
#[derive(Debug, Clone, Default)]
pub struct Stop {
    token: CancellationToken,
    failure: Arc<OnceLock<String>>,
}

impl Stop {
    /// Stops serving because of `reason` (the first reason given is kept); the process then
    /// exits with a failure.
    pub fn fail(&self, reason: String) {
        let _ = self.failure.set(reason);
        self.token.cancel();
    }

    /// The failure that stopped the worker, if one did.
    fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }
}

/// A worker process's `main`: on a new multi-threaded runtime, builds the [`Target`], then
/// serves it until a signal or `stop` fails it. Exits with success once stopped by a signal,
/// [`FAILED`] after [`Stop::fail`], and failure on an error (printed with its causes).
pub fn run<H, F>(
    target: impl FnOnce() -> Result<Target, WorkerError>,
    stop: &Stop,
    setup: F,
) -> ExitCode
where
    H: Handler,
    F: FnMut(Arc<Model>) -> Result<(ServeOptions, H), WorkerError>,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let target = target()?;
        tokio::spawn(stop_on_signals(stop.token.clone()));
        serve_latest(&target, stop.token.clone(), setup).await
    });
    exit_code(result, stop)
}

/// The process's status after serving ended with `result`.
fn exit_code(result: Result<(), WorkerError>, stop: &Stop) -> ExitCode {
    match (result, stop.failure()) {
        (Err(e), _) => {
            eprintln!("error: {}", report(&e));
            ExitCode::FAILURE
        }
        (Ok(()), Some(reason)) => {
            error!(%reason, "stopped after a failure; exiting");
            eprintln!("error: {reason}");
            ExitCode::from(FAILED)
        }
        (Ok(()), None) => {
            info!("stopped");
            ExitCode::SUCCESS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure would not stop the serve loop, or the process would exit 0 after it (its
    /// supervisor would not restart it) or lose the first reason.
    #[test]
    fn a_failure_stops_serving_and_fails_the_process() {
        let stop = Stop::default();
        assert_eq!(exit_code(Ok(()), &stop), ExitCode::SUCCESS);
        let serving = stop.clone();
        stop.fail("the encoder panicked: boom".into());
        stop.fail("a later reason".into());
        assert!(serving.token.is_cancelled(), "the serve loop's token");
        assert_eq!(serving.failure(), Some("the encoder panicked: boom"));
        assert_eq!(exit_code(Ok(()), &stop), ExitCode::from(FAILED));
        assert_eq!(
            exit_code(Err(WorkerError::SessionEnded), &stop),
            ExitCode::FAILURE
        );
    }
}
