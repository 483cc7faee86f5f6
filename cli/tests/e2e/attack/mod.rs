//! The inference doors under attack: hostile requests that once crashed or starved the server.
//! Each test asserts what the server does (answers, closes, refuses, stays up), not timings.
//!
//! Here: the raw HTTP/1 helpers and the config writer the tests share; the tests by subject
//! in the submodules.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod bodies;
mod bomb;
mod cancel;
mod grpc;
mod health;

/// Sends `head` (request line and headers, with the blank line) and `body_part` on a new
/// connection, and reads the status line the server answers within `within` (`None`: no
/// answer). The connection is returned to keep it open.
async fn send_head(
    addr: &str,
    head: &str,
    body_part: &[u8],
    within: Duration,
) -> (tokio::net::TcpStream, Option<u16>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(body_part).await.expect("body part");
    let status = read_status(&mut s, within).await;
    (s, status)
}

async fn read_status(s: &mut tokio::net::TcpStream, within: Duration) -> Option<u16> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let until = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(until, s.read(&mut buf)).await {
            Err(_) | Ok(Err(_)) | Ok(Ok(0)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
        if got.windows(2).any(|w| w == b"\r\n") {
            break;
        }
    }
    let line = String::from_utf8_lossy(&got).into_owned();
    line.split_whitespace().nth(1).and_then(|c| c.parse().ok())
}

/// Whether the server closes `s` within `within` (reads to EOF or a reset).
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let until = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(until, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

fn post_head(path: &str, token: Option<&str>, length: usize) -> String {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}Content-Length: {length}\r\n\r\n"
    )
}

/// A config file of `text` (kept alive by the returned handle).
fn config(text: &str) -> (tempfile::NamedTempFile, String) {
    let file = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(file.path(), text).expect("write config");
    let path = file.path().to_str().expect("utf-8").to_owned();
    (file, path)
}
