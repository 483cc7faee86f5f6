//! `modelshare`: the server (`serve`, `demo`) and the admin client commands.

use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
mod commands;
mod demo;

use commands::{ClientArgs, ClientCommand};
use modelshare_server::config::{Config, ServeArgs};
use modelshare_server::{daemon, telemetry};

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

/// The client flags (those of [`ClientArgs`]) that mean nothing to `serve` and `demo`, and
/// what to use there instead.
const CLIENT_ONLY: [(&str, &str); 7] = [
    (
        "server",
        "the server listens where --unix-socket / --listen say",
    ),
    ("token", "the server's tokens are in --tenants-file"),
    ("token_file", "the server's tokens are in --tenants-file"),
    (
        "tls_ca",
        "the server's TLS is --server-tls-cert / --server-tls-key / --server-tls-client-ca",
    ),
    (
        "tls_cert",
        "the server's TLS is --server-tls-cert / --server-tls-key",
    ),
    (
        "tls_key",
        "the server's TLS is --server-tls-cert / --server-tls-key",
    ),
    (
        "tls_domain",
        "the server's TLS is --server-tls-cert / --server-tls-key",
    ),
];

/// The subcommand named on `args` (the first word that is neither a flag nor a flag's value).
fn subcommand_of(args: &[std::ffi::OsString]) -> Option<&str> {
    let mut words = args.iter().skip(1).filter_map(|a| a.to_str());
    while let Some(word) = words.next() {
        if let Some(flag) = word.strip_prefix('-') {
            // Every client flag takes a value; `--flag=value` and `-sVALUE` carry it along.
            if !flag.contains('=') && (flag.starts_with('-') || flag.len() == 1) {
                words.next();
            }
            continue;
        }
        return Some(word);
    }
    None
}

/// The command line. For `serve` and `demo`, the client flags every subcommand inherits are
/// hidden from the help (those commands refuse them; see [`refuse_client_flags`]).
fn command(args: &[std::ffi::OsString]) -> clap::Command {
    let cmd = Cli::command();
    if !matches!(subcommand_of(args), Some("serve" | "demo")) {
        return cmd;
    }
    cmd.mut_args(|a| {
        let client = a.get_id() == "output" || CLIENT_ONLY.iter().any(|(id, _)| a.get_id() == *id);
        a.hide(client)
    })
}

/// Refuses a client flag given on the command line of `serve` or `demo` (so that no one
/// believes TLS is on when it is not); the same variables in the environment are ignored.
fn refuse_client_flags(matches: &ArgMatches) -> Result<(), String> {
    let Some((sub @ ("serve" | "demo"), sub_matches)) = matches.subcommand() else {
        return Ok(());
    };
    for (id, instead) in CLIENT_ONLY {
        let given = [matches, sub_matches].iter().any(|m| {
            m.try_get_raw(id).ok().flatten().is_some()
                && m.value_source(id) == Some(ValueSource::CommandLine)
        });
        if given {
            let flag = id.replace('_', "-");
            return Err(format!(
                "--{flag} is a client flag; `modelshare {sub}` does not take it ({instead})"
            ));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // First of all, SIGHUP ignored: its default action ends the process, and a reload may be
    // sent to a server still starting; building the runtime takes milliseconds, in which a
    // SIGHUP was fatal. (One before `main`, in the dynamic loader's moments, still is: nothing
    // in the process can change that.)
    if let Err(e) = modelshare_device::ignore_hangup() {
        eprintln!("warning: cannot ignore SIGHUP while starting: {e}");
    }
    // Then the runtime and its SIGHUP handler, which replaces the disposition. Once installed,
    // the handler stays for the process (`serve` listens to it later; other commands ignore
    // it), and children the process starts get SIGHUP's default action back.
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
    let _hup = runtime
        .block_on(async { tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) });
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = command(&args).get_matches_from(&args);
    if let Err(e) = refuse_client_flags(&matches) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result: anyhow::Result<()> = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => {
                let config = Config::from_args(*args)?;
                telemetry::init(config.log_format);
                daemon::run(config, shutdown_signal()).await?;
                Ok(())
            }
            Command::Demo(args) => demo::run(args, shutdown_signal()).await,
            Command::Client(c) => commands::run(cli.client, c, shutdown_signal()).await,
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
