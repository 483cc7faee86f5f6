//! An example worker: attach to a model, verify every tensor against the checksum the server
//! computed while loading, and report what it sees. Keeps the lease for `--hold-secs`.
//! The token and TLS settings come from `MODELSHARE_TOKEN` or `MODELSHARE_TOKEN_FILE` and
//! `MODELSHARE_TLS_*` (see `ConnectOptions::from_env`).
//!
//! ```sh
//! cargo run -p modelshare-worker --example verify -- unix:/tmp/demo/grpc.sock tiny-demo
//! ```

use std::time::{Duration, Instant};

use modelshare_worker::{Session, WorkerError};

#[tokio::main]
async fn main() -> Result<(), WorkerError> {
    let mut args = std::env::args().skip(1);
    let (Some(server), Some(model)) = (args.next(), args.next()) else {
        eprintln!("usage: verify SERVER MODEL [HOLD_SECS]");
        std::process::exit(2);
    };
    let hold = args.next().and_then(|s| s.parse().ok()).unwrap_or(0);

    let session = Session::open(&server, "verify-example").await?;
    let started = Instant::now();
    let model = session.attach(&model).await?;
    let attach = started.elapsed();

    let mut bytes = 0;
    for tensor in model.tensors() {
        let ok = tensor.verify();
        bytes += tensor.bytes().len();
        println!(
            "{:<40} {:>6} {:>16} {}",
            tensor.name(),
            tensor.dtype().as_str_name().trim_start_matches("DTYPE_"),
            format!("{:?}", tensor.shape()),
            if ok { "ok" } else { "CHECKSUM MISMATCH" }
        );
        // Typed access, where the dtype has a Rust type.
        if let Ok(values) = tensor.as_slice::<f32>() {
            let mean = values.iter().sum::<f32>() / values.len().max(1) as f32;
            println!("{:<40} mean {mean:.5}", "");
        }
    }
    let bad = model.verify();
    println!(
        "{} v{}: {} tensors, {bytes} bytes, attached in {:.2} ms, {}",
        model.name(),
        model.version(),
        model.tensors().len(),
        attach.as_secs_f64() * 1e3,
        if bad.is_empty() {
            "all verified".to_string()
        } else {
            format!("{} MISMATCHED", bad.len())
        }
    );
    tokio::time::sleep(Duration::from_secs(hold)).await;
    model.release().await?;
    if !bad.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
