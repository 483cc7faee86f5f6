//! The admin client commands: clients of `AdminService`, printing tables or JSON.
//!
//! Every call carries the bearer token of `--token` / `--token-file` (or `MODELSHARE_TOKEN` /
//! `MODELSHARE_TOKEN_FILE`), over TLS for `https://` addresses (`--tls-*`). `token new` and
//! `token hash` need no server: they make what goes in the tenants file. `embed` and `infer`
//! call the OIP front door (`GRPCInferenceService.ModelInfer`).
//!
//! # Layout
//! - here: the client flags ([`ClientArgs`]), the commands ([`ClientCommand`]) and [`run`],
//!   which hands each to its module.
//! - `models`: `load`, `unload`, `ls`, `describe`, `access`.
//! - `status`: `ready`, `stats`, `ps`.
//! - `tenants`: `reload-tenants`, `token new`, `token hash`.
//! - `infer`: `embed`, `infer`; `probe`: `probe`.
//! - `output`: what each prints, as a table or JSON; `error`: [`CliError`].

mod error;
mod infer;
mod models;
pub(crate) mod output;
mod probe;
mod status;
mod tenants;

use std::path::PathBuf;

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use modelshare_worker::{AuthChannel, ConnectOptions, TlsOptions, TokenArg, WorkerError};

pub(crate) use output::say;
pub use output::{OutputFormat, human_bytes};
pub use probe::ProbeArgs;

pub use error::CliError;

/// Options common to every client command (listed under their own heading, and hidden from
/// `serve --help` and `demo --help`, which refuse them).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Client options")]
pub struct ClientArgs {
    /// Server address: `unix:/path/to/socket`, `http://host:port` or `https://host:port` (TLS).
    /// Default: the first server found at this user's socket ($TMPDIR/modelshare-<uid>.sock,
    /// where a server without tenants listens), the container socket
    /// (/run/modelshare/grpc.sock), then http://127.0.0.1:50051 (a server with tenants).
    #[arg(long, short = 's', env = "MODELSHARE_SERVER", global = true)]
    pub server: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "table", global = true)]
    pub output: OutputFormat,
    /// Bearer token sent with every call (prefer --token-file: arguments are visible to other
    /// users of the machine).
    #[arg(long, env = "MODELSHARE_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<TokenArg>,
    /// File holding the bearer token.
    #[arg(
        long,
        env = "MODELSHARE_TOKEN_FILE",
        value_name = "PATH",
        global = true
    )]
    pub token_file: Option<PathBuf>,
    /// CA certificates (PEM) to check an https:// server against (default: the web PKI roots).
    #[arg(long, env = "MODELSHARE_TLS_CA", value_name = "PATH", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; needs --tls-key.
    #[arg(long, env = "MODELSHARE_TLS_CERT", value_name = "PATH", global = true)]
    pub tls_cert: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS; needs --tls-cert.
    #[arg(long, env = "MODELSHARE_TLS_KEY", value_name = "PATH", global = true)]
    pub tls_key: Option<PathBuf>,
    /// Name to check the server's certificate against (default: the address's host).
    #[arg(
        long,
        env = "MODELSHARE_TLS_DOMAIN",
        value_name = "NAME",
        global = true
    )]
    pub tls_domain: Option<String>,
}

impl ClientArgs {
    /// The address to call, by the SDK's one rule ([`modelshare_worker::discover()`]):
    /// `--server` (or `MODELSHARE_SERVER`), else the first place a server is found listening by
    /// default; no server found is an error naming every place looked at.
    pub fn server(&self) -> Result<String, WorkerError> {
        Ok(modelshare_worker::discover(self.server.as_deref())?.address)
    }

