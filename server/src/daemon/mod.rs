//! Running the server: backend, listeners (TCP and/or Unix socket, plus the handle socket),
//! health and reflection, start-up models, and graceful shutdown.
//!
//! Health is NOT_SERVING until every start-up model is loaded; on shutdown it flips back to
//! NOT_SERVING, listeners stop accepting, in-flight requests get the grace period, sessions
//! end, and only then is device memory released.
//!
//! # Layout
//! - here: [`run`] and [`run_notify`], the daemon's life in order.
//! - `error`: [`ServeError`], why the server could not start or stopped.
//! - `startup`: the configuration fitted to this process ([`fit_to_fd_limit`]), then the
//!   devices, metrics and tenants opened into the app.
//! - `background`: the timer, the dispatch of model events, the held-memory sweep, the
//!   tenants' reload on SIGHUP.
//! - `readiness`: the health service, NOT_SERVING until the start-up models are loaded.
//! - `listeners`: the handle socket, the HTTP port, gRPC over TCP and over a Unix socket
//!   ([`bind_unix`]), where they listen ([`Bound`]), and the socket files they leave.
//! - `grpc`: the gRPC server of a listener: middleware, services, TLS.
//! - `models`: the start-up models.
//! - `shutdown`: a listener's failure, and the graceful shutdown.

mod background;
mod error;
mod grpc;
mod listeners;
mod models;
mod readiness;
mod shutdown;
mod startup;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::task::JoinSet;
use tonic_health::server::HealthReporter;
use tracing::info;

use crate::app::App;
use crate::config::Config;

use self::listeners::Tasks;
use self::shutdown::{first_failure, graceful_shutdown};

pub use self::error::ServeError;
pub use self::listeners::{Bound, bind_unix};
pub use self::startup::fit_to_fd_limit;

/// Runs the server until `shutdown` resolves, then shuts down gracefully.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
    run_notify(config, shutdown, None).await
}

/// [`run`], sending where it listens on `ready` once every start-up model is loaded.
pub async fn run_notify(
    config: Config,
    shutdown: impl Future<Output = ()>,
    ready: Option<tokio::sync::oneshot::Sender<Bound>>,
) -> Result<(), ServeError> {
    // SIGHUP's default action ends the process: take it over before anything slow (opening a
    // GPU takes seconds), so that a reload sent while starting is not fatal.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    let config = Arc::new(startup::fit_config(config)?);
    let app = startup::open_app(config)?;
    background::spawn_reload_on_sighup(&app, hup);
    background::spawn(&app);
    let (reporter, health) = readiness::health_service(&app).await;

    let mut tasks = JoinSet::new();
    // Every socket file this server binds goes when it stops, failed start included.
    let mut socket_files = listeners::SocketFiles::default();
    let bound = listeners::start(&app, &health, &mut tasks, &mut socket_files).await?;

    tokio::pin!(shutdown);
    let result = serve(&app, &reporter, &mut tasks, shutdown, &bound, ready).await;
    graceful_shutdown(&app, &reporter, &mut tasks, socket_files).await;
    result
}

/// Loads the start-up models while the listeners run; once every one is loaded, reports the
/// server ready (health SERVING, `ready` sent), then serves until `shutdown` resolves or a
/// listener fails. A shutdown before the models are loaded is no error.
async fn serve(
    app: &App,
    reporter: &HealthReporter,
    tasks: &mut Tasks,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    bound: &Bound,
    ready: Option<tokio::sync::oneshot::Sender<Bound>>,
) -> Result<(), ServeError> {
    let started = tokio::select! {
        r = models::load_startup_models(app) => r.map(|()| true),
        r = first_failure(tasks) => r.map(|()| false),
        () = shutdown.as_mut() => Ok(false),
    };
    match started {
        Ok(true) => {
            readiness::mark_ready(app, reporter).await;
            info!(models = app.config.models.len(), "ready");
            if let Some(tx) = ready {
                let _ = tx.send(bound.clone());
            }
            tokio::select! {
                () = shutdown.as_mut() => { info!("shutdown requested"); Ok(()) }
                r = first_failure(tasks) => r,
            }
        }
        Ok(false) => Ok(()),
        Err(e) => Err(e),
    }
}
