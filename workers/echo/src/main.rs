//! `modelshare-echo-worker`: serves one model of a modelshare server with a simple, exactly
//! specified computation over its shared weights, for tests of the request path (the
//! OpenAI and KServe v2 front doors, batching, cancels, drains) without a real model.
//!
//! # Layout
//! - `main` (here): the command line ([`Args`]), logging, and the signals (SIGTERM or SIGINT
//!   drain the stream and exit 0; a second one exits at once).
//! - [`worker`]: the handler over the attached weights and the attach / serve loop, which
//!   after a server drain serves the latest version again.
//! - [`echo`]: the computation itself (see its docs for the exact rules), tested on fixed
//!   inputs with no server.
//! - [`generate`]: its text generation, for a streaming worker (`--streams`), likewise.
//!
//! The server is `--server` (or `MODELSHARE_SERVER`), else the one the SDK's rule finds
//! (`modelshare_worker::discover`: this user's socket, the container socket, then
//! `127.0.0.1:50051`), as for the CLI. The token is `--token` or `--token-file`, else
//! `MODELSHARE_TOKEN` or `MODELSHARE_TOKEN_FILE`; TLS settings come from `MODELSHARE_TLS_*`.
//! A refusal that will not heal (a wrong token, an unknown model) ends the process with an
//! error naming it; a server away or restarting is waited for.
#![forbid(unsafe_code)]

mod echo;
mod generate;
mod worker;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use modelshare_worker::TokenArg;
use modelshare_worker::serve::run_process;
use tracing_subscriber::EnvFilter;

/// Serve a model of a modelshare server with the echo computation.
#[derive(Debug, Parser)]
#[command(name = "modelshare-echo-worker", version, about)]
struct Args {
    /// Server address: unix:/path, http://host:port or https://host:port (else
    /// MODELSHARE_SERVER). Default: the first server found at this user's socket
    /// ($TMPDIR/modelshare-<uid>.sock), the container socket (/run/modelshare/grpc.sock), then
    /// http://127.0.0.1:50051.
    #[arg(long)]
    server: Option<String>,
    /// The model to serve (its latest ready version).
    #[arg(long)]
    model: String,
    /// Worker name shown by `modelshare ps`.
    #[arg(long, default_value = "echo-worker")]
    name: String,
    /// Batches taken at once.
    #[arg(long, default_value_t = 2)]
    credits: u32,
    /// Most items in one batch.
    #[arg(long, default_value_t = 32)]
    max_batch_items: u32,
    /// Serve as a streaming worker answering this many items at once (generation requests
    /// stream their tokens; other items are answered whole); 0: a batch worker.
    #[arg(long, default_value_t = 0)]
    streams: u32,
    /// Most input bytes in one batch.
    #[arg(long, default_value_t = 4 << 20)]
    max_batch_bytes: u64,
    /// Bearer token sent with every call (else MODELSHARE_TOKEN; prefer --token-file:
    /// arguments are visible to other users of the machine).
    #[arg(long)]
    token: Option<TokenArg>,
    /// File holding the bearer token, read again at every connection (else
    /// MODELSHARE_TOKEN_FILE).
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let config = worker::Config {
        server: args.server,
        model: args.model,
        name: args.name,
        credits: args.credits,
        max_batch_items: args.max_batch_items,
        max_batch_bytes: args.max_batch_bytes,
        streams: args.streams,
        token: args.token,
        token_file: args.token_file,
    };
    run_process(
        || worker::target(&config),
        |model| Ok((worker::serve_options(&config), worker::Echo::new(model))),
    )
}
