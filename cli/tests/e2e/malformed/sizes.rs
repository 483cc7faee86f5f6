//! Models over the size limits, and requests too large to buffer.

use modelshare_proto::v1 as pb;
use safetensors::Dtype;
use tonic::Code;

use super::assert_refused;
use crate::common::{Server, t, write_safetensors};

/// A model over --max-model-bytes would be allocated anyway (or leak its reservation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_over_max_model_bytes_is_resource_exhausted() {
    let server = Server::start_with(&["--max-model-bytes", "1024"], |root| {
        write_safetensors(
            &root.join("big/model.safetensors"),
            &[t("w", Dtype::F32, &[1024], 9)],
        );
    })
    .await;
    // The good model's arena (two tensors, 256-byte aligned) fits in 1024 bytes.
    assert_refused(
        &server,
        "big",
        "big",
        Code::ResourceExhausted,
        &["arena bytes of model 'big'", "limit 1024", "4096"],
    )
    .await;
}

/// Loads past --max-total-bytes would be allocated anyway (or leak their reservation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_over_max_total_bytes_is_resource_exhausted() {
    let server = Server::start_with(&["--max-total-bytes", "1024"], |root| {
        // Two 800-byte tensors at offsets 0 and 1024: a 2048-byte arena.
        write_safetensors(
            &root.join("wide/model.safetensors"),
            &[t("a", Dtype::F32, &[200], 1), t("b", Dtype::F32, &[200], 2)],
        );
    })
    .await;
    assert_refused(
        &server,
        "wide",
        "wide",
        Code::ResourceExhausted,
        &[
            "arena bytes held by the server",
            "limit 1024",
            "requested 2048",
        ],
    )
    .await;
}

/// The peak resident memory of process `pid`, in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

/// An `Attach` needs kilobytes: requests of 32 MiB each (sent four at a time) are refused with
/// RESOURCE_EXHAUSTED from their length prefix, before the server buffers them, so its memory
/// does not grow by what hostile clients send. A normal attach still works afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_are_refused_before_they_are_buffered() {
    let server = Server::start().await;
    let channel = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("channel");
    let worker = modelshare_proto::v1::worker_service_client::WorkerServiceClient::new(channel)
        .max_encoding_message_size(64 << 20);
    let before = peak_rss(server.pid());
    let huge = "x".repeat(32 << 20);
    let calls = (0..4).map(|_| {
        let mut w = worker.clone();
        let model = huge.clone();
        async move {
            w.attach(pb::AttachRequest {
                device_uuid: String::new(),
                session_id: "s".into(),
                model,
                version: 0,
            })
            .await
        }
    });
    for result in futures_join(calls).await {
        let status = result.expect_err("a 32 MiB attach");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(
            status
                .message()
                .contains("exceeds this method's limit of 65536 bytes"),
            "{}",
            status.message()
        );
    }
    let grew = peak_rss(server.pid()).saturating_sub(before);
    assert!(
        grew < 48 << 20,
        "the server's peak memory grew by {} MiB",
        grew >> 20
    );
    let err = worker
        .clone()
        .attach(pb::AttachRequest {
            device_uuid: String::new(),
            session_id: "no-such-session".into(),
            model: "m".into(),
            version: 0,
        })
        .await
        .expect_err("no session");
    assert_eq!(
        err.code(),
        Code::NotFound,
        "a small request is read as before: {err:?}"
    );
}

/// Runs the futures at once and collects their outputs in order.
async fn futures_join<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}
