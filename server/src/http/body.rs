//! Reading a REST request's body, only after its caller is admitted, within budgets and a
//! timeout.
//!
//! The handlers take the body unread ([`axum::body::Body`]) and admit the caller from the
//! headers first, so no body byte of a caller without a valid token is buffered. Then
//! [`read`]:
//! - refuses at once (413) a `content-length` past `max_request_bytes`, without waiting for
//!   a byte of it;
//! - reserves the body's bytes (its `content-length`, else the limit) from the connection's
//!   budget (two whole bodies: an HTTP/2 connection carries many requests) and from the
//!   server's [`BodyBudget`] (`max_body_bytes_in_flight`, shared with the gRPC doors),
//!   answering 503 with `Retry-After` when either is spent, instead of buffering without end;
//! - gives the body `request_body_timeout` from the request's start to arrive (408 past it),
//!   so a POST whose body never comes ends, and its connection can go idle and close.
//!
//! A request answered before its body was read (401, 404, 413, 503) has that body
//! [`drain`]ed in the background, discarded as it comes (nothing is kept), at most
//! [`DRAIN_BYTES`] for at most [`DRAIN_TIME`], and [`MAX_DRAINS`] at once: a client that writes
//! its whole body before reading (urllib, many others) then reads its answer instead of a
//! broken pipe, as nginx's lingering close does; past those bounds the connection is closed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use tokio::sync::Semaphore;

use crate::bodies::{BodyBudget, BodyPermit};
use crate::connections::{BodyOnConnection, Connection};

/// Why a body was not read (each door renders it: [`super::door::DoorError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Past `max_request_bytes` (declared, or as it arrived): 413.
    #[error(
        "the request body is larger than the server's limit of {max} bytes (max_request_bytes)"
    )]
    TooLarge {
        /// The limit.
        max: usize,
    },
    /// The connection's or the listener's budget is spent: 503, retry.
    #[error("{0}; retry shortly")]
    Busy(&'static str),
    /// It did not arrive in time: 408.
    #[error("the request body did not arrive within {ms} ms (request_body_timeout_ms)")]
    Timeout {
        /// The timeout.
        ms: u128,
    },
    /// A `content-length` that is not a number: 400.
    #[error("malformed content-length header")]
    BadLength,
    /// The connection broke while it was read: 400.
    #[error("the request body could not be read: {0}")]
    Broken(String),
}

/// The most bytes of an unread body [`drain`] discards.
pub const DRAIN_BYTES: usize = 64 << 20;
/// The longest [`drain`] waits for an unread body.
pub const DRAIN_TIME: Duration = Duration::from_secs(5);
/// The most bodies drained at once, per listener.
pub const MAX_DRAINS: usize = 64;

/// Discards the unread `body` of a request already answered, in the background, within
/// [`DRAIN_BYTES`] and [`DRAIN_TIME`], at most `drains` at once (else it is dropped at once,
/// which closes an HTTP/1.1 connection). Nothing it reads is kept.
pub fn drain(drains: &Arc<Semaphore>, declared: Option<usize>, body: Body) {
    if declared.is_some_and(|n| n > DRAIN_BYTES) {
        return;
    }
    let Ok(permit) = drains.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        let mut stream = body.into_data_stream();
        let mut seen = 0usize;
        let _ = tokio::time::timeout(DRAIN_TIME, async {
            while let Some(Ok(chunk)) = tokio_stream::StreamExt::next(&mut stream).await {
                seen = seen.saturating_add(chunk.len());
                if seen > DRAIN_BYTES {
                    break;
                }
            }
        })
        .await;
    });
}

/// What one body may use.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// The largest body.
    pub max_bytes: usize,
    /// What one connection may be receiving at once.
    pub per_connection: usize,
    /// How long the body may take, from the request's start.
    pub timeout: Duration,
}

/// Holds a body's reservations until the request is answered.
#[derive(Debug)]
pub struct BodyHold {
    _server: BodyPermit,
    _connection: Option<BodyOnConnection>,
}

/// The body's declared length, if it has a well-formed one.
pub fn declared_length(headers: &HeaderMap) -> Option<usize> {
    content_length(headers).ok().flatten()
}

/// The body's declared length, if any; an error for a malformed one.
fn content_length(headers: &HeaderMap) -> Result<Option<usize>, BodyError> {
    match headers.get(header::CONTENT_LENGTH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(|n| Some(usize::try_from(n).unwrap_or(usize::MAX)))
            .ok_or(BodyError::BadLength),
    }
}

