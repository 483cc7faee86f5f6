//! Where a tenant may come from and load from: uid-bound tenants, model directories.

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use tonic::Code;

use super::{
    ADMIN, TA, TB, TenantsFile, abc_tenants, admin_as, bearer, code, h, load_as, models, public,
    session_ids, start,
};
use crate::common::{self, Server};

fn effective_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(str::to_owned))
        })
        .and_then(|u| u.parse().ok())
        .expect("uid from /proc/self/status")
}

/// A tenant bound to a uid: a real worker process running as that uid attaches; the same
/// token from another uid (a second real uid, and root) or over TCP is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uid_bound_tenants_are_refused_from_other_uids() {
    if effective_uid() != 0 {
        eprintln!(
            "SKIPPED uid_bound_tenants_are_refused_from_other_uids: needs root to run workers as other uids"
        );
        return;
    }
    const BOUND: &str = "ms_token_of_bound";
    const FREE: &str = "ms_token_of_free";
    let (allowed, other) = (42_420, 42_421);
    let tenants = TenantsFile::new(&format!(
        "[admin]\ntoken_hashes = [{}]\n[[tenants]]\nname = \"bound\"\ntoken_hashes = [{}]\nuids = [{allowed}]\n[[tenants]]\nname = \"free\"\ntoken_hashes = [{}]\n",
        h(ADMIN),
        h(BOUND),
        h(FREE)
    ));
    let server = start(
        &tenants,
        &["--unix-socket-mode", "0666", "--listen", "127.0.0.1:0"],
        &["m1"],
    )
    .await;
    // Let other uids reach the sockets in the server's directory.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(server.dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
    let mut root = admin_as(&server, Some(ADMIN)).await;
    load_as(&mut root, "m", "m1", "", public())
        .await
        .expect("load");

    let env_bound = [("MODELSHARE_TOKEN", BOUND)];
    let mut ok =
        common::Worker::try_start_as(&server.address, "m", "ok", &env_bound, Some(allowed))
            .expect("the bound uid attaches");
    assert_eq!(ok.report["verified"], true, "{}", ok.report);
    let sessions = session_ids(&server).await;
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].1, "bound");

    for uid in [Some(other), None] {
        let err = common::Worker::try_start_as(&server.address, "m", "intruder", &env_bound, uid)
            .err()
            .unwrap_or_else(|| panic!("uid {uid:?} must be refused"));
        assert!(err.contains("permission denied"), "{err}");
        let shown = uid.unwrap_or(0);
        assert!(err.contains(&format!("uid {shown}")), "{err}");
    }
    // The same second uid with a tenant that is not bound works: the refusal is the binding.
    let free = common::Worker::try_start_as(
        &server.address,
        "m",
        "free",
        &[("MODELSHARE_TOKEN", FREE)],
        Some(other),
    )
    .expect("an unbound tenant attaches from any uid");
    assert_eq!(free.report["verified"], true);

    // Over TCP the uid is unknown: a bound tenant is refused there.
    let tcp = server.tcp_address();
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{tcp}"))
        .expect("url")
        .connect()
        .await
        .expect("tcp connect");
    let mut over_tcp = AdminServiceClient::with_interceptor(ch, bearer(Some(BOUND)));
    let err = over_tcp
        .list_models(pb::ListModelsRequest {})
        .await
        .expect_err("refused over tcp");
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("Unix socket"), "{}", err.message());
    assert!(ok.running());
    drop((ok, free));
}

/// A tenant with a model directory loads only from under it: not by `..`, not by a path of
/// another tenant's directory, not through a symlink out of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_dir_confines_a_tenants_loads() {
    let tenants = TenantsFile::new(&abc_tenants("model_dir = \"team-a\""));
    let server = Server::start_with(
        &["--tenants-file", tenants.path.to_str().expect("utf-8")],
        |root| {
            models(&root.join("team-a"), &["mine"]);
            models(&root.join("team-b"), &["theirs"]);
            std::os::unix::fs::symlink(root.join("team-b/theirs"), root.join("team-a/sneaky"))
                .expect("symlink");
            std::os::unix::fs::symlink(root.join("team-a/mine"), root.join("a-link"))
                .expect("symlink");
            // a's secrets: a config and a broken weight file.
            std::fs::write(root.join("team-a/mine/config.json"), b"{\"secret\":1}")
                .expect("config");
            std::fs::create_dir_all(root.join("team-a/broken")).expect("dir");
            std::fs::write(
                root.join("team-a/broken/model.safetensors"),
                b"\x05\0\0\0\0\0\0\0{bad}",
            )
            .expect("broken");
            // b's model whose config.json is a link into a's directory.
            std::os::unix::fs::symlink(
                root.join("team-a/mine/config.json"),
                root.join("team-b/theirs/config.json"),
            )
            .expect("symlink");
            std::fs::write(root.join("team-b/theirs/tokenizer.json"), b"{}").expect("own file");
        },
    )
    .await;
    let mut a = admin_as(&server, Some(TA)).await;
    let v = load_as(&mut a, "mine", "mine", "", None)
        .await
        .expect("own dir");
    assert_eq!(v.source, "team-a/mine");
    for (path, want) in [
        ("../team-b/theirs", Code::InvalidArgument),
        ("team-b/theirs", Code::NotFound),
        ("sneaky", Code::InvalidArgument),
    ] {
        let got = load_as(&mut a, "x", path, "", None).await;
        assert_eq!(code(got), want, "{path}");
    }
    // b has no model dir: paths are relative to the root, but a's directory is out of bounds,
    // directly or through a link, and looks like a missing path.
    let mut b = admin_as(&server, Some(TB)).await;
    load_as(&mut b, "theirs", "team-b/theirs", "", None)
        .await
        .expect("b loads from the root");
    // Probing a's directory tells b nothing: an existing model, a file, a broken file and a
    // missing path all answer exactly as a missing path does.
    for path in [
        "team-a/mine",
        "a-link",
        "team-a/mine/model.safetensors",
        "team-a/broken",
        "team-a/broken/model.safetensors",
        "team-a/nothing-here",
    ] {
        let err = load_as(&mut b, "stolen", path, "", None)
            .await
            .expect_err("another tenant's directory");
        assert_eq!(err.code(), Code::NotFound, "{path}: {err:?}");
        let missing = format!("'{path}' does not exist");
        assert!(
            err.message().contains(&missing),
            "{path}: {}",
            err.message()
        );
    }
    // A metadata file linked into a's directory is not read: b's model loads without it.
    let mut admin = admin_as(&server, Some(ADMIN)).await;
    let d = admin
        .describe_model(pb::DescribeModelRequest {
            name: "theirs".into(),
            version: 0,
        })
        .await
        .expect("describe")
        .into_inner();
    let files: Vec<String> = d
        .manifest
        .expect("manifest")
        .files
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(
        files,
        ["tokenizer.json"],
        "a's config.json was served to b's workers"
    );
    // The admin may load from anywhere.
    let mut root = admin_as(&server, Some(ADMIN)).await;
    load_as(&mut root, "admin-copy", "team-a/mine", "", None)
        .await
        .expect("admin");
}
