//! Caps and timeouts on the connections of the listeners, so that clients that connect and
//! say nothing (or half a handshake, or only answer PINGs) cannot hold the server's
//! connections or descriptors.
//!
//! - **Caps.** A [`Gate`] per listener admits at most `max_per_listener` connections, and at
//!   most `max_per_peer` from one peer (a TCP peer is its IP address; a Unix-socket peer is
//!   its uid, from `SO_PEERCRED`). A connection past a cap is closed at once. The handle
//!   socket ([`crate::handles`]) has its gate too: it takes a bare [`Permit`] per connection
//!   and reads its one exchange within the handshake time itself.
//! - **Timeouts.** Each admitted connection is a [`Tracked`] stream. One that has not started
//!   a request within `handshake` of being accepted (TLS and HTTP/2 handshakes included), or
//!   that has had no request open for `idle`, reads as closed by its peer, which ends it.
//!   Requests are counted by [`StreamsLayer`] (a gRPC stream, or an HTTP request, is open until
//!   its response body ends), reached through the connection's [`ConnInfo`]. Bytes alone do
//!   not count: a client trickling a header, or answering PINGs, is still idle.
//!
//! Workers keep their session streams open, so they are never idle; a client's pooled
//! connection that is idle is closed and reopened by the client on its next call, as HTTP/2
//! clients expect.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::codegen::http;
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};
use tower::{Layer, Service};
use tracing::warn;

use modelshare_core::metrics::Metrics;

/// Caps and timeouts of one listener's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Most connections open at once.
    pub max_per_listener: usize,
    /// Most connections open at once from one peer (IP address, or uid on a Unix socket).
    pub max_per_peer: usize,
    /// Time from accept to the first request.
    pub handshake: Duration,
    /// Time a connection may stay open with no request.
    pub idle: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            max_per_listener: 4096,
            max_per_peer: 1024,
            handshake: Duration::from_secs(10),
            idle: Duration::from_secs(300),
        }
    }
}

/// Who a connection comes from, for the per-peer cap.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PeerKey {
    /// A TCP peer's address.
    Ip(IpAddr),
    /// A Unix-socket peer's uid.
    Uid(u32),
    /// Not known (counted together).
    Unknown,
}

impl PeerKey {
    /// The key of a TCP stream.
    pub fn of_tcp(stream: &tokio::net::TcpStream) -> Self {
        stream
            .peer_addr()
            .map_or(PeerKey::Unknown, |a| PeerKey::Ip(a.ip()))
    }

    /// The key of a Unix stream.
    pub fn of_unix(stream: &tokio::net::UnixStream) -> Self {
        stream
            .peer_cred()
            .map_or(PeerKey::Unknown, |c| PeerKey::Uid(c.uid()))
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    by_peer: HashMap<PeerKey, usize>,
}

#[derive(Debug)]
struct GateInner {
    listener: &'static str,
    limits: ConnLimits,
    counts: Mutex<Counts>,
    warned: Mutex<Option<Instant>>,
    metrics: Arc<Metrics>,
}

/// The connections of one listener: admits within the caps, and counts them.
#[derive(Debug, Clone)]
pub struct Gate {
    inner: Arc<GateInner>,
}

impl Gate {
    /// A gate for `listener` (its name in logs and metrics).
    pub fn new(listener: &'static str, limits: ConnLimits, metrics: Arc<Metrics>) -> Self {
        Self {
            inner: Arc::new(GateInner {
                listener,
                limits,
                counts: Mutex::default(),
                warned: Mutex::new(None),
                metrics,
            }),
        }
    }

    /// Admits `io` from `peer`, or closes it (by dropping it) when a cap is reached.
    pub fn admit<IO>(&self, io: IO, peer: PeerKey) -> Option<Tracked<IO>> {
        let permit = self.permit(peer)?;
        let limits = self.inner.limits;
        Some(Tracked {
            io,
            state: Arc::new(ConnState::new(limits)),
            timer: Box::pin(tokio::time::sleep(limits.handshake)),
            expired: false,
            _permit: permit,
        })
    }

    /// A place for one connection from `peer`, held until the [`Permit`] drops; `None` (and
    /// the refusal counted and logged) when a cap is reached. For a listener whose exchange
    /// reads the raw socket (the handle socket) and so times itself out, where [`Gate::admit`]
    /// would wrap the stream.
    pub fn permit(&self, peer: PeerKey) -> Option<Permit> {
        let g = &self.inner;
        let refused = {
            let mut c = g.counts.lock().unwrap_or_else(|p| p.into_inner());
            let of_peer = c.by_peer.get(&peer).copied().unwrap_or(0);
            if c.total >= g.limits.max_per_listener {
                Some("listener_full")
            } else if of_peer >= g.limits.max_per_peer {
                Some("peer_full")
            } else {
                c.total += 1;
                *c.by_peer.entry(peer.clone()).or_default() += 1;
                None
            }
        };
        if let Some(reason) = refused {
            self.closed(reason);
            self.warn_refused(reason, &peer);
            return None;
        }
        g.metrics.connections.with_label_values(&[g.listener]).inc();
        Some(Permit {
            gate: self.clone(),
            peer,
        })
    }

