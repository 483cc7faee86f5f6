//! gRPC over TCP, health and reflection.

use modelshare_proto::v1 as pb;
use tokio_stream::StreamExt;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

use crate::common::Server;

/// The TCP address the server logged (it listens on port 0).
fn tcp_address(server: &Server) -> String {
    let log = server.log();
    let at = log
        .find("tcp=Some(")
        .unwrap_or_else(|| panic!("no tcp address in log:\n{log}"));
    let rest = &log[at + "tcp=Some(".len()..];
    let end = rest.find(')').expect("closing paren");
    format!("http://{}", &rest[..end])
}

/// Over TCP the admin API and reflection must work, so `grpcurl` needs no `.proto` files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_serves_admin_and_reflection() {
    let server = Server::start_with(
        &["--listen", "127.0.0.1:0", "--unauthenticated-tcp"],
        |_| {},
    )
    .await;
    let address = tcp_address(&server);
    let channel = modelshare_worker::connect::channel(&address)
        .await
        .expect("tcp connect");
    let mut admin =
        modelshare_proto::v1::admin_service_client::AdminServiceClient::new(channel.clone());
    let stats = admin
        .get_stats(pb::GetStatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(stats.device.expect("device").uuid, "host");

    let mut reflection = ServerReflectionClient::new(channel.clone());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = reflection
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .expect("reflection")
        .into_inner();
    let reply = replies.next().await.expect("a reply").expect("ok");
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("unexpected reflection reply {reply:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in [
        "modelshare.v1.AdminService",
        "modelshare.v1.WorkerService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }

    // The same through `v1alpha` (Python's grpcio-reflection, older grpcurl).
    use tonic_reflection::pb::v1alpha as alpha;
    let mut old = alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let req = alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut replies = old
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .expect("v1alpha reflection")
        .into_inner();
    let reply = replies.next().await.expect("a reply").expect("ok");
    let Some(alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("unexpected v1alpha reflection reply {reply:?}");
    };
    assert!(
        list.service
            .iter()
            .any(|s| s.name == "modelshare.v1.AdminService"),
        "{list:?}"
    );
}
