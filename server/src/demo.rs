//! `modelshare demo`: writes a small transformer-shaped model (safetensors + config.json),
//! serves it on the host backend, and prints where the server listens and what it loaded.

use std::future::Future;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;

use crate::config::{BackendChoice, Config, ServeArgs, StartupModel};
use crate::{serve, telemetry};

/// Name the demo model is served under.
pub const DEMO_MODEL: &str = "tiny-demo";

/// Flags of `modelshare demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Directory for the generated model and the sockets (default: a fresh temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// TCP address for gRPC.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
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
    let (vocab, dim, layers) = (512u64, 128u64, 2u64);
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

/// Runs the demo until `shutdown` resolves (or right after the summary with `--exit-after-ready`).
pub async fn run(
    args: DemoArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    telemetry::init(telemetry::LogFormat::Text);
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("modelshare-demo-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    write_demo_model(&dir)?;
    let socket = dir.join("grpc.sock");
    let config = Config::from_args(ServeArgs {
        listen: Some(args.listen),
        unix_socket: Some(socket.clone()),
        model_root: Some(dir.clone()),
        backend: Some(BackendChoice::Host),
        models: vec![StartupModel {
            name: DEMO_MODEL.into(),
            path: DEMO_MODEL.into(),
        }],
        ..ServeArgs::default()
    })?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(serve::run_notify(
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
            println!("modelshare demo");
            if let Some(tcp) = bound.tcp {
                println!("  grpc (tcp):     http://{tcp}");
            }
            println!("  grpc (unix):    {address}");
            println!("  handle socket:  {}", bound.handles.display());
            println!("  model root:     {}", dir.display());
            print!("{text}");
            println!("  try:            modelshare --server {address} describe {DEMO_MODEL}");
        }
        Err(e) => {
            let _ = stop_tx.send(());
            server.await??;
            return Err(e);
        }
    }
    if !args.exit_after_ready {
        shutdown.await;
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
                crate::cli::human_bytes(v.arena_bytes)
            ));
        }
    }
    text.push_str(&format!(
        "  memory held:    {} in {} arena(s)\n",
        crate::cli::human_bytes(stats.arena_bytes),
        stats.arenas
    ));
    Ok(text)
}
