//! Passing a descriptor over a Unix stream socket in exchange for a one-time ticket.
//!
//! # Wire protocol
//!
//! One exchange per connection:
//!
//! 1. The client connects and writes the ticket followed by `\n`. A ticket is 1 to
//!    [`MAX_TICKET_LEN`] printable ASCII bytes without whitespace (`0x21..=0x7e`).
//! 2. The server answers with a single line, then closes:
//!    - `OK\n`, carrying exactly one descriptor as `SCM_RIGHTS` ancillary data in the same
//!      `sendmsg`; or
//!    - `ERR <reason>\n`, with a reason of at most [`MAX_REASON_LEN`] bytes and no descriptor.
//!
//! The server reads at most `MAX_TICKET_LEN + 1` bytes: a longer line, an empty ticket, or
//! bytes outside the allowed set are a [`DeviceError::Protocol`] error. The client takes any
//! other reply (an `OK` without a descriptor or with several, a line of more than
//! `4 + MAX_REASON_LEN + 1` bytes, a connection closed early) as a protocol error as well, and
//! closes any descriptors that came with it. Received descriptors are close-on-exec
//! (`MSG_CMSG_CLOEXEC`). Each side gives up after [`HANDOFF_TIMEOUT`].
//!
//! Server: [`read_ticket`], then [`send_fd`] or [`send_refusal`], then drop the stream.
//! Client: [`redeem`].
//!
//! # Offers (the other direction)
//!
//! A worker that kept an arena's descriptor across a server restart offers it back: it sends
//! its offer ticket line (from the `OfferHeld` call) with the descriptor attached to it as
//! `SCM_RIGHTS`, and the server answers `OK\n` (adopted; no descriptor) or `ERR <reason>\n`.
//! Server: [`read_ticket_and_fd`], then [`send_ok`] or [`send_refusal`]. Client: [`offer`].
//! A ticket line carrying more than one descriptor is a protocol error (all are closed).
//!
//! # Descriptors a peer did not owe
//!
//! Neither side holds a descriptor the protocol has no place for. A line is read keeping at
//! most one descriptor (the offer's, or the `OK` reply's); a second one ends the read at once
//! with a protocol error, and every descriptor received so far is closed as the error
//! returns, before the rest of the line is awaited. A client sending its ticket a byte at a
//! time, each byte with descriptors attached, so pins at most one of the server's descriptors
//! (besides its socket) until its line ends or its time is up.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;

use crate::error::{DeviceError, Result};

/// The longest ticket, in bytes (without the `\n`).
pub const MAX_TICKET_LEN: usize = 128;

/// The longest refusal reason, in bytes; longer reasons are cut at a character boundary.
pub const MAX_REASON_LEN: usize = 512;

/// How long either side waits for the other before it gives up on the exchange.
pub const HANDOFF_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest reply line the client accepts: `ERR `, the reason, `\n`.
const MAX_REPLY_LEN: usize = 4 + MAX_REASON_LEN + 1;

/// Room for this many descriptors in one `recvmsg`'s ancillary buffer, so that a line with too
/// many is seen (and its descriptors closed) rather than silently truncated.
const RECV_FD_ROOM: usize = 4;

/// Checks that `ticket` is 1..=[`MAX_TICKET_LEN`] printable ASCII bytes without whitespace.
pub fn validate_ticket(ticket: &[u8]) -> Result<()> {
    if ticket.is_empty() {
        return Err(protocol("the ticket is empty"));
    }
    if ticket.len() > MAX_TICKET_LEN {
        return Err(protocol(format!(
            "the ticket is {} bytes long, more than {MAX_TICKET_LEN}",
            ticket.len()
        )));
    }
    if let Some(pos) = ticket.iter().position(|b| !b.is_ascii_graphic()) {
        return Err(protocol(format!(
            "the ticket has byte {:#04x} at position {pos}: only printable ASCII without \
             whitespace is allowed",
            ticket[pos]
        )));
    }
    Ok(())
}

/// Server side: reads the ticket line, at most `MAX_TICKET_LEN + 1` bytes. A descriptor sent
/// with it (an offer, see [`read_ticket_and_fd`]) is closed.
///
/// A longer line, an invalid ticket, or a connection closed before the `\n` is a
/// [`DeviceError::Protocol`] error; a client silent for [`HANDOFF_TIMEOUT`] an `Io` error of
/// kind `TimedOut`.
pub async fn read_ticket(stream: &mut UnixStream) -> Result<String> {
    read_ticket_and_fd(stream).await.map(|(ticket, _)| ticket)
}

