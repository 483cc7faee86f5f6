//! Per-method bounds on the size of gRPC request messages.
//!
//! tonic bounds the messages of a whole service; the worker service needs 128 MiB for a batch's
//! results (`Serve`) but kilobytes for everything else, and a client sending 100 MiB
//! `Attach` requests must not make the server buffer them. [`MessageLimitLayer`] reads the
//! 5-byte prefix of each gRPC message as the request body streams in (`flag`, then a 32-bit
//! big-endian length) and fails the call with RESOURCE_EXHAUSTED as soon as a message declares
//! more than its method allows, before the message is buffered.
//!
//! The request of a method whose caller sends one message (every method but the workers'
//! `Session` and `Serve` streams) must arrive whole within the layer's body timeout
//! (`request_body_timeout_ms`), else the call fails with DEADLINE_EXCEEDED: a stalled request
//! body would otherwise keep its stream, and so its connection, open for ever.
//!
//! The messages of the inference door's `ModelInfer` reserve their declared size from the
//! server's [`BodyBudget`] (`max_body_bytes_in_flight`, shared with the REST doors) as their
//! prefix arrives, before tonic buffers them, and give it back when the request body is
//! dropped; when it is spent the call fails at once with UNAVAILABLE (retry), so that many
//! slow or stalled large messages cannot grow the server's memory without end.
//!
//! Every method of every service has its bound here, the services' own (tonic's
//! `max_decoding_message_size`, set to the same figures in `serve::router`) included: tonic
//! answers a message past those with OUT_OF_RANGE, and an oversized request is the same
//! refusal whichever service it reaches.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::codegen::Bytes;

use crate::bodies::{BodyBudget, BodyPermit};
use tonic::codegen::http;
use tower::{Layer, Service};

/// The bound on a request message of methods that carry no payload (names, ids, heartbeats).
pub const SMALL_REQUEST_BYTES: u32 = modelshare_proto::limits::SMALL_REQUEST_BYTES;

/// The bound on an admin request: names, paths and access lists need kilobytes; a client's
/// megabytes there are refused before they are decoded (answers may still be large).
pub const ADMIN_REQUEST_BYTES: u32 = modelshare_proto::limits::ADMIN_REQUEST_BYTES;

/// The bound on a request of the methods that carry payloads, and on any message the server
/// sends (manifests with metadata files can be large).
pub const PAYLOAD_MESSAGE_BYTES: u32 = modelshare_proto::limits::PAYLOAD_MESSAGE_BYTES;

/// Methods whose requests carry payloads.
const PAYLOAD_METHODS: &[&str] = &[
    "/modelshare.v1.WorkerService/Serve",
    "/inference.GRPCInferenceService/ModelInfer",
];

/// Methods whose messages are charged to the server's budget of request bodies (clients'
/// payloads; a worker's results are the server's own requests coming back).
const BUDGETED_METHODS: &[&str] = &["/inference.GRPCInferenceService/ModelInfer"];

/// Methods whose callers stream messages for as long as they live (no body timeout).
const STREAMING_METHODS: &[&str] = &[
    "/modelshare.v1.WorkerService/Session",
    "/modelshare.v1.WorkerService/Serve",
    STREAM_INFER,
];

/// Triton's decoupled stream of inference requests: a long-lived call whose messages are not
/// charged to the body budget (a reservation would last as long as the stream), so each is
/// bounded by [`STREAM_REQUEST_BYTES`] instead.
const STREAM_INFER: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

/// The bound on one request message of `ModelStreamInfer` (prompts, small tensors): 8 MiB.
pub const STREAM_REQUEST_BYTES: u32 = 8 << 20;

/// The bound for `path` (`/package.Service/Method`).
pub fn limit_for(path: &str) -> u32 {
    if PAYLOAD_METHODS.contains(&path) {
        PAYLOAD_MESSAGE_BYTES
    } else if path == STREAM_INFER {
        STREAM_REQUEST_BYTES
    } else if path.starts_with("/modelshare.v1.AdminService/") {
        ADMIN_REQUEST_BYTES
    } else {
        SMALL_REQUEST_BYTES
    }
}

/// The layer: message bounds by method, the time a one-message request may take, and the
/// server's budget of request bodies.
#[derive(Debug, Clone)]
pub struct MessageLimitLayer {
    body_timeout: Duration,
    bodies: BodyBudget,
}

impl MessageLimitLayer {
    /// Bounds by method; a one-message request's body must end within `body_timeout`; clients'
    /// payload messages are charged to `bodies`.
    pub fn new(body_timeout: Duration, bodies: BodyBudget) -> Self {
        Self {
            body_timeout,
            bodies,
        }
    }
}

impl<S> Layer<S> for MessageLimitLayer {
    type Service = MessageLimit<S>;
    fn layer(&self, inner: S) -> Self::Service {
        MessageLimit {
            inner,
            body_timeout: self.body_timeout,
            bodies: self.bodies.clone(),
        }
    }
}

/// The service of [`MessageLimitLayer`].
#[derive(Debug, Clone)]
pub struct MessageLimit<S> {
    inner: S,
    body_timeout: Duration,
    bodies: BodyBudget,
}

impl<S> Service<http::Request<tonic::body::Body>> for MessageLimit<S>
where
    S: Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let path = req.uri().path();
        let limit = limit_for(path);
        let until = (!STREAMING_METHODS.contains(&path)).then(|| {
            (
                Box::pin(tokio::time::sleep(self.body_timeout)),
                self.body_timeout,
            )
        });
        let budget = BUDGETED_METHODS
            .contains(&path)
            .then(|| self.bodies.clone());
        self.inner.call(req.map(|body| {
            tonic::body::Body::new(Bounded {
                body,
                limit,
                scan: Scan::default(),
                until,
                budget,
                held: Vec::new(),
            })
        }))
    }
}

