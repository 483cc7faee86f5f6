//! The request path end to end: the real server, a test worker on `WorkerService.Serve`, and
//! callers on the KServe v2 gRPC front door (`inference.GRPCInferenceService.ModelInfer`, the
//! generated client: an independent client of the wire contract). The failure paths (refused
//! offers, unknown model, wrong tenant, full queue, expired deadline, cancelled caller, lost
//! worker) and, after each, that nothing is left behind, through the admin API.
//!
//! Here: the client, the request builders and the drained check the tests share; the tests by
//! subject in the submodules.

use std::time::Duration;

use modelshare_proto::inference as oip;
use modelshare_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use modelshare_proto::v1 as pb;

use crate::common::{Server, eventually};
use crate::tenants::{self as tn, Authed, bearer};

mod by_cli;
mod requests;
mod tenancy;

async fn oip_client(server: &Server, token: Option<&str>) -> GrpcInferenceServiceClient<Authed> {
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("connect");
    GrpcInferenceServiceClient::with_interceptor(ch, bearer(token))
}

/// A ModelInfer request of `texts` as one BYTES input of shape [N] (text items).
fn texts(model: &str, texts: &[&str]) -> oip::ModelInferRequest {
    oip::ModelInferRequest {
        model_name: model.into(),
        id: "req-1".into(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: "text".into(),
            datatype: "BYTES".into(),
            shape: vec![texts.len() as i64],
            contents: Some(oip::InferTensorContents {
                bytes_contents: texts.iter().map(|t| t.as_bytes().to_vec()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// `message` with a `grpc-timeout` header of `ms` milliseconds, and no client-side timer: the
/// server's answer is what is checked.
fn with_timeout<T>(message: T, ms: u64) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut()
        .insert("grpc-timeout", format!("{ms}m").parse().expect("header"));
    r
}

/// The `embedding` output's rows.
fn rows(r: &oip::ModelInferResponse) -> Vec<Vec<f32>> {
    let i = r
        .outputs
        .iter()
        .position(|o| o.name == "embedding")
        .expect("embedding output");
    let o = &r.outputs[i];
    let width = *o.shape.last().expect("shape") as usize;
    let values: Vec<f32> = r.raw_output_contents[i]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    values.chunks(width).map(<[f32]>::to_vec).collect()
}

async fn server_with(extra: &[&str], models: &[&str]) -> Server {
    let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    for m in models {
        args.push("--model".into());
        args.push(format!("{m}={m}"));
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let names: Vec<String> = models.iter().map(|s| s.to_string()).collect();
    Server::start_with(&refs, move |root| {
        let n: Vec<&str> = names.iter().map(String::as_str).collect();
        tn::models(root, &n);
    })
    .await
}

/// Waits until the request path holds nothing: no request outstanding, no item queued.
async fn assert_drained(server: &Server) {
    assert_drained_as(server, None).await;
}

/// [`assert_drained`] with the admin's token.
async fn assert_drained_as(server: &Server, token: Option<&str>) {
    let admin = tn::admin_as(server, token).await;
    eventually(Duration::from_secs(5), "request path drained", || {
        let mut admin = admin.clone();
        async move {
            let s = admin
                .get_stats(pb::GetStatsRequest {})
                .await
                .expect("GetStats")
                .into_inner();
            s.requests_outstanding == 0
                && s.serving.iter().all(|m| m.queued_items == 0)
                && s.tenants.iter().all(|t| t.requests == 0)
        }
    })
    .await;
}
