//! The commands that read the server's state: `ready` (its health), `stats` and `ps`.

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use modelshare_worker::AuthChannel;

use super::error::rpc;
use super::output::{self, OutputFormat, say};

/// `modelshare ready`: fails, saying why, unless the server is serving.
pub(super) async fn ready(channel: AuthChannel) -> anyhow::Result<()> {
    use tonic_health::pb::health_check_response::ServingStatus;
    let status = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map_err(rpc("Health.Check"))?
        .into_inner()
        .status();
    if status != ServingStatus::Serving {
        anyhow::bail!(
            "not ready: the server is {} (starting: its start-up models are still \
             loading; or shutting down)",
            status.as_str_name()
        );
    }
    say!("ready");
    Ok(())
}

/// `modelshare stats`.
pub(super) async fn stats(
    admin: &mut AdminServiceClient<AuthChannel>,
    out: OutputFormat,
) -> anyhow::Result<()> {
    let r = admin
        .get_stats(pb::GetStatsRequest {})
        .await
        .map_err(rpc("GetStats"))?
        .into_inner();
    output::stats(&r, out);
    Ok(())
}

/// `modelshare ps`.
pub(super) async fn sessions(
    admin: &mut AdminServiceClient<AuthChannel>,
    out: OutputFormat,
) -> anyhow::Result<()> {
    let r = admin
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .map_err(rpc("ListSessions"))?
        .into_inner();
    output::sessions(&r.sessions, out);
    Ok(())
}
