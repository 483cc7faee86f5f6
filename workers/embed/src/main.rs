//! `modelshare-embed`: serves sentence embeddings of a BERT-family model held by a
//! modelshare server, computed from the server's one copy of the weights: on the GPU when the
//! server keeps them in device memory, on the CPU when it keeps them in host memory. Clients
//! call the server's front doors (OpenAI `POST /v1/embeddings`, KServe v2 / OIP with a BYTES
//! input `text` and an FP32 output `embedding`).
//!
//! # Layout
//! - `main` (here): the command line ([`Args`]), logging.
//! - [`process`]: the process's life: serving until a signal, or until the compute thread
//!   fails it after a panic its encoder cannot survive; the exit status.
//! - [`worker`]: per attached version, the spec, tokenizer, weights, backend and offer.
//! - [`spec`]: what to run, from the model's own files (`config.json`, the
//!   sentence-transformers files), refusing what it cannot run with the field named.
//! - [`tokenize`]: texts to ids with the model's `tokenizer.json`.
//! - [`weights`]: the encoder's tensors by name, checked against the spec.
//! - [`handler`]: a batch's items to sequences, to vectors, to answers.
//! - [`compute`]: the compute thread: groups sequences by length and runs the [`encoder`],
//!   catching its panics; joined when the handler is dropped.
//! - [`cpu`], [`cuda`]: the two backends of [`encoder::Encoder`].
//!
//! The server is `--server` (or `MODELSHARE_SERVER`), else the one the SDK's rule finds
//! (`modelshare_worker::discover`: this user's socket, the container socket, then
//! `127.0.0.1:50051`), as for the CLI. The token is `--token` or `--token-file`, else
//! `MODELSHARE_TOKEN` or `MODELSHARE_TOKEN_FILE`; TLS settings come from `MODELSHARE_TLS_*`.
//! A refusal that will not heal (a wrong token, an unknown model) ends the process with an
//! error naming it; a server away or restarting is waited for.
#![forbid(unsafe_code)]

mod compute;
mod cpu;
mod cuda;
mod encoder;
mod handler;
mod process;
mod spec;
mod tokenize;
mod weights;
mod worker;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use modelshare_worker::serve::Target;
use modelshare_worker::{ConnectOptions, TokenArg};
use tracing_subscriber::EnvFilter;

use crate::process::Stop;
use crate::spec::{Overrides, Pooling, parse_pooling};

/// Serve sentence embeddings of a BERT-family model held by a modelshare server.
#[derive(Debug, Parser)]
#[command(name = "modelshare-embed", version, about)]
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
    #[arg(long, default_value = "embed-worker")]
    name: String,
    /// Batches taken at once (tokenizing some while others compute). Default: on CUDA, for a
    /// model of at most 256 MiB of weights, two per compute slot and one more (17); else one
    /// more than --compute-slots.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    credits: Option<u32>,
    /// Compute threads, each with an encoder of its own (on CUDA: its own stream, activation
    /// buffers and cuBLAS handle, so that several batches are on the GPU at once, as several
    /// workers under MPS would be, in one process). Each slot's buffers take GPU memory (see
    /// --max-batch-tokens); on the CPU, each slot widens its own f32 copy of f16/bf16 weights.
    /// Default: on CUDA, 8 for a model of at most 256 MiB of weights (a small model's batches
    /// are short on the GPU: many small ones in flight keep it busy), else 2 (BERT-large +2 to
    /// +4% over one, at 670 MiB); on the CPU, 1.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=16))]
    compute_slots: Option<u32>,
    /// Most items (inputs) in one batch. Default: on CUDA, 128 for a model of at most 256 MiB
    /// of weights (small batches, many in flight: MiniLM on an H200 129,836 sentences/s
    /// against 90,027 with batches of up to 1024 and 4 slots), else 1024.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    max_batch_items: Option<u32>,
    /// Most input bytes in one batch.
    #[arg(long, default_value_t = 16 << 20)]
    max_batch_bytes: u64,
    /// Most tokens in one forward pass (with the fused attention the sum of the sequences'
    /// lengths, else sequences × their longest); sizes the GPU's activation buffers, per
    /// compute slot (in f16 about 14 × hidden bytes per token, the feed-forward's sharing the
    /// attention's: 480 MiB for BERT-large at 32768). Default: on CUDA, 16384 for a model of at
    /// most 256 MiB of weights (its batches are small), else 32768.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 22))]
    max_batch_tokens: Option<u64>,
    /// Longest input in tokens, special tokens included (default: the model's
    /// max_seq_length); longer inputs are truncated.
    #[arg(long)]
    max_seq_len: Option<usize>,
    /// Pooling: mean, cls, max or mean_sqrt_len (default: the model's Pooling module, else mean).
    #[arg(long, value_parser = pooling)]
    pooling: Option<Pooling>,
    /// L2-normalize the vectors: true or false (default: whether the model has a Normalize module).
    #[arg(long)]
    normalize: Option<bool>,
    /// Threads for the CPU backend (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Bearer token sent with every call (else MODELSHARE_TOKEN; prefer --token-file:
    /// arguments are visible to other users of the machine).
    #[arg(long)]
    token: Option<TokenArg>,
    /// File holding the bearer token, read again at every connection (else
    /// MODELSHARE_TOKEN_FILE).
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Log, when serving a version ends, where the time went: each compute thread's busy and
    /// idle time and its jobs' wait for it, a batch's tokenization, compute and answer time,
    /// and (CUDA) each stage's GPU time, from events between the stages (which cost a little:
    /// for breakdowns, not for serving).
    #[arg(long)]
    profile_stages: bool,
    /// On CUDA, replay each batch's forward pass as a CUDA graph, captured once per launch
    /// shape (tokens bucketed to within ~3%): one launch instead of ~50, so that the compute
    /// threads and the driver keep up with a small model's GPU; a shape is captured the second
    /// time it comes. `false` launches every kernel (the same values up to rounding; for
    /// comparison, or if capture misbehaves). Stage timing (--profile-stages) launches every
    /// kernel.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    cuda_graphs: bool,
}

fn pooling(s: &str) -> Result<Pooling, String> {
    parse_pooling(s).ok_or_else(|| format!("'{s}' is not one of mean, cls, max, mean_sqrt_len"))
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
    // The rayon pool (the CPU backend's products, big batches' tokenization), named so that
    // its threads' CPU shows apart from the runtime's; 0 threads is one per core.
    let n = args.threads.unwrap_or(0);
    if let Err(e) = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("embed-pool-{i}"))
        .build_global()
    {
        eprintln!("error: cannot start the rayon pool: {e}");
        return ExitCode::FAILURE;
    }
    let stop = Stop::default();
    let config = worker::Config {
        credits: args.credits,
        compute_slots: args.compute_slots.map(|n| n as usize),
        max_batch_items: args.max_batch_items,
        max_batch_bytes: args.max_batch_bytes,
        max_batch_tokens: args.max_batch_tokens.map(|n| n as usize),
        overrides: Overrides {
            pooling: args.pooling,
            normalize: args.normalize,
            max_seq_len: args.max_seq_len,
        },
        stop: stop.clone(),
        profile: args.profile_stages,
        cuda_graphs: args.cuda_graphs,
    };
    process::run(
        || {
            let connect = ConnectOptions::from_env_and_flags(args.token.as_ref(), args.token_file)?;
            let server = modelshare_worker::discover(args.server.as_deref())?;
            tracing::info!(%server, "connecting");
            Ok(Target {
                server: server.address,
                model: args.model,
                worker_name: args.name,
                connect,
            })
        },
        &stop,
        |model| worker::setup(model, &config),
    )
}
