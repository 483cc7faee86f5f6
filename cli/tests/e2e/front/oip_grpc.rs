//! The OIP gRPC door: items, stacking, typed contents, refusals, health and metadata.

use modelshare_proto::inference as oip;
use modelshare_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tonic::Code;
use tonic::transport::Channel;

use super::{f32s, floats, grpc, stack, texts_request};
use crate::worker_util::TestWorker;

/// The generated OIP gRPC client.
type Client = GrpcInferenceServiceClient<Channel>;

/// The OIP gRPC door would split, stack, report or refuse wrongly.
#[tokio::test]
async fn grpc_model_infer_splits_requests_into_items_and_stacks_the_answers() {
    let (server, worker, _config) = stack().await;
    let mut c = grpc(&server).await;

    assert_texts_become_items(&mut c, &worker).await;
    // Tensors in raw_input_contents: rows are items; the answer is the rows stacked back.
    let x = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let raw = raw_rows_request(&x);
    let r = c.model_infer(raw.clone()).await.expect("raw").into_inner();
    assert_eq!(r.outputs[0].shape, vec![2, 3]);
    assert_eq!(r.raw_output_contents[0].as_ref(), x.as_slice());
    assert_eq!(worker.seen().items, 5);
    assert_typed_contents_keep_their_type(&mut c).await;
    assert_refusals_name_their_cause(&mut c, &raw).await;
    assert_server_and_models_live_and_ready(&mut c).await;
    assert_metadata(&mut c).await;
    worker.kill();
}

/// Texts: one BYTES input of shape [N, 1] becomes N text items.
async fn assert_texts_become_items(c: &mut Client, worker: &TestWorker) {
    let r = c
        .model_infer(texts_request("enc", &["a", "hello world", ""]))
        .await
        .expect("texts")
        .into_inner();
    assert_eq!(
        (
            r.model_name.as_str(),
            r.model_version.as_str(),
            r.id.as_str()
        ),
        ("enc", "1", "t1")
    );
    assert_eq!(r.outputs.len(), 1);
    assert_eq!(r.outputs[0].name, "embedding");
    assert_eq!(r.outputs[0].datatype, "FP32");
    assert_eq!(r.outputs[0].shape, vec![3, 2]);
    assert_eq!(
        floats(&r.raw_output_contents[0]),
        vec![1.0, 1.0, 11.0, 1.0, 0.0, 1.0]
    );
    assert_eq!(worker.seen().items, 3);
}

/// A request for `enc` version 1 of one FP32 input `x` of shape [2, 3] in raw_input_contents
/// (`x`), asking for output `echo`.
fn raw_rows_request(x: &[u8]) -> oip::ModelInferRequest {
    oip::ModelInferRequest {
        model_name: "enc".into(),
        model_version: "1".into(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![2, 3],
            ..Default::default()
        }],
        outputs: vec![oip::model_infer_request::InferRequestedOutputTensor {
            name: "echo".into(),
            ..Default::default()
        }],
        raw_input_contents: vec![x.to_vec().into()],
        ..Default::default()
    }
}

/// Typed contents of a narrow type.
async fn assert_typed_contents_keep_their_type(c: &mut Client) {
    let typed = oip::ModelInferRequest {
        model_name: "enc".into(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: "i".into(),
            datatype: "INT16".into(),
            shape: vec![2, 2],
            contents: Some(oip::InferTensorContents {
                int_contents: vec![1, -2, 3, -4],
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let r = c.model_infer(typed).await.expect("typed").into_inner();
    assert_eq!(r.outputs[0].datatype, "INT16");
    let want: Vec<u8> = [1i16, -2, 3, -4]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(r.raw_output_contents[0].as_ref(), want.as_slice());
}

/// Refusals of variants of the good request `raw`, each with its code.
async fn assert_refusals_name_their_cause(c: &mut Client, raw: &oip::ModelInferRequest) {
    let mut unknown_output = raw.clone();
    unknown_output.outputs[0].name = "nope".into();
    let mut short = raw.clone();
    short.raw_input_contents = vec![f32s(&[1.0]).into()];
    let mut mismatched = raw.clone();
    mismatched
        .inputs
        .push(oip::model_infer_request::InferInputTensor {
            name: "y".into(),
            datatype: "FP32".into(),
            shape: vec![3],
            ..Default::default()
        });
    mismatched
        .raw_input_contents
        .push(f32s(&[1.0, 2.0, 3.0]).into());
    let mut datatype = raw.clone();
    datatype.inputs[0].datatype = "FLOAT".into();
    let mut version = raw.clone();
    version.model_version = "latest".into();
    let mut missing = raw.clone();
    missing.model_name = "missing".into();
    for (request, code, needle) in [
        (unknown_output, Code::InvalidArgument, "nope"),
        (short, Code::InvalidArgument, "'x'"),
        (mismatched, Code::InvalidArgument, "'y'"),
        (datatype, Code::InvalidArgument, "FLOAT"),
        (version, Code::InvalidArgument, "latest"),
        (missing, Code::NotFound, "missing"),
    ] {
        let status = c.model_infer(request).await.expect_err("refused");
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(needle), "{status:?}");
    }
}

/// Health: the server is live and ready; `enc` is ready in version 1 (or the latest) only;
/// a missing model is not.
async fn assert_server_and_models_live_and_ready(c: &mut Client) {
    assert!(
        c.server_live(oip::ServerLiveRequest {})
            .await
            .expect("live")
            .into_inner()
            .live
    );
    assert!(
        c.server_ready(oip::ServerReadyRequest {})
            .await
            .expect("ready")
            .into_inner()
            .ready
    );
    let ready = |name: &str, version: &str| oip::ModelReadyRequest {
        name: name.into(),
        version: version.into(),
    };
    assert!(
        c.model_ready(ready("enc", ""))
            .await
            .expect("ready")
            .into_inner()
            .ready
    );
    assert!(
        c.model_ready(ready("enc", "1"))
            .await
            .expect("ready")
            .into_inner()
            .ready
    );
    assert!(
        !c.model_ready(ready("enc", "2"))
            .await
            .expect("ready")
            .into_inner()
            .ready
    );
    assert!(
        !c.model_ready(ready("missing", ""))
            .await
            .expect("ready")
            .into_inner()
            .ready
    );
}

/// Metadata of `enc`, of a missing model (NOT_FOUND) and of the server.
async fn assert_metadata(c: &mut Client) {
    let meta = c
        .model_metadata(oip::ModelMetadataRequest {
            name: "enc".into(),
            version: String::new(),
        })
        .await
        .expect("metadata")
        .into_inner();
    assert_eq!(
        (meta.name.as_str(), meta.versions.as_slice()),
        ("enc", &["1".to_owned()][..])
    );
    let status = c
        .model_metadata(oip::ModelMetadataRequest {
            name: "missing".into(),
            version: String::new(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(status.code(), Code::NotFound);
    let server_meta = c
        .server_metadata(oip::ServerMetadataRequest {})
        .await
        .expect("server metadata")
        .into_inner();
    assert_eq!(server_meta.name, "modelshare");
}
