//! Tokens and tenants on the HTTP doors, and the error shape of unknown routes.

use serde_json::json;

use super::{Answer, http, stack};
use crate::tenants::{self as tn, ADMIN, TA, TB, TenantsFile, abc_tenants};
use crate::worker_util::{Offer, try_serve};

/// The HTTP doors would let a caller in without a valid token, or show it another tenant's
/// private model.
#[tokio::test]
async fn with_tenants_the_http_doors_need_a_token_and_hide_what_a_caller_may_not_see() {
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = tn::start(&tenants, &["--http-listen", "127.0.0.1:0"], &["enc"]).await;
    let mut admin_a = tn::admin_as(&server, Some(TA)).await;
    tn::load_as(&mut admin_a, "enc", "enc", "", None)
        .await
        .expect("a loads its private enc");
    let _worker = try_serve(&server.address, Some(TA), "enc", Offer::default())
        .await
        .expect("a serves enc");
    let addr = server.http_address();
    let bearer = |t: &str| format!("Bearer {t}");

    assert_probes_open_and_the_rest_needs_a_token(&addr, &bearer("nope")).await;
    assert_no_body_is_read_before_the_token(&addr).await;
    // a sees and computes on its model; b sees nothing of it.
    let (ta, tb, admin) = (bearer(TA), bearer(TB), bearer(ADMIN));
    assert_a_sees_and_computes_b_sees_nothing(&addr, &ta, &tb, &admin).await;
}

/// A caller without a token is answered at once, without its body being waited for: a POST
/// that announces 60 MB and sends none of it gets its 401 (the repository index read whole
/// bodies before admission once).
async fn assert_no_body_is_read_before_the_token(addr: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for path in [
        "/v2/repository/index",
        "/v1/embeddings",
        "/v2/models/enc/infer",
    ] {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 60000000\r\nContent-Type: application/json\r\n\r\n{{"
        );
        tcp.write_all(head.as_bytes()).await.expect("write");
        let mut buf = vec![0u8; 64];
        let n = tokio::time::timeout(std::time::Duration::from_secs(3), tcp.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer without the body"))
            .expect("read");
        let line = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(line.starts_with("HTTP/1.1 401"), "{path}: {line}");
    }
}

/// Probes are open; everything else needs a token (`wrong` is a wrong one).
async fn assert_probes_open_and_the_rest_needs_a_token(addr: &str, wrong: &str) {
    assert_eq!(
        http(addr, "GET", "/v2/health/live", &[], b"").await.status,
        200
    );
    assert_eq!(http(addr, "GET", "/readyz", &[], b"").await.status, 200);
    let r = http(addr, "GET", "/v1/models", &[], b"").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let r = http(
        addr,
        "GET",
        "/v2/models/enc",
        &[("authorization", wrong)],
        b"",
    )
    .await;
    assert_eq!(r.status, 401);
    assert!(r.json()["error"].is_string());
}

/// a (bearer `ta`) sees and computes on its model; b (`tb`) sees nothing of it; the admin
/// (`admin`) sees it.
async fn assert_a_sees_and_computes_b_sees_nothing(addr: &str, ta: &str, tb: &str, admin: &str) {
    let ids = |a: Answer| -> Vec<String> {
        a.json()["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|m| m["id"].as_str().expect("id").to_owned())
            .collect()
    };
    assert_eq!(
        ids(http(addr, "GET", "/v1/models", &[("authorization", ta)], b"").await),
        ["enc"]
    );
    assert_eq!(
        ids(http(addr, "GET", "/v1/models", &[("authorization", admin)], b"").await),
        ["enc"]
    );
    assert!(ids(http(addr, "GET", "/v1/models", &[("authorization", tb)], b"").await).is_empty());
    let body = json!({"model": "enc", "input": "abc"}).to_string();
    let json_type = ("content-type", "application/json");
    let r = http(
        addr,
        "POST",
        "/v1/embeddings",
        &[("authorization", ta), json_type],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    let r = http(
        addr,
        "POST",
        "/v1/embeddings",
        &[("authorization", tb), json_type],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let r = http(
        addr,
        "GET",
        "/v2/models/enc/ready",
        &[("authorization", tb)],
        b"",
    )
    .await;
    assert_eq!(r.status, 400, "b may not see enc: not ready for b");
    let r = http(
        addr,
        "GET",
        "/v2/models/enc/ready",
        &[("authorization", ta)],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
}

/// Unknown routes and methods answered with empty bodies (`/v1/audio/speech` 404,
/// `GET /v1/embeddings` 405): they answer in the door's error shape now.
#[tokio::test]
async fn unknown_routes_and_methods_answer_in_the_doors_error_shape() {
    let (server, _worker, _config) = stack().await;
    let addr = server.http_address();
    let r = http(&addr, "POST", "/v1/audio/speech", &[], b"{}").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert!(r.json()["error"]["code"].is_null(), "not a model not found");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("/v1/audio/speech")),
        "{:?}",
        r.json()
    );
    let r = http(&addr, "GET", "/v1/embeddings", &[], b"").await;
    assert_eq!(r.status, 405);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = http(&addr, "GET", "/v2/models/enc/infer", &[], b"").await;
    assert_eq!(r.status, 405);
    assert!(r.json()["error"].is_string());
    let r = http(&addr, "GET", "/v2/nothing/here", &[], b"").await;
    assert_eq!(r.status, 404);
    assert!(r.json()["error"].is_string());
}
