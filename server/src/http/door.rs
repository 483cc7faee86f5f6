//! What the REST front doors (OIP, OpenAI) share: admitting a caller (the bearer token, as on
//! gRPC), a request's deadline, and [`DoorError`], the one error value both doors render in
//! their own JSON shape with the status (and `Retry-After`) mapped once in
//! [`crate::serving::error`].

use std::time::{Duration, Instant};

use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::state::HttpState;
use crate::error::ServerError;
use crate::front::deadline;
use crate::serving::InferError;
use crate::serving::error::{http_status, retry_after};
use crate::tenants::Caller;
use crate::tenants::auth::{InflightGuard, admit_http};

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
            message: crate::error::bounded_message(message.into()),
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

impl From<InferError> for DoorError {
    fn from(e: InferError) -> Self {
        Self {
            status: e.http_status(),
            retry_after: e.retry_after(),
            message: crate::error::bounded_message(e.to_string()),
        }
    }
}

impl From<ServerError> for DoorError {
    fn from(e: ServerError) -> Self {
        let status = tonic::Status::from(e);
        let code = status.code();
        Self {
            status: http_status(code),
            retry_after: retry_after(code),
            message: status.message().to_owned(),
        }
    }
}

impl From<BytesRejection> for DoorError {
    fn from(r: BytesRejection) -> Self {
        let status = r.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "the request body is larger than the server's limit (max_request_bytes)".to_owned()
        } else {
            r.body_text()
        };
        Self {
            status,
            message,
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
    admit_http(&app.tenants, &app.metrics, path, headers, &extensions).map_err(DoorError::from)
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
