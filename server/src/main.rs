//! `modelshare`: the server (`serve`, `demo`) and the admin client commands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use modelshare_server::cli::{self, ClientArgs, ClientCommand};
use modelshare_server::config::{Config, ServeArgs};
use modelshare_server::{demo, serve, telemetry};

/// modelshare: load model weights into memory once, share them with many worker processes.
#[derive(Debug, Parser)]
#[command(name = "modelshare", version, about)]
struct Cli {
    #[command(flatten)]
    client: ClientArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server.
    Serve(Box<ServeArgs>),
    /// Generate a small model and serve it, to try modelshare with no model at hand.
    Demo(demo::DemoArgs),
    /// Admin client commands against a running server.
    #[command(flatten)]
    Client(ClientCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: anyhow::Result<()> = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => {
                let config = Config::from_args(*args)?;
                telemetry::init(config.log_format);
                serve::run(config, shutdown_signal()).await?;
                Ok(())
            }
            Command::Demo(args) => demo::run(args, shutdown_signal()).await,
            Command::Client(c) => cli::run(cli.client, c, shutdown_signal()).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", modelshare_worker::report(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        _ => {
            // Without signal handlers, fall back to Ctrl-C only.
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
