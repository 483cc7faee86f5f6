//! Bad model names, unknown models and versions, strings that are not UTF-8.

use modelshare_proto::v1 as pb;
use tonic::Code;

use super::{assert_refused, write_good};
use crate::common::{Server, count, load, stats};

/// A model name outside `segment[/segment]` (each `[A-Za-z0-9][A-Za-z0-9._-]*`, no route
/// word) would be accepted (and reach metrics labels and routes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_model_name_is_refused() {
    let server = Server::start().await;
    write_good(&server.root.join("good"));
    assert_refused(
        &server,
        "Bad/Name/Three",
        "good",
        Code::InvalidArgument,
        &["model name 'Bad/Name/Three' has more than one '/'"],
    )
    .await;
    assert_refused(
        &server,
        "bad name",
        "good",
        Code::InvalidArgument,
        &["model name 'bad name' contains ' '"],
    )
    .await;
    assert_refused(
        &server,
        "org/ready",
        "good",
        Code::InvalidArgument,
        &["a word of the inference routes"],
    )
    .await;
    assert_refused(&server, "", "good", Code::InvalidArgument, &["is empty"]).await;
}

/// Unknown models and versions would be answered with something other than NOT_FOUND.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_model_or_version_is_not_found() {
    let server = Server::start().await;
    let mut admin = server.admin().await;

    let err = admin
        .describe_model(pb::DescribeModelRequest {
            name: "nope".into(),
            version: 0,
        })
        .await
        .expect_err("describe of an unknown model");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("model 'nope' not found"), "{err:?}");

    let err = admin
        .unload_model(pb::UnloadModelRequest {
            name: "nope".into(),
            version: 0,
            ..Default::default()
        })
        .await
        .expect_err("unload of an unknown model");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("model 'nope' not found"), "{err:?}");

    write_good(&server.root.join("known"));
    let v = load(&mut admin, "known", "known")
        .await
        .expect("load known");
    let before = stats(&mut admin).await;

    let err = admin
        .unload_model(pb::UnloadModelRequest {
            name: "known".into(),
            version: v.version + 6,
            ..Default::default()
        })
        .await
        .expect_err("unload of an unknown version");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let want = format!("version {} of model 'known' not found", v.version + 6);
    assert!(err.message().contains(&want), "{err:?}");

    let err = admin
        .describe_model(pb::DescribeModelRequest {
            name: "known".into(),
            version: v.version + 6,
        })
        .await
        .expect_err("describe of an unknown version");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains(&want), "{err:?}");

    // The known version was not touched by the refused unload.
    let after = stats(&mut admin).await;
    assert_eq!(after.arena_bytes, before.arena_bytes);
    assert_eq!(count(&after, pb::VersionState::Ready), 1);
    let d = admin
        .describe_model(pb::DescribeModelRequest {
            name: "known".into(),
            version: 0,
        })
        .await
        .expect("describe known")
        .into_inner();
    let m = d.model.expect("model");
    assert_eq!(m.latest_ready, v.version);
}

/// `AttachRequest` as the wire sees it, with `session_id` (a string, field 1) sent as raw
/// bytes, so that a test can send a string that is not UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawAttachRequest {
    #[prost(bytes = "vec", tag = "1")]
    session_id: Vec<u8>,
    #[prost(string, tag = "2")]
    model: String,
}

/// A request whose string field is not UTF-8 does not decode: that is the client's error,
/// INVALID_ARGUMENT, not INTERNAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_that_is_not_utf8_is_an_invalid_argument() {
    let server = Server::start().await;
    let channel = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("channel");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let codec =
        modelshare_proto::codec::StrictCodec::<RawAttachRequest, pb::AttachResponse>::default();
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_static("/modelshare.v1.WorkerService/Attach");
    let request = RawAttachRequest {
        session_id: vec![b's', 0xff, 0xfe],
        model: "m".into(),
    };
    let status = grpc
        .unary(tonic::Request::new(request), path, codec)
        .await
        .expect_err("not UTF-8");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("UTF-8"), "{}", status.message());
}
