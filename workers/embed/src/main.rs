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
//! Token and TLS settings come from the environment (`MODELSHARE_TOKEN`,
//! `MODELSHARE_TOKEN_FILE`, `MODELSHARE_TLS_*`), as for every SDK worker.
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
use std::process::ExitCode;

use clap::Parser;
use modelshare_worker::ConnectOptions;
use modelshare_worker::serve::Target;
use tracing_subscriber::EnvFilter;

use crate::process::Stop;
use crate::spec::{Overrides, Pooling, parse_pooling};

/// Serve sentence embeddings of a BERT-family model held by a modelshare server.
#[derive(Debug, Parser)]
#[command(name = "modelshare-embed", version, about)]
struct Args {
    /// Server address: unix:/path, http://host:port or https://host:port.
    #[arg(
        long,
        env = "MODELSHARE_SERVER",
        default_value = "unix:/run/modelshare/grpc.sock"
    )]
    server: String,
    /// The model to serve (its latest ready version).
    #[arg(long)]
    model: String,
    /// Worker name shown by `modelshare ps`.
    #[arg(long, default_value = "embed-worker")]
    name: String,
    /// Batches taken at once (tokenizing one while computing another).
    #[arg(long, default_value_t = 2)]
    credits: u32,
    /// Most items (inputs) in one batch.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    max_batch_items: u32,
    /// Most input bytes in one batch.
    #[arg(long, default_value_t = 16 << 20)]
    max_batch_bytes: u64,
    /// Most tokens (sequences × their longest length) in one forward pass; sizes the GPU's
    /// activation buffers (in f16 about (14 × hidden + 2 × intermediate) bytes per token,
    /// plus 64 MiB of attention scores: ~0.5 GiB for BERT-large at 16384).
    #[arg(long, default_value_t = 16384, value_parser = clap::value_parser!(u64).range(1..=1 << 22))]
    max_batch_tokens: u64,
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
    if let Some(n) = args.threads
        && let Err(e) = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
    {
        eprintln!("error: cannot start {n} compute threads: {e}");
        return ExitCode::FAILURE;
    }
    let stop = Stop::default();
    let config = worker::Config {
        credits: args.credits,
        max_batch_items: args.max_batch_items,
        max_batch_bytes: args.max_batch_bytes,
        max_batch_tokens: args.max_batch_tokens as usize,
        overrides: Overrides {
            pooling: args.pooling,
            normalize: args.normalize,
            max_seq_len: args.max_seq_len,
        },
        stop: stop.clone(),
    };
    process::run(
        || {
            Ok(Target {
                server: args.server,
                model: args.model,
                worker_name: args.name,
                connect: ConnectOptions::from_env()?,
            })
        },
        &stop,
        |model| worker::setup(model, &config),
    )
}
