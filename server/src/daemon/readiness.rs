//! Health as the daemon reports it: NOT_SERVING from the start, SERVING (the server and each
//! service, and the host's ready flag) once every start-up model is loaded.

use modelshare_proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use modelshare_proto::v1::admin_service_server::AdminServiceServer;
use modelshare_proto::v1::worker_service_server::WorkerServiceServer;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthReporter;

use crate::app::App;
use crate::health::BoundedHealth;
use crate::service::admin::AdminApi;
use crate::service::inference::InferenceApi;
use crate::service::worker::WorkerApi;

/// The health service every gRPC listener serves, and its reporter; NOT_SERVING until
/// [`mark_ready`].
pub(super) async fn health_service(app: &App) -> (HealthReporter, HealthServer<BoundedHealth>) {
    let (reporter, _) = tonic_health::server::health_reporter();
    // `Watch` ends after the listeners' idle period, so an open one cannot keep a connection
    // from ever going idle.
    let health = HealthServer::new(BoundedHealth::new(
        reporter.clone(),
        app.config.connections.idle,
    ));
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    (reporter, health)
}

/// Reports the server and each of its services SERVING, and the host ready.
pub(super) async fn mark_ready(app: &App, reporter: &HealthReporter) {
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    reporter.set_serving::<AdminServiceServer<AdminApi>>().await;
    reporter
        .set_serving::<WorkerServiceServer<WorkerApi>>()
        .await;
    reporter
        .set_serving::<GrpcInferenceServiceServer<InferenceApi>>()
        .await;
    app.host
        .ready
        .store(true, std::sync::atomic::Ordering::SeqCst);
}
