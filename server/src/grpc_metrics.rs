//! A tower layer that counts gRPC requests by service, method and status code, and times them.
//!
//! The code is read from the response head (`grpc-status`, present for unary errors and
//! trailers-only responses); a response head without it counts as `OK` (a streaming call's
//! final status travels in trailers, after the head). Paths that are not one of this server's
//! services count as service `other`, so clients cannot grow the label set.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tonic::codegen::http;
use tower::{Layer, Service};

use modelshare_core::metrics::Metrics;
use modelshare_serving::Kind;

/// Services whose methods are labelled by name.
const KNOWN_SERVICES: &[&str] = &[
    "modelshare.v1.AdminService",
    "modelshare.v1.WorkerService",
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    "inference.GRPCInferenceService",
];

/// The layer.
#[derive(Debug, Clone)]
pub struct GrpcMetricsLayer {
    metrics: Arc<Metrics>,
}

impl GrpcMetricsLayer {
    /// Counting into `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;
    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service the layer wraps around the gRPC router.
#[derive(Debug, Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

/// (service, method) labels for a request path `/package.Service/Method`.
fn labels(path: &str) -> (&str, &str) {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    match (parts.next(), parts.next()) {
        (Some(svc), Some(method))
            if KNOWN_SERVICES.contains(&svc)
                && !method.is_empty()
                && method.len() <= 64
                && method.bytes().all(|b| b.is_ascii_alphanumeric()) =>
        {
            (svc, method)
        }
        _ => ("other", "other"),
    }
}

fn code_name(code: &str) -> &'static str {
    code.parse::<i32>()
        .map_or("UNKNOWN", |c| code_label(tonic::Code::from(c)))
}

/// The name of a gRPC code as metrics label it (`OK`, `NOT_FOUND`, ...): the request path's
/// kind of the same number names it.
pub fn code_label(code: tonic::Code) -> &'static str {
    Kind::from_number(code as i32).label()
}

impl<S, B, RB> Service<http::Request<B>> for GrpcMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let (service, method) = labels(req.uri().path());
        let (service, method) = (service.to_owned(), method.to_owned());
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            let code = match &result {
                Ok(res) => res
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .map(code_name)
                    .unwrap_or("OK"),
                Err(_) => "INTERNAL",
            };
            metrics
                .grpc_requests
                .with_label_values(&[service.as_str(), method.as_str(), code])
                .inc();
            metrics
                .grpc_seconds
                .with_label_values(&[service.as_str(), method.as_str(), code])
                .observe(started.elapsed().as_secs_f64());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unknown paths must not become label values (a client could grow the series without end).
    #[test]
    fn labels_are_bounded() {
        assert_eq!(
            labels("/modelshare.v1.AdminService/GetStats"),
            ("modelshare.v1.AdminService", "GetStats")
        );
        // The OIP inference door is counted under its own name (it was `other`).
        assert_eq!(
            labels("/inference.GRPCInferenceService/ModelInfer"),
            ("inference.GRPCInferenceService", "ModelInfer")
        );
        assert_eq!(labels("/evil.Service/Anything"), ("other", "other"));
        assert_eq!(
            labels("/modelshare.v1.AdminService/x-y%20"),
            ("other", "other")
        );
        assert_eq!(labels("/"), ("other", "other"));
        assert_eq!(code_name("5"), "NOT_FOUND");
        assert_eq!(code_name("zzz"), "UNKNOWN");
    }
}
