//! Tests of the handle socket: redeems, offers, refusals, and peers that break the protocol.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener as StdListener, UnixStream as StdStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::io::FdFlags;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use super::*;
use crate::error::DeviceError;
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
