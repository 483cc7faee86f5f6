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
//!
//! # Layout
//!
//! This module holds the protocol's limits and the ticket's check; then `server` (reading a
//! ticket, answering with a descriptor, a refusal or an `OK`), `client` ([`redeem`],
//! [`offer`]), `line` (one line with at most one descriptor, received or sent, on the
//! socket) and `timeout` (the deadline every step runs under, and its errors).

use std::time::Duration;

use crate::error::{DeviceError, Result};

mod client;
mod line;
mod server;
#[cfg(test)]
mod tests;
mod timeout;

pub use client::{offer, redeem};
pub use server::{read_ticket, read_ticket_and_fd, send_fd, send_ok, send_refusal};

/// The longest ticket, in bytes (without the `\n`).
pub const MAX_TICKET_LEN: usize = 128;

/// The longest refusal reason, in bytes; longer reasons are cut at a character boundary.
pub const MAX_REASON_LEN: usize = 512;

/// How long either side waits for the other before it gives up on the exchange.
pub const HANDOFF_TIMEOUT: Duration = Duration::from_secs(10);

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

/// A [`DeviceError::Protocol`] error for `reason`.
fn protocol(reason: impl Into<String>) -> DeviceError {
    DeviceError::Protocol {
        reason: reason.into(),
    }
}
