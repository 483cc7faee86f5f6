//! The server's side of the handle socket: reading a ticket (with the descriptor an offer
//! brings), then answering with a descriptor, a refusal or an `OK`.

use std::os::fd::{BorrowedFd, OwnedFd};

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use super::line::{recv_line, send_with_fd};
use super::timeout::with_timeout;
use super::{MAX_REASON_LEN, MAX_TICKET_LEN, validate_ticket};
use crate::error::Result;

/// Server side: reads the ticket line, at most `MAX_TICKET_LEN + 1` bytes. A descriptor sent
/// with it (an offer, see [`read_ticket_and_fd`]) is closed.
///
/// A longer line, an invalid ticket, or a connection closed before the `\n` is a
/// [`DeviceError::Protocol`](crate::DeviceError::Protocol) error; a client silent for
/// [`HANDOFF_TIMEOUT`](super::HANDOFF_TIMEOUT) an `Io` error of kind `TimedOut`.
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

/// Server side: answers `OK\n` with `fd` attached as `SCM_RIGHTS`.
pub async fn send_fd(stream: &UnixStream, fd: BorrowedFd<'_>) -> Result<()> {
    with_timeout("sending the descriptor", send_fd_inner(stream, fd)).await
}

async fn send_fd_inner(stream: &UnixStream, fd: BorrowedFd<'_>) -> Result<()> {
    send_with_fd(stream, b"OK\n", fd).await
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