/// Server side: reads the ticket line and the descriptor sent with it, if any (an offer).
/// Errors as [`read_ticket`]; more than one descriptor is a protocol error.
pub async fn read_ticket_and_fd(stream: &mut UnixStream) -> Result<(String, Option<OwnedFd>)> {
    let (line, fd) = with_timeout(
        "reading the ticket",
        recv_line(stream, MAX_TICKET_LEN + 1, "ticket"),
    )
    .await?;
    validate_ticket(&line)?;
    Ok((line.iter().map(|&b| char::from(b)).collect(), fd))
}

/// Reads one `\n`-terminated line of at most `max` bytes (the `\n` included), with the one
/// descriptor that may come with it; `what` names the line in errors ("ticket", "reply").
///
/// A second descriptor (or more than the ancillary buffer holds) is a protocol error at once:
/// the read stops there and every descriptor received is closed as the error returns (see the
/// module docs), so a peer cannot make this side hold descriptors by trickling its line.
async fn recv_line(
    stream: &UnixStream,
    max: usize,
    what: &'static str,
) -> Result<(Vec<u8>, Option<OwnedFd>)> {
    let mut buf = vec![0u8; max];
    let mut filled = 0;
    let mut kept: Option<OwnedFd> = None;
    loop {
        if let Some(end) = buf[..filled].iter().position(|&b| b == b'\n') {
            buf.truncate(end);
            return Ok((buf, kept));
        }
        if filled == buf.len() {
            return Err(protocol(format!(
                "the {what} line is longer than {} bytes",
                max - 1
            )));
        }
        let (n, received, truncated) = stream
            .async_io(Interest::READABLE, || {
                let mut space =
                    [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(RECV_FD_ROOM))];
                let mut control = RecvAncillaryBuffer::new(&mut space);
                let mut iov = [IoSliceMut::new(&mut buf[filled..])];
                let msg =
                    rustix::net::recvmsg(stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
                let mut received: Vec<OwnedFd> = Vec::new();
                for message in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(fds) = message {
                        received.extend(fds);
                    }
                }
                Ok((msg.bytes, received, msg.flags.contains(ReturnFlags::CTRUNC)))
            })
            .await
            .map_err(|source| DeviceError::Io {
                op: if what == "ticket" {
                    "reading the ticket"
                } else {
                    "receiving the reply"
                },
                source,
            })?;
        let count = received.len() + usize::from(kept.is_some());
        if truncated || count > 1 {
            // `received` and `kept` close here, before anything else is read.
            return Err(protocol(format!(
                "the {what} line carried {count}{} descriptors, at most one is allowed",
                if truncated { " or more" } else { "" }
            )));
        }
        if let Some(fd) = received.into_iter().next() {
            kept = Some(fd);
        }
        if n == 0 {
            return Err(protocol(match (what, filled) {
                ("ticket", 0) => "the client closed the connection without sending a ticket",
                ("ticket", _) => "the client closed the connection before the ticket line ended",
                (_, 0) => "the server closed the connection without replying",
                _ => "the server closed the connection before the reply line ended",
            }));
        }
        filled += n;
    }
}

/// Server side: answers `OK\n` with `fd` attached as `SCM_RIGHTS`.
pub async fn send_fd(stream: &UnixStream, fd: BorrowedFd<'_>) -> Result<()> {
    with_timeout("sending the descriptor", send_fd_inner(stream, fd)).await
}

async fn send_fd_inner(stream: &UnixStream, fd: BorrowedFd<'_>) -> Result<()> {
    send_with_fd(stream, b"OK\n", fd).await
}

/// Sends `line` with `fd` attached to its first byte.
async fn send_with_fd(stream: &UnixStream, line: &[u8], fd: BorrowedFd<'_>) -> Result<()> {
    let io_err = |source| DeviceError::Io {
        op: "sending the descriptor",
        source,
    };
    let fds = [fd];
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
                return Err(std::io::Error::other("no room for the descriptor"));
            }
            rustix::net::sendmsg(
                stream,
                &[IoSlice::new(line)],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .map_err(std::io::Error::from)
        })
        .await
        .map_err(io_err)?;
    // The descriptor went with the first byte; the rest of a short write goes plain.
    let mut done = sent;
    while done < line.len() {
        done += stream
            .async_io(Interest::WRITABLE, || {
                rustix::net::send(stream, &line[done..], SendFlags::NOSIGNAL)
                    .map_err(std::io::Error::from)
            })
            .await
            .map_err(io_err)?;
    }
    Ok(())
}

