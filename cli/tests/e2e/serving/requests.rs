//! One request's path: computed by a worker, refused offers, unknown models, deadlines,
//! cancellation, a full queue, a lost worker, a hot swap.

use std::time::{Duration, Instant};

use modelshare_proto::v1 as pb;
use tonic::Code;

use super::{assert_drained, oip_client, rows, server_with, texts, with_timeout};
use crate::common::{eventually, stats};
use crate::worker_util::{Offer, serve, try_serve};

#[tokio::test]
async fn a_request_is_computed_by_a_worker_and_the_answer_names_its_version() {
    let server = server_with(&[], &["enc"]).await;
    let worker = serve(&server.address, "enc", Offer::default()).await;
    assert_eq!(worker.accepted.version, 1);
    let mut client = oip_client(&server, None).await;
    let r = client
        .model_infer(texts("enc", &["a", "hello world", ""]))
        .await
        .expect("infer")
        .into_inner();
    assert_eq!(r.model_name, "enc");
    assert_eq!(r.model_version, "1");
    assert_eq!(r.id, "req-1");
    assert_eq!(
        rows(&r),
        vec![vec![1.0, 1.0], vec![11.0, 1.0], vec![0.0, 1.0]]
    );
    let seen = worker.seen();
    assert_eq!(seen.items, 3);
    // ps shows the stream; stats the model's request path.
    let mut admin = server.admin().await;
    let sessions = admin
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .expect("ps")
        .into_inner()
        .sessions;
    let s = sessions
        .iter()
        .find(|s| s.session_id == worker.session_id)
        .expect("session");
    assert_eq!(s.serving.len(), 1);
    assert_eq!(
        (s.serving[0].model.as_str(), s.serving[0].version),
        ("enc", 1)
    );
    assert_eq!(s.serving[0].batches_done, seen.batches as u64);
    let st = stats(&mut admin).await;
    let m = st.serving.iter().find(|m| m.model == "enc").expect("enc");
    assert_eq!(m.serving_workers, 1);
    assert_drained(&server).await;
    worker.close().await.expect("clean close");
}

/// A streaming worker gets one item a batch, at most `streams` out, the stream's window in its
/// ServeAccepted (its credits and batch size ignored); a request that does not stream gets its
/// final results from it as from any worker.
#[tokio::test]
async fn a_streaming_worker_takes_one_item_a_batch() {
    let server = server_with(&[], &["enc"]).await;
    let offer = Offer {
        streams: 2,
        credits: 0,
        max_batch_items: 0,
        ..Offer::default()
    };
    let worker = serve(&server.address, "enc", offer).await;
    assert_eq!(worker.accepted.initial_window, 16);
    let mut client = oip_client(&server, None).await;
    let r = client
        .model_infer(texts("enc", &["a", "hello world", ""]))
        .await
        .expect("infer")
        .into_inner();
    assert_eq!(
        rows(&r),
        vec![vec![1.0, 1.0], vec![11.0, 1.0], vec![0.0, 1.0]]
    );
    let seen = worker.seen();
    assert_eq!(seen.sizes, vec![1, 1, 1]);
    assert!(seen.max_held <= 2, "{seen:?}");
    assert_drained(&server).await;
    worker.close().await.expect("clean close");
}

#[tokio::test]
async fn bad_offers_are_refused_with_the_documented_codes() {
    let server = server_with(&[], &["enc"]).await;
    let bad = |f: fn(&mut Offer)| {
        let mut o = Offer::default();
        f(&mut o);
        o
    };
    for (offer, code) in [
        (bad(|o| o.credits = 0), Code::InvalidArgument),
        (bad(|o| o.max_batch_items = 0), Code::InvalidArgument),
        (
            bad(|o| o.accepts = vec!["audio".into()]),
            Code::InvalidArgument,
        ),
        (bad(|o| o.accepts.clear()), Code::InvalidArgument),
        (bad(|o| o.max_batch_bytes = 1 << 40), Code::InvalidArgument),
        (bad(|o| o.version = 7), Code::NotFound),
        (bad(|o| o.streams = 2000), Code::InvalidArgument),
    ] {
        let got = try_serve(&server.address, None, "enc", offer.clone()).await;
        let status = got.err().unwrap_or_else(|| panic!("{offer:?} accepted"));
        assert_eq!(status.code(), code, "{offer:?}: {status:?}");
    }
    // An unknown model: the attach fails first, as it should.
    let status = try_serve(&server.address, None, "nope", Offer::default())
        .await
        .err()
        .expect("refused");
    assert_eq!(status.code(), Code::NotFound);
}

#[tokio::test]
async fn unknown_models_and_a_model_with_no_worker_are_answered_clearly() {
    let server = server_with(&["--no-worker-wait-ms", "300"], &["enc"]).await;
    let mut client = oip_client(&server, None).await;
    let status = client
        .model_infer(texts("missing", &["x"]))
        .await
        .expect_err("unknown");
    assert_eq!(status.code(), Code::NotFound);
    let started = Instant::now();
    let status = client
        .model_infer(texts("enc", &["x"]))
        .await
        .expect_err("no worker");
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("no worker serves model 'enc'"),
        "{status:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_drained(&server).await;
}

