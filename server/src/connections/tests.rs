use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;

fn limits(per_listener: usize, per_peer: usize, handshake_ms: u64, idle_ms: u64) -> ConnLimits {
    ConnLimits {
        max_per_listener: per_listener,
        max_per_peer: per_peer,
        handshake: Duration::from_millis(handshake_ms),
        idle: Duration::from_millis(idle_ms),
    }
}

fn gate(l: ConnLimits) -> Gate {
    Gate::new("test", l, Arc::new(Metrics::new().expect("metrics")))
}

fn pipe() -> (DuplexStream, DuplexStream) {
    tokio::io::duplex(1024)
}

/// How long until the tracked side reads end of stream (the server closing it).
async fn time_to_close(mut conn: Tracked<DuplexStream>, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(within, async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    read.await.ok().map(|()| start.elapsed())
}

#[tokio::test]
async fn caps_per_peer_and_per_listener_and_places_come_back() {
    let g = gate(limits(3, 2, 10_000, 10_000));
    let a = PeerKey::Uid(1);
    let b = PeerKey::Ip("10.0.0.1".parse().expect("ip"));
    let a1 = g.admit(pipe().0, a.clone()).expect("a1");
    let _a2 = g.admit(pipe().0, a.clone()).expect("a2");
    assert!(
        g.admit(pipe().0, a.clone()).is_none(),
        "a third from one peer"
    );
    let _b1 = g.admit(pipe().0, b.clone()).expect("b1");
    assert!(
        g.admit(pipe().0, b.clone()).is_none(),
        "the listener is full"
    );
    drop(a1);
    assert!(
        g.admit(pipe().0, a).is_some(),
        "a closed connection gives its place back"
    );
}

#[tokio::test]
async fn a_connection_that_never_sends_a_request_is_closed_after_the_handshake_time() {
    let g = gate(limits(8, 8, 150, 60_000));
    let (ours, mut theirs) = pipe();
    let conn = g.admit(ours, PeerKey::Unknown).expect("admitted");
    // Bytes are not a request: half a preface keeps nothing open.
    theirs
        .write_all(b"PRI * HTTP/2.0\r\n")
        .await
        .expect("write");
    let closed = time_to_close(conn, Duration::from_secs(5)).await;
    let took = closed.expect("closed");
    assert!(took >= Duration::from_millis(100), "{took:?}");
}

#[tokio::test]
async fn an_open_request_keeps_the_connection_and_idleness_after_it_closes_it() {
    let g = gate(limits(8, 8, 100, 200));
    let (ours, _theirs) = pipe();
    let conn = g.admit(ours, PeerKey::Unknown).expect("admitted");
    let open = Open::new(conn.state.clone());
    let state = conn.state.clone();
    let watcher = tokio::spawn(time_to_close(conn, Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!watcher.is_finished(), "closed while a request was open");
    assert_eq!(state.open.load(Ordering::Acquire), 1);
    drop(open);
    let closed = watcher.await.expect("watcher").expect("closed once idle");
    // Closed within two idle periods of the request's end (the timer rechecks each period).
    assert!(
        closed < Duration::from_millis(700 + 2 * 200 + 300),
        "{closed:?}"
    );
}

#[tokio::test]
async fn a_refused_connection_is_counted_by_reason() {
    let metrics = Arc::new(Metrics::new().expect("metrics"));
    let g = Gate::new("t", limits(1, 1, 1000, 1000), metrics.clone());
    let _a = g.admit(pipe().0, PeerKey::Uid(7)).expect("first");
    assert!(g.admit(pipe().0, PeerKey::Uid(7)).is_none());
    assert_eq!(
        metrics
            .connections_closed
            .with_label_values(&["t", "listener_full"])
            .get(),
        1
    );
    assert_eq!(metrics.connections.with_label_values(&["t"]).get(), 1);
}
