//! `grpc.health.v1.Health` with its one long-lived call bounded: [`BoundedHealth`] serves
//! `Check` as tonic-health does, and `Watch` within limits.
//!
//! Health needs no token (probes carry none), so its `Watch`, which never ends by itself, was
//! a way for anyone who reaches the port to hold connections open forever: a connection with
//! an open stream is never idle. Here a `Watch` ends (with OK; clients watch again) after the
//! listener's idle period, and at most [`MAX_WATCHES`] are open at once over the server
//! (RESOURCE_EXHAUSTED past it: `Check` serves probes).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_server::Health;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

/// The most `Watch` streams open at once over the whole server.
pub const MAX_WATCHES: usize = 256;

/// The health service, `Watch` bounded in time and number.
#[derive(Debug)]
pub struct BoundedHealth {
    inner: HealthService,
    watches: Arc<Semaphore>,
    longest: Duration,
}

impl BoundedHealth {
    /// The statuses `reporter` sets, each `Watch` ended after `longest`.
    pub fn new(reporter: HealthReporter, longest: Duration) -> Self {
        Self {
            inner: HealthService::from_health_reporter(reporter),
            watches: Arc::new(Semaphore::new(MAX_WATCHES)),
            longest,
        }
    }
}

/// A `Watch` stream that holds its place among the open ones until it ends.
pub struct BoundedWatch {
    inner: Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>,
    until: Pin<Box<tokio::time::Sleep>>,
    _place: OwnedSemaphorePermit,
}

impl std::fmt::Debug for BoundedWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundedWatch").finish_non_exhaustive()
    }
}

impl Stream for BoundedWatch {
    type Item = Result<HealthCheckResponse, Status>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if self.until.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(None);
        }
        self.inner.as_mut().poll_next(cx)
    }
}

#[tonic::async_trait]
impl Health for BoundedHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.inner.check(request).await
    }

    type WatchStream = BoundedWatch;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let place = self.watches.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "{MAX_WATCHES} health watches are open; use Check, or watch again later"
            ))
        })?;
        let stream = self.inner.watch(request).await?.into_inner();
        Ok(Response::new(BoundedWatch {
            inner: Box::pin(stream),
            until: Box::pin(tokio::time::sleep(self.longest)),
            _place: place,
        }))
    }
}
