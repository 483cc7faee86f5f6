//! A worker's whole life in one call: [`serve_latest`] opens a session, attaches the latest
//! version of a model, serves it, and after a server drain (a hot swap) attaches the latest
//! version again, until it is stopped; [`stop_on_signals`] stops it on SIGTERM or SIGINT;
//! [`run_process`] is a worker binary's `main` around both.
//!
//! What may pass (the server away, the model not loaded yet) is retried with backoff; what
//! will not ([`WorkerError::is_fatal`]) ends the call with the error.

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Handler, ServeEnd, ServeOptions};
use crate::{ConnectOptions, Model, Session, SessionOptions, WorkerError};

/// First delay before trying again; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest delay between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Which server and model a worker serves, and the name it shows.
#[derive(Debug, Clone)]
pub struct Target {
    /// Server address: `unix:/path`, `http://host:port` or `https://host:port`.
    pub server: String,
    /// The model; its latest ready version is served.
    pub model: String,
    /// Worker name shown by `modelshare ps`.
    pub worker_name: String,
    /// Token and TLS settings (see [`ConnectOptions::from_env`]).
    pub connect: ConnectOptions,
}

/// Serves `target.model` until `stop` is cancelled (then `Ok`). For each version attached,
/// `setup` builds the handler and the serve options (whose own `stop` is replaced by
/// `stop`); a setup error that [`WorkerError::is_fatal`] (such as
/// [`WorkerError::Unservable`]) ends the call, any other is retried.
pub async fn serve_latest<H, F>(
    target: &Target,
    stop: CancellationToken,
    mut setup: F,
) -> Result<(), WorkerError>
where
    H: Handler,
    F: FnMut(Arc<Model>) -> Result<(ServeOptions, H), WorkerError>,
{
    let Some(session) = retry(&stop, "open a session", || {
        Session::open_with(
            &target.server,
            SessionOptions {
                worker_name: target.worker_name.clone(),
                connect: target.connect.clone(),
                ..SessionOptions::default()
            },
        )
    })
    .await?
    else {
        return Ok(());
    };
    info!(session = %session.id(), server = %target.server, "session open");
    loop {
        let Some(model) =
            retry(&stop, "attach the model", || session.attach(&target.model)).await?
        else {
            return Ok(());
        };
        let model = Arc::new(model);
        info!(model = %model.name(), version = model.version(), "attached");
        let served = match setup(model.clone()) {
            Ok((mut options, handler)) => {
                options.stop = stop.clone();
                session.serve(&model, options, handler).await
            }
            Err(e) => Err(e),
        };
        match served {
            Ok(ServeEnd::Stopped) => {
                // Release the lease, then say goodbye (a lease released after the session
                // ended would be refused, and logged as such).
                if let Ok(model) = Arc::try_unwrap(model) {
                    let _ = model.release().await;
                }
                session.close().await;
                return Ok(());
            }
            Ok(ServeEnd::Drained { reason }) => {
                info!(%reason, "drained; attaching the latest version again");
            }
            Err(e) if e.is_fatal() => {
                session.close().await;
                return Err(e);
            }
            Err(e) => {
                warn!(error = %e, "serving ended; attaching again");
                tokio::select! {
                    () = tokio::time::sleep(MAX_BACKOFF) => {}
                    () = stop.cancelled() => return Ok(()),
                }
            }
        }
    }
}

/// A worker process's `main`: on a new multi-threaded runtime, builds the [`Target`] (reading
/// the token and TLS settings there), then [`serve_latest`] until SIGTERM or SIGINT
/// ([`stop_on_signals`]). Returns success once stopped; otherwise prints the error, each cause
/// once ([`crate::report`]), and returns failure.
pub fn run_process<H, F>(target: impl FnOnce() -> Result<Target, WorkerError>, setup: F) -> ExitCode
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
    let result = runtime.block_on(async move {
        let target = target()?;
        let stop = CancellationToken::new();
        tokio::spawn(stop_on_signals(stop.clone()));
        serve_latest(&target, stop, setup).await
    });
    match result {
        Ok(()) => {
            info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", crate::report(&e));
            ExitCode::FAILURE
        }
    }
}

/// Runs `attempt` until it succeeds (`Some`), `stop` is cancelled (`None`), or it fails with
/// a fatal error.
async fn retry<T, F, Fut>(
    stop: &CancellationToken,
    what: &str,
    mut attempt: F,
) -> Result<Option<T>, WorkerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, WorkerError>>,
{
    let mut backoff = MIN_BACKOFF;
    loop {
        let result = tokio::select! {
            r = attempt() => r,
            () = stop.cancelled() => return Ok(None),
        };
        match result {
            Ok(v) => return Ok(Some(v)),
            Err(e) if e.is_fatal() => return Err(e),
            Err(e) => warn!(error = %e, "cannot {what}; retrying in {backoff:?}"),
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop.cancelled() => return Ok(None),
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Cancels `stop` on the first SIGTERM or SIGINT (the worker drains, then exits); exits the
/// process with status 1 at once on the second.
pub async fn stop_on_signals(stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        warn!("cannot listen for signals");
        return;
    };
    for first in [true, false] {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        if first {
            info!("signal: draining");
            stop.cancel();
        } else {
            info!("second signal: exiting now");
            std::process::exit(1);
        }
    }
}
