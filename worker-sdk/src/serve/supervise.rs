//! A worker's whole life in one call: [`serve_latest`] opens a session, attaches the latest
//! version of a model, serves it, and after a server drain (a hot swap) attaches the latest
//! version again, until it is stopped; [`stop_on_signals`] stops it on SIGTERM or SIGINT;
//! [`run_process`] is a worker binary's `main` around both.
//!
//! What may pass (the server away or restarting: UNAVAILABLE, a refused or lost connection;
//! the model's version not ready yet) is retried with backoff; what will not ends the call with
//! the error, and a worker's process with a failure:
//! - every error that [`WorkerError::is_fatal`] (no server found, bad credentials or options,
//!   INVALID_ARGUMENT, PERMISSION_DENIED, UNIMPLEMENTED, a model the worker cannot serve);
//! - UNAUTHENTICATED on opening the session: the worker's token is wrong or missing;
//! - NOT_FOUND on the first attach: the model is unknown, or its tenant may not see it.
//!
//! Once the worker has attached its model, UNAUTHENTICATED and NOT_FOUND are waited out
//! instead: a reconnection refused while a token file is rotated, or a model unloaded to be
//! loaded again, heal without a restart. A refusal that ends the call is a
//! [`WorkerError::Refused`], whose text names the cause and what to change.

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
    /// Server address: `unix:/path`, `http://host:port` or `https://host:port` (a worker's
    /// command line finds it with [`crate::discover()`] when not given one).
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
/// [`WorkerError::Unservable`]) ends the call, any other is retried. Refusals that will not
/// heal end it too (the module docs say which, and when): a wrong token, an unknown model.
pub async fn serve_latest<H, F>(
    target: &Target,
    stop: CancellationToken,
    mut setup: F,
) -> Result<(), WorkerError>
where
    H: Handler,
    F: FnMut(Arc<Model>) -> Result<(ServeOptions, H), WorkerError>,
{
    let opened = retry(&stop, "open a session", fatal_at_open, || {
        Session::open_with(
            &target.server,
            SessionOptions {
                worker_name: target.worker_name.clone(),
                connect: target.connect.clone(),
                ..SessionOptions::default()
            },
        )
    })
    .await;
    let Some(session) = opened.map_err(|e| refusal(e, &target.model))? else {
        return Ok(());
    };
    info!(session = %session.id(), server = %target.server, "session open");
    let mut attached_before = false;
    loop {
        let fatal = if attached_before {
            WorkerError::is_fatal
        } else {
            fatal_at_first_attach
        };
        let attached = retry(&stop, "attach the model", fatal, || {
            session.attach(&target.model)
        })
        .await;
        let model = match attached {
            Ok(Some(model)) => model,
            Ok(None) => return Ok(()),
            Err(e) => {
                session.close().await;
                return Err(refusal(e, &target.model));
            }
        };
        attached_before = true;
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
                return Err(refusal(e, &target.model));
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

/// Whether opening the session failed for good: [`WorkerError::is_fatal`], or the server
/// refused the worker's token (UNAUTHENTICATED: wrong, missing, or revoked).
fn fatal_at_open(e: &WorkerError) -> bool {
    e.is_fatal() || e.code() == Some(tonic::Code::Unauthenticated)
}

/// Whether the worker's first attach failed for good: [`WorkerError::is_fatal`], or the server
/// has no such model for the worker's tenant (NOT_FOUND: unknown, or not visible to it).
fn fatal_at_first_attach(e: &WorkerError) -> bool {
    e.is_fatal() || e.code() == Some(tonic::Code::NotFound)
}

/// `e` as a [`WorkerError::Refused`] saying what to change, when it is a refusal of the
/// worker's token, rights or model (`model`: the one it serves); any other error as it is.
fn refusal(e: WorkerError, model: &str) -> WorkerError {
    let WorkerError::Rpc { call, status } = e else {
        return e;
    };
    let hint = match status.code() {
        tonic::Code::Unauthenticated => {
            "the worker's token is missing or not one the server knows: give its tenant's token \
             with --token-file or --token (MODELSHARE_TOKEN_FILE or MODELSHARE_TOKEN)"
                .to_owned()
        }
        tonic::Code::PermissionDenied => "the worker's tenant may not do this: the server's \
             tenants file says what it may, or give the token of a tenant that may"
            .to_owned(),
        tonic::Code::NotFound => format!(
            "the server has no model '{model}', or the worker's tenant may not see it: load it \
             (modelshare load), share it with the tenant (modelshare access), or check --model"
        ),
        _ => return WorkerError::Rpc { call, status },
    };
    WorkerError::Refused { call, status, hint }
}

/// Runs `attempt` until it succeeds (`Some`), `stop` is cancelled (`None`), or it fails with
/// an error that `fatal` says retrying cannot fix.
async fn retry<T, F, Fut>(
    stop: &CancellationToken,
    what: &str,
    fatal: fn(&WorkerError) -> bool,
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
            Err(e) if fatal(&e) => return Err(e),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rpc(call: &'static str, code: tonic::Code) -> WorkerError {
        WorkerError::Rpc {
            call,
            status: tonic::Status::new(code, "the server's words"),
        }
    }

    /// What ends a worker and what it waits out. Fails if a wrong token or an unknown model
    /// are retried at the start again, if they become fatal midway (a token rotation, a model
    /// loaded again), or if a server away or restarting stops being waited for.
    #[test]
    fn refusals_are_fatal_only_where_they_never_heal() {
        use tonic::Code;
        let unauthenticated = rpc("Session", Code::Unauthenticated);
        let not_found = rpc("Attach", Code::NotFound);
        assert!(fatal_at_open(&unauthenticated));
        assert!(fatal_at_first_attach(&not_found));
        assert!(!unauthenticated.is_fatal() && !not_found.is_fatal());
        assert!(!fatal_at_open(&not_found));
        for fatal in [fatal_at_open, fatal_at_first_attach, WorkerError::is_fatal] {
            assert!(fatal(&rpc("Attach", Code::PermissionDenied)));
            for waited in [
                Code::Unavailable,
                Code::FailedPrecondition,
                Code::ResourceExhausted,
            ] {
                assert!(!fatal(&rpc("Attach", waited)), "{waited:?}");
            }
            assert!(!fatal(&WorkerError::SessionEnded));
        }
    }

    /// A refusal that ends the worker says the code, the server's words and what to change.
    #[test]
    fn a_fatal_refusal_names_its_cause() {
        use tonic::Code;
        let token = refusal(rpc("Session", Code::Unauthenticated), "minilm").to_string();
        assert_eq!(
            token,
            "Session refused: the server's words (UNAUTHENTICATED); the worker's token is \
             missing or not one the server knows: give its tenant's token with --token-file or \
             --token (MODELSHARE_TOKEN_FILE or MODELSHARE_TOKEN)"
        );
        let model = refusal(rpc("Attach", Code::NotFound), "minilm").to_string();
        assert!(
            model.starts_with(
                "Attach refused: the server's words (NOT_FOUND); the server has no model 'minilm'"
            ),
            "{model}"
        );
        let denied = refusal(rpc("Attach", Code::PermissionDenied), "minilm");
        assert!(denied.is_fatal(), "{denied}");
        assert!(
            denied.to_string().contains("(PERMISSION_DENIED)"),
            "{denied}"
        );
        // Anything else is left as it is.
        let other = refusal(rpc("Attach", Code::InvalidArgument), "minilm");
        assert!(matches!(other, WorkerError::Rpc { .. }), "{other:?}");
    }
}
