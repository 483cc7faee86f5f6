//! The model commands: `load` (with its progress bar), `unload`, `ls`, `describe` and
//! `access`.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use modelshare_worker::AuthChannel;

use super::error::{CliError, rpc};
use super::output::{self, OutputFormat};

/// The access of `--share-with` and `--public`; `None` when neither is given.
pub(super) fn access(share_with: Vec<String>, public: bool) -> Option<pb::ModelAccess> {
    let shared_with: Vec<String> = share_with
        .into_iter()
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .collect();
    (public || !shared_with.is_empty()).then_some(pb::ModelAccess {
        shared_with,
        public,
    })
}

/// `modelshare load`: follows the load's progress on a bar, prints the version once ready.
pub(super) async fn load(
    admin: &mut AdminServiceClient<AuthChannel>,
    req: pb::LoadModelRequest,
    out: OutputFormat,
) -> Result<(), CliError> {
    let name = req.name.clone();
    let mut stream = admin
        .load_model(req)
        .await
        .map_err(rpc("LoadModel"))?
        .into_inner();
    // Drawn on stderr, and only when it is a terminal.
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    while let Some(msg) = stream.message().await.map_err(rpc("LoadModel"))? {
        match msg.event {
            Some(pb::load_model_progress::Event::Started(s)) => {
                bar.set_length(s.bytes_total);
                bar.set_message(format!("{name} v{}", s.version));
            }
            Some(pb::load_model_progress::Event::Progress(p)) => {
                bar.set_length(p.bytes_total);
                bar.set_position(p.bytes_done);
            }
            Some(pb::load_model_progress::Event::Done(v)) => {
                bar.finish_and_clear();
                output::loaded(&name, &v, out);
                return Ok(());
            }
            None => {}
        }
    }
    bar.abandon();
    Err(CliError::Truncated)
}

/// `modelshare unload`: prints the versions affected.
pub(super) async fn unload(
    admin: &mut AdminServiceClient<AuthChannel>,
    req: pb::UnloadModelRequest,
    out: OutputFormat,
) -> anyhow::Result<()> {
    let r = admin
        .unload_model(req)
        .await
        .map_err(rpc("UnloadModel"))?
        .into_inner();
    output::versions(&r.versions, out);
    Ok(())
}

/// `modelshare ls`.
pub(super) async fn list(
    admin: &mut AdminServiceClient<AuthChannel>,
    out: OutputFormat,
) -> anyhow::Result<()> {
    let r = admin
        .list_models(pb::ListModelsRequest {})
        .await
        .map_err(rpc("ListModels"))?
        .into_inner();
    output::models(&r.models, out);
    Ok(())
}

/// `modelshare describe`.
pub(super) async fn describe(
    admin: &mut AdminServiceClient<AuthChannel>,
    req: pb::DescribeModelRequest,
    out: OutputFormat,
) -> anyhow::Result<()> {
    let r = admin
        .describe_model(req)
        .await
        .map_err(rpc("DescribeModel"))?
        .into_inner();
    output::describe(&r, out);
    Ok(())
}

/// `modelshare access`: prints the model with its new access.
pub(super) async fn set_access(
    admin: &mut AdminServiceClient<AuthChannel>,
    req: pb::SetModelAccessRequest,
    out: OutputFormat,
) -> anyhow::Result<()> {
    let r = admin
        .set_model_access(req)
        .await
        .map_err(rpc("SetModelAccess"))?
        .into_inner();
    let model = r
        .model
        .ok_or_else(|| anyhow::anyhow!("the server's SetModelAccess answer has no model"))?;
    output::access(&model, out);
    Ok(())
}
