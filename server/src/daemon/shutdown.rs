//! How the daemon stops: a listener that ends before shutdown is a failure; a graceful
//! shutdown flips health to NOT_SERVING, stops accepting, gives requests the grace period,
//! then releases device memory and removes the socket files.

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{info, warn};

use super::error::ServeError;
use super::listeners::{SocketFiles, Tasks};
use crate::app::App;

/// Waits for the first listener task to end; an end before shutdown is an error.
pub(super) async fn first_failure(tasks: &mut Tasks) -> Result<(), ServeError> {
    match tasks.join_next().await {
        Some(Ok(Err(e))) => Err(e),
        Some(Ok(Ok(()))) | None => Err(ServeError::Backend(
            "a listener stopped unexpectedly".into(),
        )),
        Some(Err(join)) => Err(ServeError::Backend(format!(
            "a listener task failed: {join}"
        ))),
    }
}

/// Reports NOT_SERVING, stops every listener, waits the grace period for the listener tasks
/// (aborting those still running), releases the registry's memory and removes the socket
/// files.
pub(super) async fn graceful_shutdown(
    app: &App,
    reporter: &HealthReporter,
    tasks: &mut Tasks,
    socket_files: SocketFiles,
) {
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    app.host.shutdown.cancel();
    let grace = app.config.shutdown_grace;
    let drained =
        tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        warn!(
            grace_secs = grace.as_secs(),
            "requests still running after the grace period; closing them"
        );
        tasks.abort_all();
    }
    app.host.registry.shutdown();
    drop(socket_files);
    info!("stopped");
}