/// Reads a request's whole body (see the module's text), taking it out of `body`; a body left
/// there (refused before it was read) is the caller's to [`drain`]. Call it only once the
/// caller is admitted; keep the [`BodyHold`] until the body's bytes are no longer needed.
pub async fn read(
    budget: &BodyBudget,
    limits: BodyLimits,
    connection: Option<&Connection>,
    headers: &HeaderMap,
    started: Instant,
    body: &mut Option<Body>,
) -> Result<(Bytes, BodyHold), BodyError> {
    let declared = content_length(headers)?;
    if declared.is_some_and(|n| n > limits.max_bytes) {
        return Err(BodyError::TooLarge {
            max: limits.max_bytes,
        });
    }
    let reserve = declared.unwrap_or(limits.max_bytes);
    let connection = match connection {
        Some(c) => Some(
            c.reserve_body(reserve, limits.per_connection)
                .ok_or(BodyError::Busy(
                    "this connection is already sending as many request bodies as it may at once",
                ))?,
        ),
        None => None,
    };
    let server = budget.reserve(reserve).ok_or(BodyError::Busy(
        "the server is receiving as many request bodies as it may at once",
    ))?;
    let hold = BodyHold {
        _server: server,
        _connection: connection,
    };
    let Some(body) = body.take() else {
        return Err(BodyError::Broken("the body was read already".into()));
    };
    let until = tokio::time::Instant::from_std(started + limits.timeout);
    match tokio::time::timeout_at(until, axum::body::to_bytes(body, limits.max_bytes)).await {
        Err(_) => Err(BodyError::Timeout {
            ms: limits.timeout.as_millis(),
        }),
        Ok(Err(e)) => {
            // A body past the limit without a content-length, or a connection that broke.
            let source = std::error::Error::source(&e).map(ToString::to_string);
            if source
                .as_deref()
                .is_some_and(|s| s.contains("length limit"))
            {
                Err(BodyError::TooLarge {
                    max: limits.max_bytes,
                })
            } else {
                Err(BodyError::Broken(e.to_string()))
            }
        }
        Ok(Ok(bytes)) => Ok((bytes, hold)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> BodyLimits {
        BodyLimits {
            max_bytes: 4096,
            per_connection: 8192,
            timeout: Duration::from_millis(200),
        }
    }

    fn headers(len: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(l) = len {
            h.insert(header::CONTENT_LENGTH, l.parse().expect("value"));
        }
        h
    }

    #[tokio::test]
    async fn declared_lengths_budgets_and_slow_bodies_are_refused() {
        let budget = BodyBudget::new(8192);
        let now = Instant::now();
        // Fits.
        let (b, hold) = read(
            &budget,
            limits(),
            None,
            &headers(Some("5")),
            now,
            &mut Some(Body::from("hello")),
        )
        .await
        .expect("read");
        assert_eq!(&b[..], b"hello");
        assert_eq!(budget.available(), 8192 - 1024);
        drop(hold);
        assert_eq!(budget.available(), 8192);
        // Declared past the limit: refused without reading.
        let e = read(
            &budget,
            limits(),
            None,
            &headers(Some("999999999")),
            now,
            &mut Some(Body::empty()),
        )
        .await
        .expect_err("413");
        assert_eq!(e, BodyError::TooLarge { max: 4096 });
        // Undeclared past the limit.
        let e = read(
            &budget,
            limits(),
            None,
            &headers(None),
            now,
            &mut Some(Body::from(vec![0u8; 5000])),
        )
        .await
        .expect_err("413");
        assert_eq!(e, BodyError::TooLarge { max: 4096 });
        // The budget spent by two held bodies of unknown length: the third waits no memory.
        let slow = || {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
            (
                tx,
                Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
            )
        };
        let (_tx1, b1) = slow();
        let (_tx2, b2) = slow();
        let far = BodyLimits {
            timeout: Duration::from_secs(30),
            ..limits()
        };
        let budget2 = budget.clone();
        let r1 = tokio::spawn(async move {
            read(&budget2, far, None, &HeaderMap::new(), now, &mut Some(b1)).await
        });
        let budget3 = budget.clone();
        let r2 = tokio::spawn(async move {
            read(&budget3, far, None, &HeaderMap::new(), now, &mut Some(b2)).await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(budget.available(), 0);
        let e = read(
            &budget,
            limits(),
            None,
            &headers(Some("1")),
            now,
            &mut Some(Body::from("x")),
        )
        .await
        .expect_err("503");
        assert!(matches!(e, BodyError::Busy(_)), "{e}");
        r1.abort();
        r2.abort();
        let _ = (r1.await, r2.await);
        assert_eq!(budget.available(), 8192, "reservations given back");
        // A body that never comes: 408 at the timeout.
        let (_tx, b) = slow();
        let e = read(
            &budget,
            limits(),
            None,
            &headers(Some("10")),
            Instant::now(),
            &mut Some(b),
        )
        .await
        .expect_err("408");
        assert!(matches!(e, BodyError::Timeout { ms: 200 }), "{e}");
        assert_eq!(budget.available(), 8192);
    }
}
