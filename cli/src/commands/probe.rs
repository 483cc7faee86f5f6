//! `modelshare probe`: attach to a model the way a worker does, verify every tensor against
//! the manifest's checksum, and report what was mapped. With `--hold` it keeps the lease and
//! prints session events until SIGTERM/SIGINT (operators use it to check a deployment; the
//! demo and the tests use it as a real worker process).

use std::time::Instant;

use serde_json::json;

use super::OutputFormat;
use super::output::say;

/// Flags of `modelshare probe`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    /// Model name.
    pub model: String,
    /// Version (default: latest ready).
    #[arg(long)]
    pub version: Option<u32>,
    /// Worker name shown by `modelshare ps`.
    #[arg(long, default_value = "probe")]
    pub name: String,
    /// Keep the lease and print session events until SIGTERM or SIGINT.
    #[arg(long)]
    pub hold: bool,
}

/// The line of `/proc/self/maps` that maps the arena of `model`@`version`, split into
/// (permissions, inode, path).
fn arena_mapping(model: &str, version: u32) -> Option<(String, u64, String)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let needle = format!("memfd:modelshare:{model}@{version}");
    let line = maps.lines().find(|l| l.contains(&needle))?;
    let mut parts = line.split_whitespace();
    let perms = parts.nth(1)?.to_owned();
    let inode = parts.nth(2)?.parse().ok()?;
    let path = parts.collect::<Vec<_>>().join(" ");
    Some((perms, inode, path))
}

/// Runs the probe; fails if any checksum does not match.
pub async fn run(
    server: &str,
    connect: modelshare_worker::ConnectOptions,
    args: ProbeArgs,
    out: OutputFormat,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let session = modelshare_worker::Session::open_with(
        server,
        modelshare_worker::SessionOptions {
            worker_name: args.name.clone(),
            connect,
            ..Default::default()
        },
    )
    .await?;
    // Subscribe before anything can happen that a holder should hear of.
    let mut events = session.subscribe();
    let opened_ms = started.elapsed().as_secs_f64() * 1e3;
    let attach_start = Instant::now();
    let model = session
        .attach_version(&args.model, args.version.unwrap_or(0))
        .await?;
    let attach_ms = attach_start.elapsed().as_secs_f64() * 1e3;
    let verify_start = Instant::now();
    let tensors = model.tensors();
    let bytes: u64 = model.manifest().tensors.iter().map(|t| t.byte_length).sum();
    let loading = model.attached_while_loading();
    // A model attached mid-load has no checksums yet: nothing to verify against.
    let mismatched = if loading { Vec::new() } else { model.verify() };
    let verify_ms = verify_start.elapsed().as_secs_f64() * 1e3;
    let mapping = arena_mapping(model.name(), model.version());
    let report = json!({
        "event": "attached",
        "pid": std::process::id(),
        "session_id": session.id(),
        "model": model.name(),
        "version": model.version(),
        "lease_id": model.lease_id(),
        "tensors": tensors.len(),
        "bytes": bytes,
        "arena_bytes": model.manifest().arena_bytes,
        "verified": !loading && mismatched.is_empty(),
        "attached_while_loading": loading,
        "device_ptr": model.view().device_ptr(),
        "device_uuid": model.view().is_on_device().then(|| model.view().device_uuid().to_owned()),
        "mismatched": mismatched,
        "mapping": mapping.as_ref().map(|(perms, inode, path)| json!({"perms": perms, "inode": inode, "path": path})),
        "session_ms": opened_ms,
        "attach_ms": attach_ms,
        "verify_ms": verify_ms,
    });
    match out {
        OutputFormat::Json => say!("{report}"),
        OutputFormat::Table => {
            say!(
                "pid {}: {} v{}: {} tensors, {} verified {} (attach {attach_ms:.2} ms, verify {verify_ms:.2} ms)",
                std::process::id(),
                model.name(),
                model.version(),
                tensors.len(),
                super::human_bytes(bytes),
                if mismatched.is_empty() {
                    "ok"
                } else {
                    "with MISMATCHES"
                },
            );
            if let Some((perms, inode, path)) = &mapping {
                say!("  mapping: {path} inode {inode} {perms}");
            }
        }
    }
    if !mismatched.is_empty() {
        anyhow::bail!("{} tensors do not match their checksums", mismatched.len());
    }
    if args.hold {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                ev = events.recv() => {
                    let Ok(ev) = ev else { continue };
                    match out {
                        OutputFormat::Json => say!("{}", event_json(&ev)),
                        OutputFormat::Table => say!("{ev}"),
                    }
                                }
            }
        }
        model.release().await?;
    }
    Ok(())
}

/// A session event as one JSON object: `{"event": "version_draining", "model": ..., "text": ...}`.
fn event_json(ev: &modelshare_worker::SessionEvent) -> serde_json::Value {
    use modelshare_worker::SessionEvent as E;
    let mut v = json!({"event": ev.kind(), "text": ev.to_string()});
    let fields = match ev {
        E::VersionReady { model, version }
        | E::VersionDraining { model, version }
        | E::Reattached { model, version } => json!({"model": model, "version": version}),
        E::Revoked { reason } => json!({"reason": reason}),
        E::Reconnected { session_id } => json!({"session_id": session_id}),
        E::ModelGone { model, reason } => json!({"model": model, "reason": reason}),
        E::Disconnected => json!({}),
    };
    if let (Some(v), serde_json::Value::Object(f)) = (v.as_object_mut(), fields) {
        v.extend(f);
    }
    v
}