    /// The token and TLS settings of these flags. TLS settings are present when any `--tls-*`
    /// flag is given (the address must then be `https://`).
    pub fn connect_options(&self) -> Result<ConnectOptions, WorkerError> {
        let mut options = ConnectOptions::default()
            .with_token_flags(self.token.as_ref(), self.token_file.clone())?;
        if self.tls_ca.is_some()
            || self.tls_cert.is_some()
            || self.tls_key.is_some()
            || self.tls_domain.is_some()
        {
            options = options.with_tls(TlsOptions::from_files(
                self.tls_ca.as_deref(),
                self.tls_cert.as_deref(),
                self.tls_key.as_deref(),
                self.tls_domain.clone(),
            )?);
        }
        Ok(options)
    }
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
        /// Tenant that will own the model (only an admin may name another tenant; default:
        /// the caller's).
        #[arg(long)]
        tenant: Option<String>,
        /// Tenants that may also see and attach the model (replaces the model's access).
        #[arg(long, value_delimiter = ',', value_name = "TENANT,...")]
        share_with: Vec<String>,
        /// Every tenant may see and attach the model (replaces the model's access).
        #[arg(long)]
        public: bool,
        /// Devices to load it on, by UUID or by index in `stats`, or `all` (default: the
        /// least-used device with room). Loaded from the files onto the first, copied device to
        /// device to the others.
        #[arg(long, value_delimiter = ',', value_name = "DEVICE,...")]
        devices: Vec<String>,
        /// Replicas on the least-used devices, when no device is named (default 1).
        #[arg(long)]
        replicas: Option<u32>,
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
    /// Exit 0 when the server is serving (started, its start-up models loaded, not shutting
    /// down), else 1 saying why: for container health checks and readiness probes.
    Ready,
    /// List worker sessions, their leases, and the models they serve with what they hold.
    Ps,
    /// Embed texts with a model (KServe v2 ModelInfer, one BYTES input): prints each text's
    /// embedding. Each argument is one text: quote a text of several words
    /// (`modelshare embed --model minilm "hello world" "good morning"` embeds two texts).
    Embed {
        /// Model name.
        #[arg(long)]
        model: String,
        /// The texts, one per argument (quote a text with spaces).
        #[arg(value_name = "TEXT")]
        texts: Vec<String>,
    },
    /// Send tensors to a model (KServe v2 ModelInfer) and print its outputs.
    Infer {
        /// Model name.
        #[arg(long)]
        model: String,
        /// An input, as NAME:DATATYPE:SHAPE=VALUES, e.g. x:FP32:2x3=1,2,3,4,5,6 (repeatable).
        #[arg(long = "input", required = true)]
        inputs: Vec<infer::InputArg>,
    },
    /// Attach to a model like a worker, verify every tensor's checksum, report the mapping.
    Probe(ProbeArgs),
    /// Set who besides its owner may see and attach a model (no flags: private to the owner).
    Access {
        /// Model name.
        name: String,
        /// Tenants that may see and attach the model.
        #[arg(long, value_delimiter = ',', value_name = "TENANT,...")]
        share_with: Vec<String>,
        /// Every tenant may see and attach the model.
        #[arg(long)]
        public: bool,
    },
    /// Make the server read its tenants file again; prints the tenants now in force.
    ReloadTenants,
    /// Make tokens and their hashes for the tenants file (no server needed).
    #[command(subcommand)]
    Token(TokenCommand),
}

/// `modelshare token ...`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum TokenCommand {
    /// Print a new random token and its hash: the hash goes in the tenants file, the token to
    /// the tenant.
    New,
    /// Read a token on stdin (its first line) and print its hash.
    Hash,
}

/// A client of the admin service at `--server`, with the token and TLS of the flags.
async fn admin_client(args: &ClientArgs) -> Result<AdminServiceClient<AuthChannel>, CliError> {
    let channel =
        modelshare_worker::connect::authed(&args.server()?, &args.connect_options()?).await?;
    Ok(AdminServiceClient::new(channel).max_decoding_message_size(128 << 20))
}

/// A channel to `--server`, with the token and TLS of the flags.
async fn channel(args: &ClientArgs) -> Result<AuthChannel, WorkerError> {
    modelshare_worker::connect::authed(&args.server()?, &args.connect_options()?).await
}

/// Runs one client command; `shutdown` ends a holding probe.
pub async fn run(
    args: ClientArgs,
    command: ClientCommand,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let out = args.output;
    match command {
        ClientCommand::Load {
            name,
            path,
            keep_previous,
            tenant,
            share_with,
            public,
            devices,
            replicas,
        } => {
            let req = pb::LoadModelRequest {
                name,
                path,
                keep_previous,
                tenant: tenant.unwrap_or_default(),
                access: models::access(share_with, public),
                devices,
                replicas: replicas.unwrap_or(0),
            };
            models::load(&mut admin_client(&args).await?, req, out).await?
        }
        ClientCommand::Unload {
            name,
            version,
            force,
            drain_timeout_ms,
        } => {
            let req = pb::UnloadModelRequest {
                name,
                version: version.unwrap_or(0),
                force,
                drain_timeout_ms: drain_timeout_ms.unwrap_or(0),
            };
            models::unload(&mut admin_client(&args).await?, req, out).await?
        }
        ClientCommand::Ls => models::list(&mut admin_client(&args).await?, out).await?,
        ClientCommand::Describe { name, version } => {
            let req = pb::DescribeModelRequest {
                name,
                version: version.unwrap_or(0),
            };
            models::describe(&mut admin_client(&args).await?, req, out).await?
        }
        ClientCommand::Ready => status::ready(channel(&args).await?).await?,
        ClientCommand::Stats => status::stats(&mut admin_client(&args).await?, out).await?,
        ClientCommand::Ps => status::sessions(&mut admin_client(&args).await?, out).await?,
        ClientCommand::Embed { model, texts } => {
            infer::embed(channel(&args).await?, model, texts, out).await?
        }
        ClientCommand::Infer { model, inputs } => {
            infer::infer(channel(&args).await?, model, inputs, out).await?
        }
        ClientCommand::Probe(probe) => {
            let options = args.connect_options()?;
            probe::run(&args.server()?, options, probe, out, shutdown).await?
        }
        ClientCommand::Access {
            name,
            share_with,
            public,
        } => {
            let req = pb::SetModelAccessRequest {
                name,
                access: Some(models::access(share_with, public).unwrap_or_default()),
            };
            models::set_access(&mut admin_client(&args).await?, req, out).await?
        }
        ClientCommand::ReloadTenants => {
            tenants::reload(&mut admin_client(&args).await?, out).await?
        }
        ClientCommand::Token(TokenCommand::New) => tenants::new_token(out)?,
        ClientCommand::Token(TokenCommand::Hash) => tenants::hash_token(out)?,
    }
    Ok(())
}