/// Where the scan of the message stream is: in a prefix (bytes of it seen so far) or in a
/// message's payload (bytes of it left).
#[derive(Debug, Clone, Copy)]
enum Scan {
    Prefix { seen: usize, bytes: [u8; 5] },
    Payload { left: u64 },
}

impl Default for Scan {
    fn default() -> Self {
        Scan::Prefix {
            seen: 0,
            bytes: [0; 5],
        }
    }
}

impl Scan {
    /// Walks `chunk`, calling `declared` with each message length read; the first declared
    /// length over `limit`, if any.
    fn feed(
        &mut self,
        mut chunk: &[u8],
        limit: u32,
        mut declared: impl FnMut(u32),
    ) -> Result<(), u32> {
        while !chunk.is_empty() {
            match self {
                Scan::Prefix { seen, bytes } => {
                    let take = (5 - *seen).min(chunk.len());
                    bytes[*seen..*seen + take].copy_from_slice(&chunk[..take]);
                    *seen += take;
                    chunk = &chunk[take..];
                    if *seen == 5 {
                        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
                        if len > limit {
                            return Err(len);
                        }
                        declared(len);
                        *self = Scan::Payload {
                            left: u64::from(len),
                        };
                    }
                }
                Scan::Payload { left } => {
                    let take = (*left).min(chunk.len() as u64);
                    *left -= take;
                    chunk = &chunk[usize::try_from(take).unwrap_or(chunk.len())..];
                    if *left == 0 {
                        *self = Scan::default();
                    }
                }
            }
        }
        // A zero-length message ends right after its prefix.
        if let Scan::Payload { left: 0 } = self {
            *self = Scan::default();
        }
        Ok(())
    }
}

/// A request body that fails once a message declares more than `limit` bytes, (`until`)
/// when it has not ended by its timeout, or (`budget`) when the server's budget of request
/// bodies cannot hold a message it declares; what it reserved is `held` until it drops.
#[derive(Debug)]
struct Bounded {
    body: tonic::body::Body,
    limit: u32,
    scan: Scan,
    until: Option<(Pin<Box<tokio::time::Sleep>>, Duration)>,
    budget: Option<BodyBudget>,
    held: Vec<BodyPermit>,
}

impl http_body::Body for Bounded {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        let frame = match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Pending => {
                if let Some((sleep, after)) = &mut this.until
                    && sleep.as_mut().poll(cx).is_ready()
                {
                    let ms = after.as_millis();
                    this.until = None;
                    return Poll::Ready(Some(Err(tonic::Status::deadline_exceeded(format!(
                        "the request message did not arrive within {ms} ms (request_body_timeout_ms)"
                    )))));
                }
                return Poll::Pending;
            }
            other => return other,
        };
        if let Some(data) = frame.data_ref() {
            let mut refused = false;
            let (budget, held) = (&this.budget, &mut this.held);
            let scanned = this.scan.feed(data, this.limit, |len| {
                if let Some(budget) = budget {
                    match budget.reserve(len as usize) {
                        Some(permit) => held.push(permit),
                        None => refused = true,
                    }
                }
            });
            if let Err(len) = scanned {
                return Poll::Ready(Some(Err(tonic::Status::resource_exhausted(format!(
                    "a request message of {len} bytes exceeds this method's limit of {} bytes",
                    this.limit
                )))));
            }
            if refused {
                return Poll::Ready(Some(Err(tonic::Status::unavailable(
                    "the server is receiving as many request bodies as it may at once (max_body_bytes_in_flight); retry shortly",
                ))));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: u32) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&len.to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len as usize));
        m
    }

    #[test]
    fn declared_lengths_are_read_across_any_split() {
        let mut stream = message(10);
        stream.extend(message(0));
        stream.extend(message(100));
        stream.extend(message(3));
        for split in 1..stream.len() {
            let mut scan = Scan::default();
            let mut lengths = Vec::new();
            for chunk in stream.chunks(split) {
                assert_eq!(
                    scan.feed(chunk, 100, |l| lengths.push(l)),
                    Ok(()),
                    "split {split}"
                );
            }
            assert_eq!(lengths, [10, 0, 100, 3], "split {split}");
            let mut over = Scan::default();
            let found = stream
                .chunks(split)
                .find_map(|c| over.feed(c, 99, |_| {}).err());
            assert_eq!(found, Some(100), "split {split}");
        }
    }

    /// Every method has a bound, payload methods and the admin service included: a bound left
    /// to tonic's service limit is answered OUT_OF_RANGE, not RESOURCE_EXHAUSTED.
    #[test]
    fn every_method_is_bounded_here() {
        assert_eq!(
            limit_for("/modelshare.v1.WorkerService/Serve"),
            PAYLOAD_MESSAGE_BYTES
        );
        assert_eq!(
            limit_for("/inference.GRPCInferenceService/ModelInfer"),
            PAYLOAD_MESSAGE_BYTES
        );
        assert_eq!(
            limit_for("/modelshare.v1.AdminService/LoadModel"),
            ADMIN_REQUEST_BYTES
        );
        assert_eq!(
            limit_for("/modelshare.v1.WorkerService/Attach"),
            SMALL_REQUEST_BYTES
        );
        assert_eq!(
            limit_for("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            SMALL_REQUEST_BYTES
        );
    }
}
