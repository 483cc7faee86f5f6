//! The handle socket under attack: clients that stuff descriptors into their ticket line, and
//! more connections than its caps allow. Each test asserts what the server holds (its open
//! descriptors) and that a legitimate worker still attaches afterwards.

use std::io::{IoSlice, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use safetensors::Dtype;

use crate::common::{self, Server, Worker, t};

fn write_model(root: &Path) {
    common::write_safetensors(
        &root.join("m").join("model.safetensors"),
        &[t("w", Dtype::F32, &[64, 64], 7)],
    );
}

/// Sends `bytes` with `fds` attached as `SCM_RIGHTS`; whether the server still took it.
fn send_with_fds(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> bool {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    rustix::net::sendmsg(
        stream,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .is_ok()
}

/// Twenty-four clients each send a ticket line a byte at a time, each byte with four memfds
/// attached, and keep their connections open. The server held every descriptor until the line
/// ended or 5 s passed (512 a connection; 41 connections exhausted a 20,000 limit and every
/// attach failed). Now each stuffed line is refused as its descriptors arrive, so the
/// server's memfds and open descriptors come back to where they were while the clients still
/// hold their sockets, and a worker attaches afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_stuffed_into_ticket_lines_are_closed_at_once() {
    let server = Server::start_with(&["--model", "m=m"], write_model).await;
    let pid = server.pid();
    let (fds_before, memfds_before) = (common::open_fds(pid), common::memfd_fds(pid));

    let stuffing: OwnedFd =
        rustix::fs::memfd_create("stuffing", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
    let four = [stuffing.as_fd(); 4];
    let ticket = b"t-0123456789abcdef0123456789abcdef";
    let mut clients = Vec::new();
    let mut sent = 0;
    for _ in 0..24 {
        let stream = UnixStream::connect(&server.handles).expect("connect");
        for byte in ticket {
            // A refused line's connection is closed by the server: the next send fails.
            if !send_with_fds(&stream, std::slice::from_ref(byte), &four) {
                break;
            }
            sent += 1;
        }
        clients.push(stream);
    }
    assert!(sent >= 24, "every client sent at least its first byte");

    // Well within the 5 s the server used to hold each line's descriptors.
    common::eventually(
        Duration::from_secs(3),
        "the server's descriptors back where they were",
        || async {
            common::memfd_fds(pid) <= memfds_before && common::open_fds(pid) <= fds_before + 4
        },
    )
    .await;
    assert_eq!(clients.len(), 24, "the clients still hold their sockets");
    drop(clients);

    let worker = Worker::start(&server, "m", "after-the-stuffing");
    assert!(
        worker.report["mapping"]["inode"].as_u64().is_some(),
        "{}",
        worker.report
    );
}

/// With `max_connections_per_peer = 6`, six silent clients of one uid fill the handle socket:
/// a seventh is closed at once (it was held until its ticket timed out, with no cap on how
/// many), the refusal is logged for the `handles` listener, and once the six go a worker
/// attaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handle_socket_connections_past_the_cap_are_refused() {
    let cfg_dir = tempfile::tempdir().expect("tempdir");
    let cfg = cfg_dir.path().join("modelshare.toml");
    std::fs::write(&cfg, "[limits]\nmax_connections_per_peer = 6\n").expect("config");
    let server = Server::start_with(
        &["--model", "m=m", "--config", cfg.to_str().expect("utf8")],
        write_model,
    )
    .await;

    let silent: Vec<UnixStream> = (0..6)
        .map(|_| UnixStream::connect(&server.handles).expect("connect"))
        .collect();
    // Accepted (and counted) by the server before the seventh comes.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut seventh = UnixStream::connect(&server.handles).expect("connect");
    seventh
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let start = Instant::now();
    let mut buf = [0u8; 64];
    let read = seventh.read(&mut buf);
    assert!(
        matches!(read, Ok(0)),
        "the seventh connection was not closed at once: {read:?} after {:?}",
        start.elapsed()
    );
    let log = server.log();
    assert!(
        log.lines()
            .any(|l| l.contains("connection refused") && l.contains("handles")),
        "no refusal logged for the handle socket:\n{log}"
    );

    drop(silent);
    drop(seventh);
    // The six places come back as the server sees the connections close.
    let mut attached = None;
    for _ in 0..50 {
        if let Ok(worker) = Worker::try_start_as(&server.address, "m", "after-the-flood", &[], None)
        {
            attached = Some(worker);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(attached.is_some(), "no worker attached after the flood");
}