#[tokio::test]
async fn an_expired_deadline_is_never_dispatched_and_a_cancelled_call_reaches_the_worker() {
    let server = server_with(&[], &["enc"]).await;
    let offer = Offer {
        credits: 1,
        ..Offer::default()
    };
    let worker = serve(&server.address, "enc", offer).await;
    let mut client = oip_client(&server, None).await;
    // The one credit is busy for 1.5 s...
    let busy = tokio::spawn({
        let mut c = client.clone();
        async move { c.model_infer(texts("enc", &["sleep:1500"])).await }
    });
    eventually(Duration::from_secs(5), "the slow item in flight", || {
        let items = worker.seen().items;
        async move { items == 1 }
    })
    .await;
    // ...so this one's 200 ms deadline passes in the queue.
    let status = client
        .model_infer(with_timeout(texts("enc", &["late"]), 200))
        .await
        .expect_err("deadline");
    // The request path answers DEADLINE_EXCEEDED a little before the header's time; on a
    // starved machine tonic's own timer on the header may still answer first, with CANCELLED
    // "Timeout expired". Either way the item must never reach the worker (below).
    assert!(
        status.code() == Code::DeadlineExceeded
            || (status.code() == Code::Cancelled && status.message().contains("Timeout expired")),
        "{status:?}"
    );
    busy.await.expect("task").expect("slow one answered");
    assert_eq!(worker.seen().items, 1, "the expired item was dispatched");

    // A caller that goes away: its item in flight is cancelled at the worker.
    let call = tokio::spawn({
        let mut c = client.clone();
        async move { c.model_infer(texts("enc", &["sleep:1000"])).await }
    });
    eventually(Duration::from_secs(5), "the second item in flight", || {
        let items = worker.seen().items;
        async move { items == 2 }
    })
    .await;
    call.abort();
    eventually(
        Duration::from_secs(5),
        "the worker told of the cancel",
        || {
            let n = worker.seen().cancelled.len();
            async move { n == 1 }
        },
    )
    .await;
    assert_drained(&server).await;
    worker.close().await.expect("clean close");
}

#[tokio::test]
async fn a_full_queue_is_refused_at_once_and_a_lost_workers_items_go_to_another() {
    let config = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(config.path(), "[serving]\nmax_queue_items = 2\n").expect("write");
    let path = config.path().to_str().expect("utf-8").to_owned();
    let server = server_with(
        &["--config", &path, "--no-worker-wait-ms", "5000"],
        &["enc"],
    )
    .await;
    let mut client = oip_client(&server, None).await;
    let waiting = tokio::spawn({
        let mut c = client.clone();
        async move { c.model_infer(texts("enc", &["abc", "de"])).await }
    });
    let mut admin = server.admin().await;
    eventually(Duration::from_secs(5), "two items queued", || {
        let mut admin = admin.clone();
        async move {
            stats(&mut admin)
                .await
                .serving
                .iter()
                .any(|m| m.queued_items == 2)
        }
    })
    .await;
    let status = client
        .model_infer(texts("enc", &["x"]))
        .await
        .expect_err("full");
    assert_eq!(status.code(), Code::ResourceExhausted);
    // A worker takes the queued request and is lost with it in flight...
    let first = serve(
        &server.address,
        "enc",
        Offer {
            batch_ms: 60_000,
            ..Offer::default()
        },
    )
    .await;
    eventually(
        Duration::from_secs(5),
        "the items at the first worker",
        || {
            let n = first.seen().items;
            async move { n == 2 }
        },
    )
    .await;
    first.kill();
    // ...and a second computes it.
    let second = serve(&server.address, "enc", Offer::default()).await;
    let r = waiting
        .await
        .expect("task")
        .expect("requeued and answered")
        .into_inner();
    assert_eq!(rows(&r), vec![vec![3.0, 1.0], vec![2.0, 1.0]]);
    assert_eq!(second.seen().items, 2);
    assert_drained(&server).await;
    let _ = stats(&mut admin).await;
}

#[tokio::test]
async fn in_a_hot_swap_new_items_go_to_the_new_version_and_the_old_worker_drains() {
    let server = server_with(&[], &["enc"]).await;
    let old = serve(&server.address, "enc", Offer::default()).await;
    let mut client = oip_client(&server, None).await;
    let r = client
        .model_infer(texts("enc", &["x"]))
        .await
        .expect("v1")
        .into_inner();
    assert_eq!(r.model_version, "1");
    // Version 2 replaces version 1: its worker comes, the old one is told to drain.
    let mut admin = server.admin().await;
    crate::common::load(&mut admin, "enc", "enc")
        .await
        .expect("load v2");
    let new = serve(&server.address, "enc", Offer::default()).await;
    assert_eq!(new.accepted.version, 2);
    eventually(
        Duration::from_secs(5),
        "the old worker told to drain",
        || {
            let drains = old.seen().drains;
            async move { drains == 1 }
        },
    )
    .await;
    for _ in 0..5 {
        let r = client
            .model_infer(texts("enc", &["y"]))
            .await
            .expect("v2")
            .into_inner();
        assert_eq!(r.model_version, "2");
        assert_eq!(rows(&r), vec![vec![1.0, 2.0]]);
    }
    assert_eq!(old.seen().items, 1, "the draining worker got new items");
    old.close().await.expect("the old worker leaves cleanly");
    assert_drained(&server).await;
}
