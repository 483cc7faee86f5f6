//! The worker's side of the handle socket: [`redeem`] a ticket for a descriptor, or [`offer`]
//! a kept descriptor back to a restarted server.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use super::line::{recv_line, send_with_fd};
use super::timeout::with_timeout;
use super::{MAX_REASON_LEN, protocol, validate_ticket};
use crate::error::{DeviceError, Result};

/// The longest reply line the client accepts: `ERR `, the reason, `\n`.
const MAX_REPLY_LEN: usize = 4 + MAX_REASON_LEN + 1;

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
