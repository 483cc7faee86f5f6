//! `modelshare demo`: writes a small transformer-shaped model (safetensors + config.json),
//! serves it on the host backend, and prints where the server listens and what it loaded.

use std::future::Future;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;

use crate::commands::say;
use modelshare_server::config::{BackendChoice, Config, ServeArgs, StartupModel};
use modelshare_server::{daemon, telemetry};

/// Name the demo model is served under.
pub const DEMO_MODEL: &str = "tiny-demo";

/// Flags of `modelshare demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Directory for the generated model and the sockets (default: a fresh temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Also serve gRPC on this TCP address, without authentication (the demo has no tenants;
    /// by default it serves on a Unix socket in its directory only).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Worker processes to start against the model.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Stop right after printing the summary (for scripted checks).
    #[arg(long)]
    pub exit_after_ready: bool,
}

/// One tensor to write: name, safetensors dtype, shape, little-endian bytes.
pub type RawTensor = (String, &'static str, Vec<u64>, Vec<u8>);

/// Writes a safetensors file with `tensors` in the given order.
pub fn write_safetensors(path: &Path, tensors: &[RawTensor]) -> io::Result<()> {
    let mut header = serde_json::Map::new();
    header.insert(
        "__metadata__".into(),
        serde_json::json!({"format": "pt", "producer": "modelshare demo"}),
    );
    let mut offset = 0u64;
    for (name, dtype, shape, bytes) in tensors {
        let end = offset + bytes.len() as u64;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut json = serde_json::Value::Object(header).to_string().into_bytes();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut f = io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(&(json.len() as u64).to_le_bytes())?;
    f.write_all(&json)?;
    for (_, _, _, bytes) in tensors {
        f.write_all(bytes)?;
    }
    f.flush()
}

/// Deterministic pseudo-random numbers in [-1, 1) (xorshift64*).
fn noise(seed: u64, n: usize) -> impl Iterator<Item = f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n).map(move |_| {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        let x = s.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((x >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    })
}

fn f32_bytes(seed: u64, n: usize) -> Vec<u8> {
    noise(seed, n).flat_map(f32::to_le_bytes).collect()
}

/// f32 → IEEE half, round to nearest (good enough for demo weights in [-1, 1)).
fn f16_bytes(seed: u64, n: usize) -> Vec<u8> {
    noise(seed, n)
        .flat_map(|x| {
            let bits = x.to_bits();
            let sign = ((bits >> 16) & 0x8000) as u16;
            let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
            let mant = bits & 0x7f_ffff;
            let h = if exp <= 0 {
                sign
            } else {
                sign | ((exp as u16) << 10) | ((mant + 0x1000) >> 13) as u16
            };
            h.to_le_bytes()
        })
        .collect()
}

/// Writes the demo model into `dir/tiny-demo/` and returns that directory.
pub fn write_demo_model(dir: &Path) -> io::Result<PathBuf> {
    let (vocab, dim, layers) = (4096u64, 512u64, 4u64);
    let model_dir = dir.join(DEMO_MODEL);
    std::fs::create_dir_all(&model_dir)?;
    let mut tensors: Vec<RawTensor> = vec![(
        "embed.weight".into(),
        "F32",
        vec![vocab, dim],
        f32_bytes(1, (vocab * dim) as usize),
    )];
    for l in 0..layers {
        for (i, w) in ["wq", "wk", "wv", "wo"].iter().enumerate() {
            tensors.push((
                format!("layers.{l}.attn.{w}.weight"),
                "F16",
                vec![dim, dim],
                f16_bytes(10 + l * 8 + i as u64, (dim * dim) as usize),
            ));
        }
        tensors.push((
            format!("layers.{l}.norm.weight"),
            "F32",
            vec![dim],
            f32_bytes(100 + l, dim as usize),
        ));
    }
    tensors.push((
        "position_ids".into(),
        "I64",
        vec![1, 64],
        (0..64i64).flat_map(i64::to_le_bytes).collect(),
    ));
    write_safetensors(&model_dir.join("model.safetensors"), &tensors)?;
    std::fs::write(
        model_dir.join("config.json"),
        serde_json::json!({
            "model_type": "tiny-demo", "vocab_size": vocab, "hidden_size": dim,
            "num_hidden_layers": layers, "torch_dtype": "float16"
        })
        .to_string(),
    )?;
    Ok(model_dir)
}

/// Removes the demo's own temporary directory when the demo ends, however it ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the demo until `shutdown` resolves (or right after the summary with `--exit-after-ready`).
pub async fn run(
    args: DemoArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // The terminal is for the summary; RUST_LOG=info shows the server's log too.
    telemetry::init_with_default(telemetry::LogFormat::Text, "warn");
    let (dir, _cleanup) = match &args.dir {
        Some(d) => (d.clone(), None),
        None => {
            let d = std::env::temp_dir().join(format!("modelshare-demo-{}", std::process::id()));
            (d.clone(), Some(RemoveOnDrop(d)))
        }
    };
    std::fs::create_dir_all(&dir)?;
    write_demo_model(&dir)?;
    let socket = dir.join("grpc.sock");
    let config = Config::from_args(ServeArgs {
        listen: args.listen,
        unauthenticated_tcp: Some(args.listen.is_some()),
        unix_socket: Some(socket.clone()),
        model_root: Some(dir.clone()),
        backend: Some(BackendChoice::Host),
        models: vec![StartupModel {
            name: DEMO_MODEL.into(),
            path: DEMO_MODEL.into(),
            tenant: None,
            share_with: Vec::new(),
            public: false,
            devices: Vec::new(),
            replicas: 0,
        }],
        ..ServeArgs::default()
    })?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(daemon::run_notify(
        config,
        async move {
            let _ = stop_rx.await;
        },
        Some(ready_tx),
    ));
    let Ok(bound) = ready_rx.await else {
        // The server stopped before it was ready: its error says why.
        server.await??;
        anyhow::bail!("the demo server stopped before it was ready");
    };
    let address = format!("unix:{}", socket.display());
    match summarize(&address).await {
        Ok(text) => {
            say!("modelshare demo");
            if let Some(tcp) = bound.tcp {
                say!("  grpc (tcp):     http://{tcp}");
            }
            say!("  grpc (unix):    {address}");
            say!("  handle socket:  {}", bound.handles.display());
            say!("  model root:     {}", dir.display());
            say!("{}", text.trim_end());
        }
        Err(e) => {
            let _ = stop_tx.send(());
            server.await??;
            return Err(e);
        }
    }
    let workers = match start_workers(&address, args.workers).await {
        Ok(w) => w,
        Err(e) => {
            let _ = stop_tx.send(());
            server.await??;
            return Err(e);
        }
    };
    say!("  try:            modelshare --server {address} ps");
    if !args.exit_after_ready {
        say!("  (Ctrl-C stops the workers and the server)");
        shutdown.await;
    }
    for mut w in workers {
        if let Some(pid) = w.id() {
            // Ask the worker to release and leave; kill it if it does not within a second.
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status();
        }
        if tokio::time::timeout(std::time::Duration::from_secs(1), w.wait())
            .await
            .is_err()
        {
            let _ = w.kill().await;
        }
    }
    let _ = stop_tx.send(());
    server.await??;
    Ok(())
}

/// Describes what the server loaded, through its admin API.
async fn summarize(address: &str) -> anyhow::Result<String> {
    let channel = modelshare_worker::connect::channel(address).await?;
    let mut admin = AdminServiceClient::new(channel);
    let models = admin
        .list_models(pb::ListModelsRequest {})
        .await?
        .into_inner()
        .models;
    let stats = admin.get_stats(pb::GetStatsRequest {}).await?.into_inner();
    let mut text = String::new();
    for m in &models {
        for v in &m.versions {
            text.push_str(&format!(
                "  loaded:         {} v{} ({} tensors, {})\n",
                m.name,
                v.version,
                v.tensor_count,
                crate::commands::human_bytes(v.arena_bytes)
            ));
        }
    }
    text.push_str(&format!(
        "  memory held:    {} in {} arena(s)\n",
        crate::commands::human_bytes(stats.arena_bytes),
        stats.arenas
    ));
    Ok(text)
}

/// `Rss` and `Pss` in bytes of the mapping whose header line contains `needle`, in `pid`.
fn mapping_memory(pid: u32, needle: &str) -> Option<(u64, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let mut lines = smaps.lines().skip_while(|l| !l.contains(needle)).skip(1);
    let mut field = |name: &str| -> Option<u64> {
        let line = lines.find(|l| l.starts_with(name))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    let rss = field("Rss:")?;
    let pss = field("Pss:")?;
    Some((rss, pss))
}

/// Starts `n` worker processes (`modelshare probe --hold`), prints what each saw, and shows
/// that the model's memory is held once.
async fn start_workers(address: &str, n: usize) -> anyhow::Result<Vec<tokio::process::Child>> {
    use tokio::io::AsyncBufReadExt;
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    let mut reports = Vec::new();
    for i in 0..n {
        let mut child = tokio::process::Command::new(&exe)
            .args([
                "--server", address, "--output", "json", "probe", DEMO_MODEL, "--hold",
            ])
            .args(["--name", &format!("demo-worker-{i}")])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("worker {i} has no stdout"))?;
        let mut line = String::new();
        tokio::io::BufReader::new(stdout)
            .read_line(&mut line)
            .await?;
        let report: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| anyhow::anyhow!("worker {i} did not report ({e}): {line:?}"))?;
        reports.push(report);
        children.push(child);
    }
    let needle = format!("memfd:modelshare:{DEMO_MODEL}@");
    say!("  workers:");
    for r in &reports {
        let pid = r["pid"].as_u64().unwrap_or(0) as u32;
        let (rss, pss) = mapping_memory(pid, &needle).unwrap_or((0, 0));
        say!(
            "    pid {:>7}: {} v{} {} tensors, {} read, checksums {}, attach {:.2} ms, memfd inode {}, rss {} pss {}",
            pid,
            r["model"].as_str().unwrap_or("?"),
            r["version"],
            r["tensors"],
            crate::commands::human_bytes(r["bytes"].as_u64().unwrap_or(0)),
            if r["verified"] == true {
                "ok"
            } else {
                "MISMATCHED"
            },
            r["attach_ms"].as_f64().unwrap_or(0.0),
            r["mapping"]["inode"],
            crate::commands::human_bytes(rss),
            crate::commands::human_bytes(pss),
        );
    }
    let channel = modelshare_worker::connect::channel(address).await?;
    let stats = AdminServiceClient::new(channel)
        .get_stats(pb::GetStatsRequest {})
        .await?
        .into_inner();
    let inodes: std::collections::BTreeSet<String> = reports
        .iter()
        .map(|r| r["mapping"]["inode"].to_string())
        .collect();
    say!(
        "  held once:      {} workers, {} leases, {} arena(s) of {} on the server, {} distinct memfd(s) mapped",
        stats.sessions,
        stats.leases,
        stats.arenas,
        crate::commands::human_bytes(stats.arena_bytes),
        inodes.len()
    );
    Ok(children)
}