    /// The caps and timeouts this gate applies.
    pub fn limits(&self) -> ConnLimits {
        self.inner.limits
    }

    fn closed(&self, reason: &str) {
        let g = &self.inner;
        g.metrics
            .connections_closed
            .with_label_values(&[g.listener, reason])
            .inc();
    }

    fn warn_refused(&self, reason: &str, peer: &PeerKey) {
        let now = Instant::now();
        let mut last = self.inner.warned.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|at| now.duration_since(at) >= crate::accept::WARN_EVERY) {
            *last = Some(now);
            let l = &self.inner.limits;
            warn!(
                listener = self.inner.listener,
                reason,
                ?peer,
                max_per_listener = l.max_per_listener,
                max_per_peer = l.max_per_peer,
                "connection refused: too many open (logged at most every 10 s)"
            );
        }
    }
}

/// A connection's place in its [`Gate`], given back when it drops (as the connection closes).
#[derive(Debug)]
pub struct Permit {
    gate: Gate,
    peer: PeerKey,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let g = &self.gate.inner;
        let mut c = g.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.by_peer.remove(&self.peer);
            }
        }
        g.metrics.connections.with_label_values(&[g.listener]).dec();
    }
}

/// What a connection's timers read: requests open, whether one ever was, and since when
/// none is.
#[derive(Debug)]
struct ConnState {
    limits: ConnLimits,
    accepted: Instant,
    /// Requests open (gRPC streams until their response body ends).
    open: AtomicUsize,
    /// Whether a request ever came.
    started: AtomicBool,
    /// When the last request ended.
    quiet_since: Mutex<Instant>,
    /// Request-body bytes being received on this connection now (see [`Connection`]).
    body_bytes: AtomicUsize,
}

