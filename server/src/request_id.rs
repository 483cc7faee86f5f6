//! Requests that can be followed: every call on the gRPC and HTTP ports gets a request id (the
//! caller's `x-request-id`, when it is a sane one, else a new one) and keeps the caller's W3C
//! `traceparent` (when well formed). Both go into the request's extensions ([`RequestTrace`])
//! for the doors, which stamp them on every item so that workers see them; the id comes back
//! on the response (`x-request-id`, also on errors, as gRPC metadata on that port), and every
//! log line of the call (audit lines among them) carries it, through a span.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use modelshare_proto::v1 as pb;
use tonic::codegen::http::{self, HeaderValue};
use tower::{Layer, Service};
use tracing::Instrument;

/// The header (and gRPC metadata key) of the request id.
pub const REQUEST_ID: &str = "x-request-id";

/// The W3C trace context header.
pub const TRACEPARENT: &str = "traceparent";

/// Longest request id kept from a caller (a longer one is replaced).
pub const MAX_REQUEST_ID: usize = 128;

/// Longest traceparent passed on (version 00 has 55 characters; later versions may add
/// fields). Both count as the item's bytes on the request path.
pub const MAX_TRACEPARENT: usize = 256;

/// A call's request id and the caller's trace context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestTrace {
    /// The caller's `x-request-id`, or one made here.
    pub id: String,
    /// The caller's `traceparent`, if well formed.
    pub traceparent: Option<String>,
}

impl RequestTrace {
    /// From a request's headers.
    pub fn of(headers: &http::HeaderMap) -> Self {
        let id = headers
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .filter(|id| sane_id(id))
            .map_or_else(|| uuid::Uuid::new_v4().simple().to_string(), str::to_owned);
        let traceparent = headers
            .get(TRACEPARENT)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|t| well_formed_traceparent(t))
            .map(str::to_owned);
        Self { id, traceparent }
    }

    /// Puts the id and the trace context on every item, for the worker.
    pub fn stamp(&self, items: &mut [pb::Item]) {
        for item in items {
            item.request_id.clone_from(&self.id);
            item.traceparent = self.traceparent.clone().unwrap_or_default();
        }
    }
}

/// An id worth keeping: 1 to [`MAX_REQUEST_ID`] letters, digits and `-_.:/+=@` (UUIDs,
/// ULIDs, base64, `svc:123`); no quote, brace or space that could forge a field of a log line.
fn sane_id(id: &str) -> bool {
    (1..=MAX_REQUEST_ID).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/+=@".contains(&b))
}

/// `version-traceid-parentid-flags` of lower-case hex (2, 32, 16, 2 digits), not version `ff`,
/// neither id all zeros (W3C Trace Context, "traceparent Header"). Versions past 00 may add
/// fields after the flags; those are kept as sent.
fn well_formed_traceparent(t: &str) -> bool {
    if t.len() > MAX_TRACEPARENT {
        return false;
    }
    let parts: Vec<&str> = t.split('-').collect();
    if parts.len() < 4 {
        return false;
    }
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let (version, trace, parent, flags) = (parts[0], parts[1], parts[2], parts[3]);
    hex(version, 2)
        && version != "ff"
        && (version != "00" || parts.len() == 4)
        && hex(trace, 32)
        && trace.bytes().any(|b| b != b'0')
        && hex(parent, 16)
        && parent.bytes().any(|b| b != b'0')
        && hex(flags, 2)
}

/// The layer, on both ports.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestIdLayer;

impl<S> Layer<S> for RequestIdLayer {
    type Service = RequestId<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestId { inner }
    }
}

/// The service the layer wraps.
#[derive(Debug, Clone)]
pub struct RequestId<S> {
    inner: S,
}

impl<S, B, RB> Service<http::Request<B>> for RequestId<S>
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

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let trace = RequestTrace::of(req.headers());
        let span = tracing::info_span!("request", request_id = %trace.id);
        let header = HeaderValue::from_str(&trace.id).ok();
        req.extensions_mut().insert(trace);
        let fut = self.inner.call(req);
        Box::pin(
            async move {
                let mut result = fut.await;
                if let (Ok(response), Some(header)) = (&mut result, header) {
                    response.headers_mut().insert(REQUEST_ID, header);
                }
                result
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("header"));
        }
        h
    }

    /// A caller's id is no longer kept (or a bad one no longer replaced), or a traceparent is
    /// passed on malformed.
    #[test]
    fn ids_are_kept_when_sane_and_made_otherwise() {
        let t = RequestTrace::of(&headers(&[(REQUEST_ID, "abc-123")]));
        assert_eq!(t.id, "abc-123");
        for bad in ["", "a b", "a\"b", "x} y{", &"x".repeat(129)] {
            let t = RequestTrace::of(&headers(&[(REQUEST_ID, bad)]));
            assert!(t.id != bad && t.id.len() == 32, "{bad:?} -> {}", t.id);
        }
        let made = RequestTrace::of(&http::HeaderMap::new());
        assert_eq!(made.id.len(), 32);
        assert_ne!(made.id, RequestTrace::of(&http::HeaderMap::new()).id);

        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let t = RequestTrace::of(&headers(&[(TRACEPARENT, good)]));
        assert_eq!(t.traceparent.as_deref(), Some(good));
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(
                RequestTrace::of(&headers(&[(TRACEPARENT, bad)])).traceparent,
                None,
                "{bad}"
            );
        }
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert!(
            RequestTrace::of(&headers(&[(TRACEPARENT, later)]))
                .traceparent
                .is_some()
        );
    }

    /// Items no longer carry the id and the trace context to the worker.
    #[test]
    fn stamp_marks_every_item() {
        let t = RequestTrace {
            id: "r1".into(),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        };
        let mut items = vec![pb::Item::default(), pb::Item::default()];
        t.stamp(&mut items);
        assert!(
            items
                .iter()
                .all(|i| i.request_id == "r1" && i.traceparent.starts_with("00-"))
        );
    }
}
