//! A batch dimension of billions of empty rows, through REST and gRPC.

use modelshare_proto::inference as oip;
use modelshare_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use serde_json::json;
use tonic::Code;

use crate::front::http;
use crate::tenants::{self as tn, TA, TC, TenantsFile, abc_tenants};
use crate::worker_util::{Offer, try_serve};

/// A bomb: a batch dimension of 2^32 rows of nothing (zero elements, so no data is needed).
fn bomb_rest() -> Vec<u8> {
    json!({"inputs": [{"name": "x", "shape": [4_294_967_296_u64, 0], "datatype": "FP32", "data": []}]})
        .to_string()
        .into_bytes()
}

fn bomb_grpc(model: &str) -> oip::ModelInferRequest {
    oip::ModelInferRequest {
        model_name: model.into(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![4_294_967_296, 0],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// An 85-byte OIP request of shape `[4294967296, 0]` aborted the server (one item built per
/// row: a 137 GB allocation) through REST and gRPC, from any tenant, even one with no model.
/// Now a tenant that may not see the model gets 404 before anything is parsed, and one that
/// may gets 413 / INVALID_ARGUMENT naming the limit; the server stays up and serves.
#[tokio::test]
async fn a_batch_dimension_of_billions_of_empty_rows_is_refused_and_the_server_stays_up() {
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = tn::start(&tenants, &["--http-listen", "127.0.0.1:0"], &["enc"]).await;
    let mut admin_a = tn::admin_as(&server, Some(TA)).await;
    tn::load_as(&mut admin_a, "enc", "enc", "", None)
        .await
        .expect("a loads enc");
    let _worker = try_serve(&server.address, Some(TA), "enc", Offer::default())
        .await
        .expect("a serves enc");
    let addr = server.http_address();
    let json_type = ("content-type", "application/json");
    let (ta, tc) = (format!("Bearer {TA}"), format!("Bearer {TC}"));

    // c has no model at all: not found, and nothing of the body is looked at.
    let r = http(
        &addr,
        "POST",
        "/v2/models/enc/infer",
        &[("authorization", &tc), json_type],
        &bomb_rest(),
    )
    .await;
    assert_eq!(r.status, 404, "{}", String::from_utf8_lossy(&r.body));
    // a owns enc: the request can never fit a queue.
    for _ in 0..3 {
        let r = http(
            &addr,
            "POST",
            "/v2/models/enc/infer",
            &[("authorization", &ta), json_type],
            &bomb_rest(),
        )
        .await;
        assert_eq!(r.status, 413, "{}", String::from_utf8_lossy(&r.body));
        let message = r.json()["error"].as_str().expect("message").to_owned();
        assert!(message.contains("max_queue_items"), "{message}");
        assert_eq!(r.header("x-should-retry"), Some("false"));
    }

    // The same over gRPC.
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("connect");
    let mut grpc = GrpcInferenceServiceClient::with_interceptor(ch, tn::bearer(Some(TA)));
    let e = grpc
        .model_infer(bomb_grpc("enc"))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("max_queue_items"), "{e:?}");
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("connect");
    let mut grpc_c = GrpcInferenceServiceClient::with_interceptor(ch, tn::bearer(Some(TC)));
    let e = grpc_c
        .model_infer(bomb_grpc("enc"))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // Still up, and still computing.
    let body =
        json!({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["abc"]}]});
    let r = http(
        &addr,
        "POST",
        "/v2/models/enc/infer",
        &[("authorization", &ta), json_type],
        body.to_string().as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let mut admin = tn::admin_as(&server, Some(TA)).await;
    admin
        .get_stats(modelshare_proto::v1::GetStatsRequest::default())
        .await
        .expect("the server answers");
}