impl ConnState {
    fn new(limits: ConnLimits) -> Self {
        let now = Instant::now();
        Self {
            limits,
            accepted: now,
            open: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            quiet_since: Mutex::new(now),
            body_bytes: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        *self.quiet_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// When the connection is to be closed if nothing changes, and why; `None` while a
    /// request is open (then checked again an idle period later).
    fn deadline(&self) -> Result<(Instant, &'static str), Instant> {
        if self.open.load(Ordering::Acquire) > 0 {
            return Err(Instant::now() + self.limits.idle);
        }
        if !self.started.load(Ordering::Acquire) {
            return Ok((self.accepted + self.limits.handshake, "handshake_timeout"));
        }
        let quiet = *self.quiet_since.lock().unwrap_or_else(|p| p.into_inner());
        Ok((quiet + self.limits.idle, "idle_timeout"))
    }
}

/// The connection information the server puts in each request (tonic: `ConnInfo<TcpConnectInfo>`
/// or `ConnInfo<UdsConnectInfo>`; axum: `ConnectInfo<ConnInfo<SocketAddr>>`): the stream's own,
/// and the state [`StreamsLayer`] counts requests in.
#[derive(Debug, Clone)]
pub struct ConnInfo<I> {
    /// The wrapped stream's information.
    pub inner: I,
    state: Arc<ConnState>,
}

/// An admitted connection: closes (reads as EOF) past its handshake or idle timeout.
#[derive(Debug)]
pub struct Tracked<IO> {
    io: IO,
    state: Arc<ConnState>,
    timer: Pin<Box<tokio::time::Sleep>>,
    expired: bool,
    _permit: Permit,
}

impl<IO> Tracked<IO> {
    /// Whether the connection is past its deadline (and arms the timer when not).
    fn check(&mut self, cx: &mut Context<'_>) -> bool {
        if self.expired {
            return true;
        }
        loop {
            let (at, why) = match self.state.deadline() {
                Ok(d) => (d.0, Some(d.1)),
                Err(recheck) => (recheck, None),
            };
            if let Some(why) = why
                && Instant::now() >= at
            {
                self.expired = true;
                self._permit.gate.closed(why);
                return true;
            }
            self.timer
                .as_mut()
                .reset(tokio::time::Instant::from_std(at));
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Tracked<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.check(cx) {
            return Poll::Ready(Ok(())); // EOF: the connection ends
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Tracked<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO> Tracked<IO> {
    /// The connection information of this connection from `peer` (an HTTP port's).
    pub fn info(&self, peer: std::net::SocketAddr) -> ConnInfo<std::net::SocketAddr> {
        ConnInfo {
            inner: peer,
            state: self.state.clone(),
        }
    }
}

impl<'a> axum::extract::connect_info::Connected<axum::serve::IncomingStream<'a, GatedListener>>
    for ConnInfo<std::net::SocketAddr>
{
    fn connect_info(stream: axum::serve::IncomingStream<'a, GatedListener>) -> Self {
        stream.io().info(*stream.remote_addr())
    }
}

/// The HTTP port's listener: accepts as a [`Gate`] admits, pausing after failed accepts.
#[derive(Debug)]
pub struct GatedListener {
    listener: tokio::net::TcpListener,
    gate: Gate,
    warned: Mutex<Option<Instant>>,
}

impl GatedListener {
    /// Accepting on `listener` through `gate`.
    pub fn new(listener: tokio::net::TcpListener, gate: Gate) -> Self {
        Self {
            listener,
            gate,
            warned: Mutex::new(None),
        }
    }
}

impl axum::serve::Listener for GatedListener {
    type Io = Tracked<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    // Small answers on kept-alive connections: send each at once.
                    let _ = stream.set_nodelay(true);
                    if let Some(io) = self.gate.admit(stream, PeerKey::Ip(addr.ip())) {
                        return (io, addr);
                    }
                }
                Err(e) => crate::accept::pause("http", &e, &self.warned).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

impl<IO: Connected> Connected for Tracked<IO> {
    type ConnectInfo = ConnInfo<IO::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnInfo {
            inner: self.io.connect_info(),
            state: self.state.clone(),
        }
    }
}

/// Counts each request's stream on its connection's state, from the call until its response
/// body is dropped, and puts the stream's own connection information back in the request
/// (`TcpConnectInfo`, `UdsConnectInfo`) for the layers and services after it. Outermost.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamsLayer;

impl<S> Layer<S> for StreamsLayer {
    type Service = Streams<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Streams { inner }
    }
}

/// The service of [`StreamsLayer`].
#[derive(Debug, Clone)]
pub struct Streams<S> {
    inner: S,
}

/// Holds one request open on its connection.
#[derive(Debug)]
struct Open(Arc<ConnState>);

impl Open {
    fn new(state: Arc<ConnState>) -> Self {
        state.started.store(true, Ordering::Release);
        state.open.fetch_add(1, Ordering::AcqRel);
        Open(state)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.touch();
        }
    }
}

/// The connection a request came on, in the request's extensions (put there by
/// [`StreamsLayer`]): what its request-body budget is charged to.
#[derive(Debug, Clone)]
pub struct Connection(Arc<ConnState>);

impl Connection {
    /// Reserves `bytes` of request body on this connection, within `limit` bytes for all its
    /// requests at once (an HTTP/2 connection carries many); `None` when that would pass it.
    pub fn reserve_body(&self, bytes: usize, limit: usize) -> Option<BodyOnConnection> {
        let counter = &self.0.body_bytes;
        let mut now = counter.load(Ordering::Acquire);
        loop {
            let next = now.checked_add(bytes).filter(|n| *n <= limit)?;
            match counter.compare_exchange_weak(now, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    return Some(BodyOnConnection {
                        state: self.0.clone(),
                        bytes,
                    });
                }
                Err(seen) => now = seen,
            }
        }
    }
}

/// Body bytes reserved on a connection, given back when dropped.
#[derive(Debug)]
pub struct BodyOnConnection {
    state: Arc<ConnState>,
    bytes: usize,
}

impl Drop for BodyOnConnection {
    fn drop(&mut self) {
        self.state
            .body_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Takes the connection state out of the request and puts the plain connection info back.
fn unwrap_info(ext: &mut http::Extensions) -> Option<Arc<ConnState>> {
    if let Some(info) = ext.remove::<ConnInfo<TcpConnectInfo>>() {
        ext.insert(info.inner);
        return Some(info.state);
    }
    if let Some(info) = ext.remove::<ConnInfo<UdsConnectInfo>>() {
        ext.insert(info.inner);
        return Some(info.state);
    }
    if let Some(tls) = ext.get::<TlsConnectInfo<ConnInfo<TcpConnectInfo>>>() {
        let info = tls.get_ref().clone();
        ext.insert(info.inner);
        return Some(info.state);
    }
    // The HTTP port (axum puts its connection information in this wrapper).
    if let Some(axum::extract::ConnectInfo(info)) =
        ext.remove::<axum::extract::ConnectInfo<ConnInfo<std::net::SocketAddr>>>()
    {
        ext.insert(axum::extract::ConnectInfo(info.inner));
        return Some(info.state);
    }
    None
}

impl<S, B, ResBody> Service<http::Request<B>> for Streams<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: http_body::Body + Send + 'static,
{
    type Response = http::Response<Guarded<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let state = unwrap_info(req.extensions_mut());
        if let Some(state) = &state {
            req.extensions_mut().insert(Connection(state.clone()));
        }
        let open = state.map(Open::new);
        let fut = self.inner.call(req);
        Box::pin(async move {
            let response = fut.await?;
            Ok(response.map(|body| Guarded {
                body: Box::pin(body),
                _open: open,
            }))
        })
    }
}

/// A response body that keeps its request counted open until it is dropped.
#[derive(Debug)]
pub struct Guarded<B> {
    body: Pin<Box<B>>,
    _open: Option<Open>,
}

impl<B: http_body::Body> http_body::Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        self.body.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests;
