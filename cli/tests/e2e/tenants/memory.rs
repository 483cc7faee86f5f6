//! Whose memory a tenant's load may share: its own models', public ones' and those shared
//! with it; another tenant's private model's only when the operator opted in
//! (`--share-identical any`), since a load that shares ends sooner and would tell the tenant
//! that someone holds those bytes. Who is told of the sharing: the owner only.

use modelshare_proto::v1 as pb;
use safetensors::Dtype;

use super::{ADMIN, TA, TB, TC, TenantsFile, abc_tenants, admin_as, load_as, public};
use crate::common::{self, Server, t};

/// m1 and m2 (as `models` writes them) and a copy of each's bytes, `m1copy` and `m2copy`.
fn with_copies(root: &std::path::Path) {
    for (i, name) in ["m1", "m2"].iter().enumerate() {
        let tensors = [t("w", Dtype::F32, &[64, 64], i as u64 + 1)];
        common::write_safetensors(&root.join(name).join("model.safetensors"), &tensors);
        common::write_safetensors(
            &root.join(format!("{name}copy")).join("model.safetensors"),
            &tensors,
        );
    }
}

async fn start(tenants: &TenantsFile, extra: &[&str]) -> Server {
    let mut args = vec!["--tenants-file", tenants.path.to_str().expect("utf-8")];
    args.extend_from_slice(extra);
    Server::start_with(&args, with_copies).await
}

async fn describe(
    admin: &mut modelshare_proto::v1::admin_service_client::AdminServiceClient<super::Authed>,
    name: &str,
) -> pb::VersionInfo {
    admin
        .describe_model(pb::DescribeModelRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .expect("describe")
        .into_inner()
        .model
        .expect("model")
        .versions
        .remove(0)
}

/// Host memory (which no worker can write): tenant b's load of the bytes of a's private model
/// gets a copy; c's load of the bytes of a's public model shares its memory. c is told its
/// model shares memory (with a model it sees); a is not told that c privately holds its
/// bytes. Fails if sharing ignores visibility (b shares a private model's memory) or tells an
/// owner of another tenant's private load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_shares_memory_only_of_models_it_may_see() {
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = start(&tenants, &[]).await;
    let (mut a, mut b, mut c) = (
        admin_as(&server, Some(TA)).await,
        admin_as(&server, Some(TB)).await,
        admin_as(&server, Some(TC)).await,
    );
    let private = load_as(&mut a, "m1", "m1", "", None).await.expect("m1");
    assert!(!private.shares_memory);
    load_as(&mut a, "m2", "m2", "", public()).await.expect("m2");
    let pid = server.pid();
    let before = common::memfd_fds(pid);

    let bm = load_as(&mut b, "bm", "m1copy", "", None).await.expect("bm");
    assert!(!bm.shares_memory, "b may not see a's private m1: {bm:?}");
    assert_eq!(common::memfd_fds(pid), before + 1);

    let cm = load_as(&mut c, "cm", "m2copy", "", None).await.expect("cm");
    assert!(cm.shares_memory, "m2 is public: {cm:?}");
    assert!(cm.content_sha256.starts_with("sha256:"), "{cm:?}");
    assert_eq!(common::memfd_fds(pid), before + 1);

    // a is not told that c privately holds m2's bytes, nor given a digest it did not ask
    // for; c, which sees m2, is told its model shares memory.
    let owner_view = describe(&mut a, "m2").await;
    assert!(
        !owner_view.shares_memory && owner_view.content_sha256.is_empty(),
        "{owner_view:?}"
    );
    let reader_view = describe(&mut c, "m2").await;
    assert!(
        !reader_view.shares_memory && reader_view.content_sha256.is_empty(),
        "only the owner is told: {reader_view:?}"
    );
    assert!(describe(&mut c, "cm").await.shares_memory);
    // Each owner's quota counts the full size: c's usage includes the shared bytes.
    let usage = c
        .get_stats(pb::GetStatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert!(usage.arena_bytes >= cm.arena_bytes, "{usage:?}");
}

/// With `--share-identical any` (the operator's opt-in), b's load of the bytes of a's private
/// model shares its memory too (one memfd, one arena on the device in the admin's stats);
/// neither tenant is told of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_may_share_memory_across_every_tenant() {
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = start(&tenants, &["--share-identical", "any"]).await;
    let (mut a, mut b, mut root) = (
        admin_as(&server, Some(TA)).await,
        admin_as(&server, Some(TB)).await,
        admin_as(&server, Some(ADMIN)).await,
    );
    load_as(&mut a, "m1", "m1", "", None).await.expect("m1");
    let before = common::memfd_fds(server.pid());
    let bm = load_as(&mut b, "bm", "m1copy", "", None).await.expect("bm");
    assert_eq!(
        common::memfd_fds(server.pid()),
        before,
        "one memory for both"
    );
    assert!(!bm.shares_memory, "b sees no model of a's: not told {bm:?}");
    assert!(!describe(&mut a, "m1").await.shares_memory);
    let stats = root
        .get_stats(pb::GetStatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    let arenas: u32 = stats.devices.iter().map(|d| d.arenas).sum();
    assert_eq!(arenas, 1, "{stats:?}");
}
