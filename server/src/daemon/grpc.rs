//! The gRPC server: its middleware stack, its services (health, reflection, admin, worker,
//! OIP inference) with their message sizes, and the TLS of the TCP listener.

use std::path::Path;

use modelshare_proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use modelshare_proto::v1::admin_service_server::AdminServiceServer;
use modelshare_proto::v1::worker_service_server::WorkerServiceServer;
use tonic::transport::server::Router;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic_health::pb::health_server::{Health, HealthServer};

use super::error::ServeError;
use crate::app::App;
use crate::auth::AuthLayer;
use crate::config::{ClientAuth, TlsSettings};
use crate::connections::StreamsLayer;
use crate::grpc_metrics::GrpcMetricsLayer;
use crate::message_limits::MessageLimitLayer;
use crate::request_id::RequestIdLayer;
use crate::service::admin::AdminApi;
use crate::service::inference::InferenceApi;
use crate::service::worker::WorkerApi;

/// The middleware stack of the gRPC server: the connection's stream count outermost, then
/// metrics (refusals are counted too), then authentication, then the bound on each method's
/// request messages.
pub(super) type GrpcStack = tower::layer::util::Stack<
    MessageLimitLayer,
    tower::layer::util::Stack<
        AuthLayer,
        tower::layer::util::Stack<
            GrpcMetricsLayer,
            tower::layer::util::Stack<
                StreamsLayer,
                tower::layer::util::Stack<RequestIdLayer, tower::layer::util::Identity>,
            >,
        >,
    >,
>;

/// Largest gRPC message accepted or sent (`message_limits` refuses larger requests first).
const MAX_MESSAGE_BYTES: usize = crate::message_limits::PAYLOAD_MESSAGE_BYTES as usize;
/// The largest admin request (`message_limits` refuses larger ones first).
const MAX_ADMIN_REQUEST_BYTES: usize = crate::message_limits::ADMIN_REQUEST_BYTES as usize;
/// Requests served at once on one connection.
const CONCURRENCY_PER_CONNECTION: usize = 256;

/// The rustls configuration of the TCP listener.
pub(super) fn tls_config(tls: &TlsSettings) -> Result<ServerTlsConfig, ServeError> {
    let read = |what: &'static str, path: &Path| {
        std::fs::read(path).map_err(|source| ServeError::Tls {
            what,
            path: path.display().to_string(),
            source,
        })
    };
    let identity = Identity::from_pem(read("certificate", &tls.cert)?, read("key", &tls.key)?);
    let mut config = ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &tls.client_ca {
        config = config
            .client_ca_root(Certificate::from_pem(read("client CA", ca)?))
            .client_auth_optional(tls.client_auth == ClientAuth::Optional);
    }
    Ok(config)
}

/// The gRPC server of one listener: its middleware, health, reflection and the services.
pub(super) fn router(
    app: &App,
    health: HealthServer<impl Health>,
    tls: Option<ServerTlsConfig>,
) -> Result<Router<GrpcStack>, ServeError> {
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(modelshare_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    // `v1alpha` beside `v1`: Python's grpcio-reflection client and older grpcurl ask for it.
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let reflection = reflection().build_v1()?;
    let admin = AdminServiceServer::new(AdminApi::new(app.clone()))
        .max_decoding_message_size(MAX_ADMIN_REQUEST_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let worker = WorkerServiceServer::new(WorkerApi::new(app.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let inference = GrpcInferenceServiceServer::new(InferenceApi::new(app.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    Ok(builder
        // An id on every call (the caller's x-request-id, or a new one), in its log lines and
        // echoed as response metadata; the doors pass it and the traceparent to the workers.
        .layer(RequestIdLayer)
        // Keep the connection open while a stream is (see `connections`: idle ones are closed).
        .layer(StreamsLayer)
        // Count and time every request by service, method and status code.
        .layer(GrpcMetricsLayer::new(app.host.metrics.clone()))
        // Bearer token → caller; uid binding; in-flight quota.
        .layer(AuthLayer::new(
            app.host.tenants.clone(),
            app.host.metrics.clone(),
        ))
        // Every request message bounded by its method, refused as RESOURCE_EXHAUSTED from its
        // length prefix before it is buffered (see `message_limits`): kilobytes for the methods
        // that carry no payload, 1 MiB for the admin service, 128 MiB for payloads.
        .layer(MessageLimitLayer::new(
            app.config.serving.request_body_timeout,
            app.bodies.clone(),
        ))
        // Bound the work one connection can put on the server, instead of queueing without end.
        .concurrency_limit_per_connection(CONCURRENCY_PER_CONNECTION)
        // Detect dead peers on idle connections (a worker host that vanished).
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(5)))
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(admin)
        .add_service(worker)
        .add_service(inference))
}
