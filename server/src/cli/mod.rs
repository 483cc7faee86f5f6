//! The admin client commands: clients of `AdminService`, printing tables or JSON.

pub(crate) mod output;
mod probe;

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use tonic::transport::Channel;

pub(crate) use output::say;
pub use output::{OutputFormat, human_bytes};
pub use probe::ProbeArgs;

/// Options common to every client command.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Server address: `unix:/path/to/socket` or `http://host:port`.
    #[arg(
        long,
        short = 's',
        env = "MODELSHARE_SERVER",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    pub server: String,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "table", global = true)]
    pub output: OutputFormat,
}

/// The admin client commands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ClientCommand {
    /// Load a model (a new version when the name exists) and wait until it is ready.
    Load {
        /// Model name.
        name: String,
        /// Path under the server's model root.
        path: String,
        /// Keep older versions attachable (default: retire them once this one is ready).
        #[arg(long)]
        keep_previous: bool,
    },
    /// Unload a model (every version, or one).
    Unload {
        /// Model name.
        name: String,
        /// Only this version.
        #[arg(long)]
        version: Option<u32>,
        /// End the sessions still holding it now instead of draining.
        #[arg(long)]
        force: bool,
        /// Drain for at most this many milliseconds, then force.
        #[arg(long, value_name = "MS")]
        drain_timeout_ms: Option<u32>,
    },
    /// List models and their versions.
    Ls,
    /// Show a model's versions and tensors.
    Describe {
        /// Model name.
        name: String,
        /// Version (default: latest ready).
        #[arg(long)]
        version: Option<u32>,
    },
    /// Show memory use and models by state.
    Stats,
    /// List worker sessions and their leases.
    Ps,
    /// Attach to a model like a worker, verify every tensor's checksum, report the mapping.
    Probe(ProbeArgs),
}

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// No connection.
    #[error(transparent)]
    Connect(#[from] modelshare_worker::WorkerError),
    /// The server refused the call.
    #[error("{}: {} ({:?})", .call, .status.message(), .status.code())]
    Rpc {
        /// The call.
        call: &'static str,
        /// The status.
        status: tonic::Status,
    },
    /// The load stream ended without its final message.
    #[error("the server ended the load without a result")]
    Truncated,
}

fn rpc(call: &'static str) -> impl FnOnce(tonic::Status) -> CliError {
    move |status| CliError::Rpc { call, status }
}

async fn admin_client(server: &str) -> Result<AdminServiceClient<Channel>, CliError> {
    let channel = modelshare_worker::connect::channel(server).await?;
    Ok(AdminServiceClient::new(channel).max_decoding_message_size(128 << 20))
}

/// Runs one client command; `shutdown` ends a holding probe.
pub async fn run(
    args: ClientArgs,
    command: ClientCommand,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let out = args.output;
    let admin = || admin_client(&args.server);
    match command {
        ClientCommand::Load {
            name,
            path,
            keep_previous,
        } => {
            let req = pb::LoadModelRequest {
                name,
                path,
                keep_previous,
                ..Default::default()
            };
            load(&mut admin().await?, req, out).await?
        }
        ClientCommand::Unload {
            name,
            version,
            force,
            drain_timeout_ms,
        } => {
            let r = admin()
                .await?
                .unload_model(pb::UnloadModelRequest {
                    name,
                    version: version.unwrap_or(0),
                    force,
                    drain_timeout_ms: drain_timeout_ms.unwrap_or(0),
                })
                .await
                .map_err(rpc("UnloadModel"))?
                .into_inner();
            output::versions(&r.versions, out);
        }
        ClientCommand::Ls => {
            let r = admin()
                .await?
                .list_models(pb::ListModelsRequest {})
                .await
                .map_err(rpc("ListModels"))?
                .into_inner();
            output::models(&r.models, out);
        }
        ClientCommand::Describe { name, version } => {
            let r = admin()
                .await?
                .describe_model(pb::DescribeModelRequest {
                    name,
                    version: version.unwrap_or(0),
                })
                .await
                .map_err(rpc("DescribeModel"))?
                .into_inner();
            output::describe(&r, out);
        }
        ClientCommand::Stats => {
            let r = admin()
                .await?
                .get_stats(pb::GetStatsRequest {})
                .await
                .map_err(rpc("GetStats"))?
                .into_inner();
            output::stats(&r, out);
        }
        ClientCommand::Ps => {
            let r = admin()
                .await?
                .list_sessions(pb::ListSessionsRequest {})
                .await
                .map_err(rpc("ListSessions"))?
                .into_inner();
            output::sessions(&r.sessions, out);
        }
        ClientCommand::Probe(probe) => probe::run(&args.server, probe, out, shutdown).await?,
    }
    Ok(())
}

async fn load(
    admin: &mut AdminServiceClient<Channel>,
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
