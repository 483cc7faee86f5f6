//! Admin calls the tests make everywhere: loads, stats.

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use tonic::transport::Channel;

/// Runs a load to its end; the finished version or the error status.
pub async fn load(
    admin: &mut AdminServiceClient<Channel>,
    name: &str,
    path: &str,
) -> Result<pb::VersionInfo, tonic::Status> {
    let mut stream = admin
        .load_model(pb::LoadModelRequest {
            name: name.into(),
            path: path.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut started = false;
    while let Some(msg) = stream.message().await? {
        match msg.event {
            Some(pb::load_model_progress::Event::Started(_)) => started = true,
            Some(pb::load_model_progress::Event::Done(v)) => {
                assert!(started, "Done before Started");
                return Ok(v);
            }
            _ => {}
        }
    }
    panic!("load stream ended without Done");
}

/// Reads a load's progress stream to its `Done`: the finished version, or the error status.
pub async fn until_done(
    mut stream: tonic::Streaming<pb::LoadModelProgress>,
) -> Result<pb::VersionInfo, tonic::Status> {
    while let Some(msg) = stream.message().await? {
        if let Some(pb::load_model_progress::Event::Done(v)) = msg.event {
            return Ok(v);
        }
    }
    panic!("load stream ended without Done");
}

/// GetStats.
pub async fn stats(admin: &mut AdminServiceClient<Channel>) -> pb::GetStatsResponse {
    admin
        .get_stats(pb::GetStatsRequest {})
        .await
        .expect("GetStats")
        .into_inner()
}

/// Count of versions in `state` in a stats reply.
pub fn count(stats: &pb::GetStatsResponse, state: pb::VersionState) -> u32 {
    stats
        .versions_by_state
        .iter()
        .find(|c| c.state == state as i32)
        .map(|c| c.count)
        .unwrap_or(0)
}

/// Unloads every version of `name`; with `force`, at once, revoking the sessions that hold it.
pub async fn unload(admin: &mut AdminServiceClient<Channel>, name: &str, force: bool) {
    admin
        .unload_model(pb::UnloadModelRequest {
            name: name.into(),
            version: 0,
            force,
            drain_timeout_ms: 0,
        })
        .await
        .expect("unload");
}