/// Server side: answers `ERR <reason>\n` and shuts down the write half.
///
/// Line breaks and other control characters in `reason` become spaces, and it is cut to
/// [`MAX_REASON_LEN`] bytes at a character boundary.
pub async fn send_refusal(stream: &mut UnixStream, reason: &str) -> Result<()> {
    let reason = clean_reason(reason);
    let line = format!("ERR {reason}\n");
    with_timeout("sending the refusal", async {
        stream.write_all(line.as_bytes()).await?;
        stream.shutdown().await
    })
    .await
}

/// `reason` without control characters, cut to [`MAX_REASON_LEN`] bytes.
fn clean_reason(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len().min(MAX_REASON_LEN));
    for c in reason.chars() {
        let c = if c.is_control() { ' ' } else { c };
        if out.len() + c.len_utf8() > MAX_REASON_LEN {
            break;
        }
        out.push(c);
    }
    out
}

/// Server side: answers an offer with `OK\n` (the descriptor was adopted).
pub async fn send_ok(stream: &mut UnixStream) -> Result<()> {
    with_timeout("sending the answer", async {
        stream.write_all(b"OK\n").await?;
        stream.shutdown().await
    })
    .await
}

/// Client side: offers `fd` to the server against an offer `ticket` (see the module docs).
/// `Ok` when the server adopted it; a refusal is [`DeviceError::HandoffRefused`].
pub async fn offer(socket: &Path, ticket: &str, fd: BorrowedFd<'_>) -> Result<()> {
    validate_ticket(ticket.as_bytes())?;
    let stream = with_timeout(
        "connecting to the handle socket",
        UnixStream::connect(socket),
    )
    .await?;
    let line = format!("{ticket}\n");
    with_timeout(
        "sending the offer",
        send_with_fd(&stream, line.as_bytes(), fd),
    )
    .await?;
    let (reply, _fd) = with_timeout(
        "receiving the answer",
        recv_line(&stream, MAX_REPLY_LEN, "reply"),
    )
    .await?;
    if reply == b"OK" {
        return Ok(());
    }
    if let Some(rest) = reply.strip_prefix(b"ERR")
        && (rest.is_empty() || rest.starts_with(b" "))
    {
        return Err(DeviceError::HandoffRefused {
            reason: String::from_utf8_lossy(rest.strip_prefix(b" ").unwrap_or(rest)).into_owned(),
        });
    }
    Err(protocol(format!(
        "unexpected answer {:?}",
        String::from_utf8_lossy(&reply[..reply.len().min(64)])
    )))
}

/// Client side: connects to `socket`, sends `ticket` and receives the descriptor.
///
/// A refusal is [`DeviceError::HandoffRefused`] with the server's reason; a reply that breaks
/// the protocol is [`DeviceError::Protocol`]. The descriptor is close-on-exec.
pub async fn redeem(socket: &Path, ticket: &str) -> Result<OwnedFd> {
    validate_ticket(ticket.as_bytes())?;
    let mut stream = with_timeout(
        "connecting to the handle socket",
        UnixStream::connect(socket),
    )
    .await?;
    let line = format!("{ticket}\n");
    with_timeout("sending the ticket", stream.write_all(line.as_bytes())).await?;
    with_timeout("receiving the reply", receive_reply(&stream)).await
}

async fn receive_reply(stream: &UnixStream) -> Result<OwnedFd> {
    // A reply with several descriptors is a protocol error in `recv_line`.
    let (line, fd) = recv_line(stream, MAX_REPLY_LEN, "reply").await?;
    let line = &line[..];
    if line == b"OK" {
        return fd.ok_or_else(|| protocol("the OK reply carried no descriptor"));
    }
    if let Some(rest) = line.strip_prefix(b"ERR") {
        let reason = rest.strip_prefix(b" ").unwrap_or(rest);
        if rest.is_empty() || rest.starts_with(b" ") {
            // A descriptor sent with a refusal is closed as `fd` drops.
            return Err(DeviceError::HandoffRefused {
                reason: String::from_utf8_lossy(reason).into_owned(),
            });
        }
    }
    Err(protocol(format!(
        "unexpected reply {:?}",
        String::from_utf8_lossy(&line[..line.len().min(64)])
    )))
}

