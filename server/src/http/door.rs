//! What the REST front doors (OIP, OpenAI) share: admitting a caller (the bearer token, as on
//! gRPC), a request's deadline, and [`DoorError`], the one error value both doors render in
//! their own JSON shape with the status (and `Retry-After`) mapped once in
//! [`modelshare_serving::error`].

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::body::{BodyError, BodyHold};
use super::state::HttpState;
use crate::auth::{InflightGuard, admit_http};
use crate::connections::Connection;
use crate::cpu::PoolError;
use crate::front::deadline;
use modelshare_core::error::CoreError;
use modelshare_core::tenants::Caller;
use modelshare_serving::InferError;
use modelshare_serving::Kind;
use tonic::Code;

/// The header by which the server tells OpenAI's clients whether to retry.
pub const SHOULD_RETRY: &str = "x-should-retry";

/// Why a REST request got no answer: its status, message and retry hint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoorError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for the caller.
    pub message: String,
    /// When a retry may pass.
    pub retry_after: Option<Duration>,
}

impl DoorError {
    /// A 400 with `message`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: modelshare_core::error::bounded_message(message.into()),
            retry_after: None,
        }
    }

    /// Sets the `Retry-After` header of `response` when there is a hint, and
    /// `x-should-retry: false` on a client error that a retry cannot pass (the openai client
    /// reads it; it would otherwise retry a 408, 409 or 429).
    pub fn decorate(&self, mut response: Response) -> Response {
        if let Some(after) = self.retry_after {
            let secs = after.as_secs().max(1).to_string();
            if let Ok(v) = HeaderValue::from_str(&secs) {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        } else if self.status.is_client_error() {
            response
                .headers_mut()
                .insert(SHOULD_RETRY, HeaderValue::from_static("false"));
        }
        response
    }
}

/// The HTTP status for a gRPC code (the usual correspondence, as grpc-gateway draws it): the
/// one mapping of the HTTP doors.
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
            StatusCode::BAD_REQUEST
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<InferError> for DoorError {
    fn from(e: InferError) -> Self {
        Self {
            status: if e.never_fits() {
                StatusCode::PAYLOAD_TOO_LARGE
            } else {
                http_status(crate::status::code(e.kind()))
            },
            retry_after: e.retry_after(),
            message: modelshare_core::error::bounded_message(e.to_string()),
        }
    }
}

impl From<CoreError> for DoorError {
    fn from(e: CoreError) -> Self {
        let status = crate::status::from_core(e);
        let code = status.code();
        Self {
            status: http_status(code),
            retry_after: Kind::from_number(code as i32).retry_after(),
            message: status.message().to_owned(),
        }
    }
}

impl From<BodyError> for DoorError {
    fn from(e: BodyError) -> Self {
        let (status, retry_after) = match e {
            BodyError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, None),
            BodyError::Busy(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                Some(Duration::from_secs(1)),
            ),
            BodyError::Timeout { .. } => (StatusCode::REQUEST_TIMEOUT, None),
            BodyError::BadLength | BodyError::Broken(_) => (StatusCode::BAD_REQUEST, None),
        };
        Self {
            status,
            message: modelshare_core::error::bounded_message(e.to_string()),
            retry_after,
        }
    }
}

impl From<PoolError> for DoorError {
    fn from(e: PoolError) -> Self {
        let status = match e {
            PoolError::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            PoolError::Panicked => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self {
            status,
            message: e.to_string(),
            retry_after: None,
        }
    }
}

/// The caller of a request (and its in-flight count), or why it is refused.
pub fn admit(
    state: &HttpState,
    path: &str,
    headers: &HeaderMap,
) -> Result<(Caller, Option<InflightGuard>), DoorError> {
    let app = &state.app;
    let extensions = axum::http::Extensions::new();
    admit_http(
        &app.host.tenants,
        &app.host.metrics,
        path,
        headers,
        &extensions,
    )
    .map_err(DoorError::from)
}

/// The body of a request that arrived at `arrived`, read only now that its caller is admitted
/// (see [`super::body`]) and taken out of `body`, and the reservations to keep while its bytes
/// are in use. A body refused before it was read stays in `body`, for [`drain`].
pub async fn body(
    state: &HttpState,
    connection: Option<&Connection>,
    headers: &HeaderMap,
    arrived: Instant,
    body: &mut Option<Body>,
) -> Result<(Bytes, BodyHold), DoorError> {
    super::body::read(
        &state.app.bodies,
        state.body_limits(),
        connection,
        headers,
        arrived,
        body,
    )
    .await
    .map_err(DoorError::from)
}

/// Discards, in the background and within bounds, the body of a request answered before it
/// was read (see [`super::body::drain`]); a body already read is nothing to drain.
pub fn drain(state: &HttpState, declared: Option<usize>, body: Option<Body>) {
    if let Some(body) = body {
        super::body::drain(&state.drains, declared, body);
    }
}

/// The deadline of a request that arrived at `arrived`.
pub fn deadline(
    state: &HttpState,
    headers: &HeaderMap,
    arrived: Instant,
) -> Result<Instant, DoorError> {
    let longest = state.app.config.serving.max_request_time;
    deadline::http(headers, arrived, longest).map_err(DoorError::from)
}
