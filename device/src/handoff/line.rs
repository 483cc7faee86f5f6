//! One line on the handle socket with at most one descriptor: received ([`recv_line`], which
//! closes every descriptor the peer did not owe) or sent ([`send_with_fd`]).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::Interest;
use tokio::net::UnixStream;

use super::protocol;
use crate::error::{DeviceError, Result};

/// Room for this many descriptors in one `recvmsg`'s ancillary buffer, so that a line with too
/// many is seen (and its descriptors closed) rather than silently truncated.
const RECV_FD_ROOM: usize = 4;

/// Reads one `\n`-terminated line of at most `max` bytes (the `\n` included), with the one
/// descriptor that may come with it; `what` names the line in errors ("ticket", "reply").
///
/// A second descriptor (or more than the ancillary buffer holds) is a protocol error at once:
/// the read stops there and every descriptor received is closed as the error returns (see the
/// module docs), so a peer cannot make this side hold descriptors by trickling its line.
pub(super) async fn recv_line(
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

/// Sends `line` with `fd` attached to its first byte.
pub(super) async fn send_with_fd(
    stream: &UnixStream,
    line: &[u8],
    fd: BorrowedFd<'_>,
) -> Result<()> {
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