/// Runs `fut`, turning an overrun of [`HANDOFF_TIMEOUT`] into an `Io` error of kind
/// `TimedOut` and any `std::io::Error` into an `Io` error named `op`.
async fn with_timeout<T, E>(
    op: &'static str,
    fut: impl Future<Output = std::result::Result<T, E>>,
) -> Result<T>
where
    E: Into<IoOrDevice>,
{
    match tokio::time::timeout(HANDOFF_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(match e.into() {
            IoOrDevice::Io(source) => DeviceError::Io { op, source },
            IoOrDevice::Device(e) => e,
        }),
        Err(_) => Err(DeviceError::Io {
            op,
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no progress within {HANDOFF_TIMEOUT:?}"),
            ),
        }),
    }
}

/// The two error types the futures given to [`with_timeout`] return.
enum IoOrDevice {
    Io(std::io::Error),
    Device(DeviceError),
}

impl From<std::io::Error> for IoOrDevice {
    fn from(e: std::io::Error) -> Self {
        IoOrDevice::Io(e)
    }
}

impl From<DeviceError> for IoOrDevice {
    fn from(e: DeviceError) -> Self {
        IoOrDevice::Device(e)
    }
}

fn protocol(reason: impl Into<String>) -> DeviceError {
    DeviceError::Protocol {
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::net::{UnixListener as StdListener, UnixStream as StdStream};
    use std::path::PathBuf;

    use rustix::io::FdFlags;
    use tokio::io::AsyncReadExt;
    use tokio::net::UnixListener;

    use super::*;
    use crate::test_util::random_bytes;
    use crate::{Arena, HostArena, HostMapping};

    fn socket_path(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("handles.sock")
    }

    fn sealed_arena(data: &[u8]) -> HostArena {
        let arena = HostArena::new(data.len() as u64, "handoff").unwrap();
        arena.write_at(0, data).unwrap();
        arena.seal().unwrap();
        arena
    }

    /// A ticket redeemed over a real socket yields a close-on-exec fd that maps to the same bytes.
    #[tokio::test]
    async fn ticket_for_fd_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(&dir);
        let listener = UnixListener::bind(&path).unwrap();
        let data = random_bytes(2 * 1024 * 1024 + 1, 3);
        let arena = sealed_arena(&data);
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let ticket = read_ticket(&mut stream).await.unwrap();
            assert_eq!(ticket, "t-0123456789abcdef");
            let Some(fd) = arena.export().unwrap().fd else {
                panic!("a host arena exports an fd")
            };
            send_fd(&stream, fd.as_fd()).await.unwrap();
        });
        let fd = redeem(&path, "t-0123456789abcdef").await.unwrap();
        server.await.unwrap();
        let fd_flags = rustix::io::fcntl_getfd(&fd).unwrap();
        assert!(
            fd_flags.contains(FdFlags::CLOEXEC),
            "received fd is not CLOEXEC"
        );
        let mapping = HostMapping::map(fd, data.len() as u64).unwrap();
        assert!(mapping.as_slice() == data);
    }

    /// An offer no longer carries the worker's descriptor to the server with its ticket (or
    /// the server cannot adopt the same memory from it, or the worker does not hear the OK).
    #[tokio::test]
    async fn an_offer_carries_the_descriptor_to_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(&dir);
        let listener = UnixListener::bind(&path).unwrap();
        let data = random_bytes(1 << 20, 9);
        let arena = sealed_arena(&data);
        let Some(kept) = arena.export().unwrap().fd else {
            panic!("a host arena exports an fd")
        };
        drop(arena);
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let (ticket, fd) = read_ticket_and_fd(&mut stream).await.unwrap();
            send_ok(&mut stream).await.unwrap();
            (ticket, fd.expect("the offer's descriptor"))
        });
        offer(&path, "o-42", kept.as_fd()).await.unwrap();
        let (ticket, fd) = server.await.unwrap();
        assert_eq!(ticket, "o-42");
        let adopted = HostArena::adopt(fd, data.len() as u64).unwrap();
        let mut back = vec![0u8; data.len()];
        adopted.read_at(0, &mut back).unwrap();
        assert!(back == data);
    }

    /// A refused offer no longer reaches the worker as HandoffRefused with the reason, or a
    /// plain ticket read no longer closes a descriptor sent with it.
    #[tokio::test]
    async fn a_refused_offer_names_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(&dir);
        let listener = UnixListener::bind(&path).unwrap();
        let arena = sealed_arena(b"weights");
        let Some(kept) = arena.export().unwrap().fd else {
            panic!("a host arena exports an fd")
        };
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_ticket(&mut stream).await.unwrap();
            send_refusal(&mut stream, "checksum of tensor 'w' differs")
                .await
                .unwrap();
        });
        let err = offer(&path, "o-1", kept.as_fd()).await.unwrap_err();
        server.await.unwrap();
        assert!(
            matches!(&err, DeviceError::HandoffRefused { reason } if reason.contains("tensor 'w'")),
            "{err}"
        );
    }

    /// A refusal reaches the client as HandoffRefused with the server's reason.
    #[tokio::test]
    async fn refusal_carries_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(&dir);
        let listener = UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_ticket(&mut stream).await.unwrap();
            send_refusal(&mut stream, "ticket unknown or already used")
                .await
                .unwrap();
        });
        let err = redeem(&path, "stale").await.unwrap_err();
        server.await.unwrap();
        match err {
            DeviceError::HandoffRefused { reason } => {
                assert_eq!(reason, "ticket unknown or already used")
            }
            other => panic!("expected a refusal, got {other}"),
        }
    }

    /// Refusal reasons are kept to one line of at most MAX_REASON_LEN bytes.
    #[tokio::test]
    async fn long_refusal_is_cut_to_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(&dir);
        let listener = UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_ticket(&mut stream).await.unwrap();
            let reason = format!("line one\nline two {}", "ü".repeat(600));
            send_refusal(&mut stream, &reason).await.unwrap();
        });
        let err = redeem(&path, "x").await.unwrap_err();
        server.await.unwrap();
        let DeviceError::HandoffRefused { reason } = err else {
            panic!("expected a refusal, got {err}");
        };
        assert!(reason.starts_with("line one line two ü"));
        assert!(reason.len() <= MAX_REASON_LEN && reason.len() >= MAX_REASON_LEN - 1);
    }

    /// An over-long ticket line is a protocol error, on the server and before the client sends.
    #[tokio::test]
    async fn overlong_ticket_is_protocol_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(&dir);
        let listener = UnixListener::bind(&path).unwrap();
        let mut client = UnixStream::connect(&path).await.unwrap();
        let (mut stream, _) = listener.accept().await.unwrap();
        let line = format!("{}\n", "a".repeat(MAX_TICKET_LEN + 1));
        client.write_all(line.as_bytes()).await.unwrap();
        let err = read_ticket(&mut stream).await.unwrap_err();
        assert!(
            matches!(&err, DeviceError::Protocol { reason } if reason.contains("longer")),
            "{err}"
        );
        // Exactly MAX_TICKET_LEN is fine.
        let mut client = UnixStream::connect(&path).await.unwrap();
        let (mut stream, _) = listener.accept().await.unwrap();
        let ticket = "b".repeat(MAX_TICKET_LEN);
        client
            .write_all(format!("{ticket}\n").as_bytes())
            .await
            .unwrap();
        assert_eq!(read_ticket(&mut stream).await.unwrap(), ticket);
        // The client checks before connecting (this path has no listener).
        let nowhere = dir.path().join("nowhere.sock");
        for bad in ["a".repeat(MAX_TICKET_LEN + 1), String::new(), "a b".into()] {
            assert!(matches!(
                redeem(&nowhere, &bad).await,
                Err(DeviceError::Protocol { .. })
            ));
        }
    }

    /// Clients sending garbage get protocol errors and the server goes on serving good ones.
    #[tokio::test]
    async fn garbage_clients_do_not_break_server() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(&dir);
        let listener = UnixListener::bind(&path).unwrap();
        let data = random_bytes(4096, 5);
        let arena = sealed_arena(&data);
        let garbage: Vec<Vec<u8>> = vec![
            b"\xff\xfe\x00garbage\n".to_vec(),
            b"two words\n".to_vec(),
            b"\n".to_vec(),
            b"no newline then close".to_vec(),
            Vec::new(),
            vec![b'z'; 10_000],
        ];
        let count = garbage.len();
        let server = tokio::spawn(async move {
            for _ in 0..count {
                let (mut stream, _) = listener.accept().await.unwrap();
                let err = read_ticket(&mut stream).await.unwrap_err();
                assert!(matches!(err, DeviceError::Protocol { .. }), "{err}");
                let _ = send_refusal(&mut stream, &err.to_string()).await;
            }
            let (mut stream, _) = listener.accept().await.unwrap();
            assert_eq!(read_ticket(&mut stream).await.unwrap(), "good");
            let Some(fd) = arena.export().unwrap().fd else {
                panic!("a host arena exports an fd")
            };
            send_fd(&stream, fd.as_fd()).await.unwrap();
        });
        for bytes in garbage {
            let mut client = UnixStream::connect(&path).await.unwrap();
            // The server may close before taking all of it; that is fine.
            let _ = client.write_all(&bytes).await;
            let _ = client.shutdown().await;
            let mut reply = Vec::new();
            let _ = client.read_to_end(&mut reply).await;
        }
        let fd = redeem(&path, "good").await.unwrap();
        server.await.unwrap();
        let mapping = HostMapping::map(fd, data.len() as u64).unwrap();
        assert!(mapping.as_slice() == data);
    }

    /// Runs a fake blocking server that reads the ticket and answers `reply` with `fds`.
    fn fake_server(
        path: &Path,
        reply: &'static [u8],
        fds: Vec<OwnedFd>,
    ) -> std::thread::JoinHandle<()> {
        let listener = StdListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut buf = [0; 256];
            let _ = rustix::io::read(&stream, &mut buf).unwrap();
            let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|fd| fd.as_fd()).collect();
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !borrowed.is_empty() {
                assert!(control.push(SendAncillaryMessage::ScmRights(&borrowed)));
            }
            rustix::net::sendmsg(
                &stream,
                &[IoSlice::new(reply)],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .unwrap();
        })
    }

    fn some_fd() -> OwnedFd {
        let arena = sealed_arena(b"x");
        let Some(fd) = arena.export().unwrap().fd else {
            panic!("a host arena exports an fd")
        };
        fd
    }

    /// Replies that break the protocol (no fd, several fds, junk, silence) are refused.
    #[tokio::test]
    async fn malformed_replies_are_protocol_errors() {
        let cases: Vec<(&'static [u8], usize)> = vec![
            (b"OK\n", 0),
            (b"OK\n", 2),
            (b"OK\n", 6),
            (b"HELLO\n", 0),
            (b"ERRx\n", 0),
            (b"OK", 1),
            (b"", 0),
        ];
        for (reply, nfds) in cases {
            let dir = tempfile::tempdir().unwrap();
            let path = socket_path(&dir);
            let server = fake_server(&path, reply, (0..nfds).map(|_| some_fd()).collect());
            let result = redeem(&path, "t").await;
            server.join().unwrap();
            assert!(
                matches!(result, Err(DeviceError::Protocol { .. })),
                "reply {reply:?} with {nfds} fds gave {result:?}"
            );
        }
    }

    /// A ticket sent a byte at a time, each byte with descriptors attached, no longer ends the
    /// read at the second descriptor (the server held every one until the line ended or its
    /// time ran out: 512 descriptors a connection).
    #[tokio::test]
    async fn a_trickled_line_stuffed_with_descriptors_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_path(&dir);
        let listener = UnixListener::bind(&path).unwrap();
        for per_byte in [1, 4, 8] {
            let client = StdStream::connect(&path).unwrap();
            let (mut stream, _) = listener.accept().await.unwrap();
            let fds: Vec<OwnedFd> = (0..per_byte).map(|_| some_fd()).collect();
            let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|fd| fd.as_fd()).collect();
            // Two bytes of a longer ticket, no newline: the line is not over.
            for byte in [b"a", b"b"] {
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
                let mut control = SendAncillaryBuffer::new(&mut space);
                assert!(control.push(SendAncillaryMessage::ScmRights(&borrowed)));
                rustix::net::sendmsg(
                    &client,
                    &[IoSlice::new(byte)],
                    &mut control,
                    SendFlags::NOSIGNAL,
                )
                .unwrap();
            }
            let read = tokio::time::timeout(Duration::from_secs(2), read_ticket(&mut stream))
                .await
                .unwrap_or_else(|_| panic!("{per_byte} fds a byte: still reading after 2 s"));
            assert!(
                matches!(&read, Err(DeviceError::Protocol { reason }) if reason.contains("at most one")),
                "{per_byte} fds a byte: {read:?}"
            );
        }
    }

    /// A connection to a socket nobody listens on is an Io error, not a hang or a panic.
    #[tokio::test]
    async fn missing_socket_is_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = redeem(&socket_path(&dir), "t").await.unwrap_err();
        assert!(matches!(err, DeviceError::Io { .. }), "{err}");
    }
}
