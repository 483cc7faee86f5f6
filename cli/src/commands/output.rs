//! Printing command results as readable tables or as JSON (one document per command).

use comfy_table::presets::UTF8_BORDERS_ONLY;
use comfy_table::{Cell, CellAlignment, Table};
use modelshare_proto::v1 as pb;
use serde_json::{Value, json};

/// Writes one line to stdout. When the reader has gone (`modelshare ls | head`), exits quietly
/// instead of panicking as `println!` would.
pub fn write_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// `println!` through [`write_line`].
macro_rules! say {
    ($($arg:tt)*) => { $crate::commands::output::write_line(format_args!($($arg)*)) };
}
pub(crate) use say;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Readable tables.
    Table,
    /// JSON on one line.
    Json,
}

/// `1536` → `1.5 KiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn state_name(v: i32) -> &'static str {
    match pb::VersionState::try_from(v) {
        Ok(pb::VersionState::Loading) => "loading",
        Ok(pb::VersionState::Ready) => "ready",
        Ok(pb::VersionState::Draining) => "draining",
        Ok(pb::VersionState::Freed) => "freed",
        Ok(pb::VersionState::Failed) => "failed",
        Ok(pb::VersionState::Unspecified) | Err(_) => "unknown",
    }
}

fn dtype_name(v: i32) -> String {
    pb::DType::try_from(v)
        .map(|d| d.as_str_name().trim_start_matches("DTYPE_").to_owned())
        .unwrap_or_else(|_| format!("unknown({v})"))
}

fn backend_name(v: i32) -> &'static str {
    match pb::BackendKind::try_from(v) {
        Ok(pb::BackendKind::Host) => "host",
        Ok(pb::BackendKind::CudaIpc) => "cuda-ipc",
        Ok(pb::BackendKind::CudaVmm) => "cuda-vmm",
        Ok(pb::BackendKind::Unspecified) | Err(_) => "unknown",
    }
}

pub(super) fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header(header.iter().copied());
    t
}

fn right(s: impl ToString) -> Cell {
    Cell::new(s.to_string()).set_alignment(CellAlignment::Right)
}

pub(super) fn print_json(v: &Value) {
    say!("{v}");
}

/// JSON of a version.
pub fn version_json(v: &pb::VersionInfo) -> Value {
    json!({
        "version": v.version,
        "state": state_name(v.state),
        "arena_bytes": v.arena_bytes,
        "tensor_count": v.tensor_count,
        "source": v.source,
        "created_unix_ms": v.created_unix_ms,
        "finished_unix_ms": v.finished_unix_ms,
        "error": v.error,
        "leases": v.leases,
        "bytes_loaded": v.bytes_loaded,
        "bytes_total": v.bytes_total,
        "devices": v.devices,
        "devices_copying": v.devices_copying,
    })
}

/// The devices holding a version, as shown in tables: `host, host-1 (copying)`.
fn devices_text(v: &pb::VersionInfo) -> String {
    let copying = v.devices_copying.iter().map(|d| format!("{d} (copying)"));
    let all: Vec<String> = v.devices.iter().cloned().chain(copying).collect();
    if all.is_empty() {
        "-".to_owned()
    } else {
        all.join(", ")
    }
}

/// A model's owner as shown in tables: `-` for none.
fn owner_text(owner: &str) -> &str {
    if owner.is_empty() { "-" } else { owner }
}

/// A model's access as shown in tables: `private`, `public` or `shared: a,b`.
pub fn access_text(access: Option<&pb::ModelAccess>) -> String {
    match access {
        Some(a) if a.public => "public".into(),
        Some(a) if !a.shared_with.is_empty() => format!("shared: {}", a.shared_with.join(",")),
        _ => "private".into(),
    }
}

fn access_json(access: Option<&pb::ModelAccess>) -> Value {
    let access = access.cloned().unwrap_or_default();
    json!({"shared_with": access.shared_with, "public": access.public})
}

fn model_json(m: &pb::ModelInfo) -> Value {
    json!({
        "name": m.name,
        "owner": m.owner,
        "access": access_json(m.access.as_ref()),
        "latest_ready": m.latest_ready,
        "versions": m.versions.iter().map(version_json).collect::<Vec<_>>(),
    })
}

/// `modelshare token new`.
pub fn new_token(token: &str, hash: &str, out: OutputFormat) {
    match out {
        OutputFormat::Json => print_json(&json!({"token": token, "hash": hash})),
        OutputFormat::Table => {
            say!("token: {token}");
            say!("hash:  {hash}");
            say!("");
            say!("Put the hash in the tenants file (a tenant's or [admin] token_hashes) and give");
            say!("the token to the tenant. The server keeps only the hash: this is the one time");
            say!("the token is shown.");
        }
    }
}

/// `modelshare token hash`.
pub fn token_hash(hash: &str, out: OutputFormat) {
    match out {
        OutputFormat::Json => print_json(&json!({"hash": hash})),
        OutputFormat::Table => say!("{hash}"),
    }
}

/// `modelshare access`.
pub fn access(m: &pb::ModelInfo, out: OutputFormat) {
    match out {
        OutputFormat::Json => print_json(&json!({"model": model_json(m)})),
        OutputFormat::Table => say!(
            "{}: owner {}, access {}",
            m.name,
            owner_text(&m.owner),
            access_text(m.access.as_ref())
        ),
    }
}

/// `modelshare reload-tenants`.
pub fn tenants_reloaded(r: &pb::ReloadTenantsResponse, out: OutputFormat) {
    match out {
        OutputFormat::Json => print_json(&json!({
            "tenants": r.tenants,
            "admin_tokens": r.admin_tokens,
        })),
        OutputFormat::Table => {
            let names = if r.tenants.is_empty() {
                "none".to_owned()
            } else {
                r.tenants.join(", ")
            };
            say!(
                "tenants reloaded: {} tenant(s): {names}; {} admin token(s)",
                r.tenants.len(),
                r.admin_tokens
            );
        }
    }
}

/// `used/limit`, `-` for an unlimited (0) limit.
fn against(used: impl ToString, limit: u64, show: impl Fn(u64) -> String) -> String {
    let limit = if limit == 0 {
        "-".to_owned()
    } else {
        show(limit)
    };
    format!("{}/{limit}", used.to_string())
}

fn tenant_usage_json(t: &pb::TenantUsage) -> Value {
    let q = t.quota.unwrap_or_default();
    json!({
        "name": t.name,
        "device_bytes": t.device_bytes,
        "models": t.models,
        "sessions": t.sessions,
        "leases": t.leases,
        "inflight": t.inflight,
        "loads": t.loads,
        "requests": t.requests,
        "quota": {
            "device_bytes": q.device_bytes,
            "models": q.models,
            "sessions": q.sessions,
            "leases": q.leases,
            "inflight": q.inflight,
            "loads": q.loads,
            "requests": q.requests,
        },
    })
}

/// A finished load.
pub fn loaded(name: &str, v: &pb::VersionInfo, out: OutputFormat) {
    match out {
        OutputFormat::Json => print_json(&json!({"model": name, "version": version_json(v)})),
        OutputFormat::Table => say!(
            "loaded {name} v{}: {} tensors, {} ({}) on {}",
            v.version,
            v.tensor_count,
            human_bytes(v.arena_bytes),
            state_name(v.state),
            v.devices.join(", ")
        ),
    }
}

/// Versions affected by an unload.
pub fn versions(vs: &[pb::VersionInfo], out: OutputFormat) {
    match out {
        OutputFormat::Json => print_json(&json!({
            "versions": vs.iter().map(version_json).collect::<Vec<_>>()
        })),
        OutputFormat::Table => {
            let mut t = table(&["VERSION", "STATE", "ARENA", "LEASES"]);
            for v in vs {
                t.add_row(vec![
                    right(v.version),
                    Cell::new(state_name(v.state)),
                    right(human_bytes(v.arena_bytes)),
                    right(v.leases),
                ]);
            }
            say!("{t}");
        }
    }
}

/// `modelshare ls`.
pub fn models(ms: &[pb::ModelInfo], out: OutputFormat) {
    match out {
        OutputFormat::Json => print_json(&json!({
            "models": ms.iter().map(model_json).collect::<Vec<_>>()
        })),
        OutputFormat::Table => {
            // Where each version is, once the versions listed are on more than one device.
            let devices: std::collections::BTreeSet<&String> = ms
                .iter()
                .flat_map(|m| &m.versions)
                .flat_map(|v| v.devices.iter().chain(&v.devices_copying))
                .collect();
            let several = devices.len() > 1;
            let mut header = vec![
                "MODEL", "OWNER", "ACCESS", "VERSION", "STATE", "ARENA", "TENSORS", "LEASES",
            ];
            if several {
                header.push("DEVICES");
            }
            header.push("SOURCE");
            let mut t = table(&header);
            for m in ms {
                let access = access_text(m.access.as_ref());
                for v in &m.versions {
                    let mark = if v.version == m.latest_ready { "*" } else { "" };
                    let mut row = vec![
                        Cell::new(&m.name),
                        Cell::new(owner_text(&m.owner)),
                        Cell::new(&access),
                        right(format!("{}{mark}", v.version)),
                        Cell::new(state_name(v.state)),
                        right(human_bytes(v.arena_bytes)),
                        right(v.tensor_count),
                        right(v.leases),
                    ];
                    if several {
                        row.push(Cell::new(devices_text(v)));
                    }
                    row.push(Cell::new(&v.source));
                    t.add_row(row);
                }
            }
            say!("{t}");
            if ms.is_empty() {
                say!("no models loaded");
            }
        }
    }
}

/// `modelshare describe`.
pub fn describe(r: &pb::DescribeModelResponse, out: OutputFormat) {
    let tensors = r
        .manifest
        .as_ref()
        .map(|m| m.tensors.as_slice())
        .unwrap_or(&[]);
    match out {
        OutputFormat::Json => {
            let manifest = r.manifest.as_ref().map(|m| {
                json!({
                    "model": m.model,
                    "version": m.version,
                    "arena_bytes": m.arena_bytes,
                    "alignment": m.alignment,
                    "tensors": m.tensors.iter().map(|t| json!({
                        "name": t.name,
                        "dtype": dtype_name(t.dtype),
                        "shape": t.shape,
                        "offset": t.offset,
                        "byte_length": t.byte_length,
                        "xxh3": format!("{:016x}", t.xxh3),
                    })).collect::<Vec<_>>(),
                    "header_metadata": m.header_metadata,
                    "files": m.files.iter().map(|f| json!({"name": f.name, "bytes": f.content.len()})).collect::<Vec<_>>(),
                })
            });
            print_json(&json!({
                "model": r.model.as_ref().map(model_json),
                "manifest": manifest,
                "device": r.device.as_ref().map(|d| json!({
                    "uuid": d.uuid, "name": d.name, "backend": backend_name(d.backend),
                })),
            }));
        }
        OutputFormat::Table => {
            if let Some(m) = &r.model {
                models(std::slice::from_ref(m), OutputFormat::Table);
            }
            if let Some(m) = &r.manifest {
                say!(
                    "version {}: {} tensors in a {} arena, aligned to {} bytes{}",
                    m.version,
                    m.tensors.len(),
                    human_bytes(m.arena_bytes),
                    m.alignment,
                    r.device.as_ref().map_or(String::new(), |d| format!(
                        ", on {} ({}: workers map it {})",
                        d.uuid,
                        backend_name(d.backend),
                        if d.backend == pb::BackendKind::CudaIpc as i32 {
                            "WRITABLE"
                        } else {
                            "read-only"
                        }
                    ))
                );
                let mut t = table(&["TENSOR", "DTYPE", "SHAPE", "OFFSET", "BYTES", "XXH3"]);
                for x in tensors {
                    t.add_row(vec![
                        Cell::new(&x.name),
                        Cell::new(dtype_name(x.dtype)),
                        Cell::new(format!("{:?}", x.shape)),
                        right(x.offset),
                        right(x.byte_length),
                        Cell::new(format!("{:016x}", x.xxh3)),
                    ]);
                }
                say!("{t}");
                if !m.files.is_empty() {
                    let names: Vec<&str> = m.files.iter().map(|f| f.name.as_str()).collect();
                    say!("metadata files: {}", names.join(", "));
                }
            }
        }
    }
}

/// `modelshare stats`.
pub fn stats(s: &pb::GetStatsResponse, out: OutputFormat) {
    let device = s.device.clone().unwrap_or_default();
    let by_state: Vec<(&str, u32)> = s
        .versions_by_state
        .iter()
        .map(|c| (state_name(c.state), c.count))
        .collect();
    match out {
        OutputFormat::Json => print_json(&json!({
            "device": {
                "backend": backend_name(device.backend),
                "uuid": device.uuid,
                "name": device.name,
                "total_bytes": device.total_bytes,
            },
            "arena_bytes": s.arena_bytes,
            "arenas": s.arenas,
            "models": s.models,
            "versions_by_state": by_state.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "sessions": s.sessions,
            "leases": s.leases,
            "device_used_bytes": s.device_used_bytes,
            "held_by_workers_bytes": s.held_by_workers_bytes,
            "tenants": s.tenants.iter().map(tenant_usage_json).collect::<Vec<_>>(),
            "requests_outstanding": s.requests_outstanding,
            "serving": s.serving.iter().map(|m| json!({
                "model": m.model, "queued_items": m.queued_items,
                "serving_workers": m.serving_workers, "versions": m.versions,
            })).collect::<Vec<_>>(),
            "devices": s.devices.iter().map(|d| {
                let info = d.device.clone().unwrap_or_default();
                json!({
                    "uuid": info.uuid, "name": info.name, "total_bytes": info.total_bytes,
                    "used_bytes": d.used_bytes, "arena_bytes": d.arena_bytes,
                    "arenas": d.arenas, "leases": d.leases,
                    "max_arena_bytes": d.max_arena_bytes,
                })
            }).collect::<Vec<_>>(),
        })),
        OutputFormat::Table => {
            let mut t = table(&["STAT", "VALUE"]);
            if s.devices.len() > 1 {
                // Each device has its row in the table below; `device` is only the first.
                t.add_row(vec![
                    Cell::new("devices"),
                    Cell::new(format!(
                        "{} ({}; each below)",
                        s.devices.len(),
                        backend_name(device.backend)
                    )),
                ]);
            } else {
                t.add_row(vec![
                    Cell::new("device"),
                    Cell::new(format!(
                        "{} ({}, {})",
                        device.name,
                        backend_name(device.backend),
                        device.uuid
                    )),
                ]);
                t.add_row(vec![
                    Cell::new("device total"),
                    right(human_bytes(device.total_bytes)),
                ]);
            }
            t.add_row(vec![
                Cell::new("arena bytes"),
                right(human_bytes(s.arena_bytes)),
            ]);
            t.add_row(vec![Cell::new("arenas"), right(s.arenas)]);
            if s.held_by_workers_bytes > 0 {
                t.add_row(vec![
                    Cell::new("held by workers only"),
                    right(human_bytes(s.held_by_workers_bytes)),
                ]);
            }
            t.add_row(vec![Cell::new("models"), right(s.models)]);
            for (state, n) in &by_state {
                t.add_row(vec![Cell::new(format!("versions {state}")), right(n)]);
            }
            t.add_row(vec![Cell::new("sessions"), right(s.sessions)]);
            t.add_row(vec![Cell::new("leases"), right(s.leases)]);
            t.add_row(vec![
                Cell::new("requests outstanding"),
                right(s.requests_outstanding),
            ]);
            say!("{t}");
            if s.devices.len() > 1 {
                let mut d = table(&[
                    "#",
                    "DEVICE",
                    "TOTAL",
                    "USED",
                    "ARENAS",
                    "ARENA BYTES",
                    "LEASES",
                ]);
                for (i, dev) in s.devices.iter().enumerate() {
                    let info = dev.device.clone().unwrap_or_default();
                    d.add_row(vec![
                        right(i),
                        Cell::new(format!("{} ({})", info.uuid, info.name)),
                        right(human_bytes(info.total_bytes)),
                        right(human_bytes(dev.used_bytes)),
                        right(dev.arenas),
                        right(human_bytes(dev.arena_bytes)),
                        right(dev.leases),
                    ]);
                }
                say!("{d}");
            }
            if !s.serving.is_empty() {
                let mut m = table(&["MODEL", "SERVING WORKERS", "VERSIONS", "QUEUED ITEMS"]);
                for q in &s.serving {
                    let versions: Vec<String> = q.versions.iter().map(u32::to_string).collect();
                    m.add_row(vec![
                        Cell::new(&q.model),
                        right(q.serving_workers),
                        Cell::new(versions.join(", ")),
                        right(q.queued_items),
                    ]);
                }
                say!("{m}");
            }
            if !s.tenants.is_empty() {
                say!("{}", tenant_table(&s.tenants));
            }
        }
    }
}

/// Usage against quota per tenant (`used/limit`; `-`: unlimited).
fn tenant_table(tenants: &[pb::TenantUsage]) -> Table {
    let mut t = table(&[
        "TENANT",
        "DEVICE BYTES",
        "MODELS",
        "SESSIONS",
        "LEASES",
        "INFLIGHT",
        "LOADS",
        "REQUESTS",
    ]);
    let count = |n: u64| n.to_string();
    for u in tenants {
        let q = u.quota.unwrap_or_default();
        t.add_row(vec![
            Cell::new(&u.name),
            right(against(
                human_bytes(u.device_bytes),
                q.device_bytes,
                human_bytes,
            )),
            right(against(u.models, q.models.into(), count)),
            right(against(u.sessions, q.sessions.into(), count)),
            right(against(u.leases, q.leases.into(), count)),
            right(against(u.inflight, q.inflight.into(), count)),
            right(against(u.loads, q.loads.into(), count)),
            right(against(u.requests, q.requests.into(), count)),
        ]);
    }
    t
}

/// `modelshare ps`.
pub fn sessions(ss: &[pb::SessionInfo], out: OutputFormat) {
    match out {
        OutputFormat::Json => print_json(&json!({
            "sessions": ss.iter().map(|s| json!({
                "session_id": s.session_id,
                "tenant": s.tenant,
                "worker_name": s.worker_name,
                "pid": s.pid,
                "labels": s.labels,
                "opened_unix_ms": s.opened_unix_ms,
                "leases": s.leases.iter().map(|l| json!({
                    "lease_id": l.lease_id, "model": l.model, "version": l.version,
                    "device_uuid": l.device_uuid,
                })).collect::<Vec<_>>(),
                "serving": s.serving.iter().map(|w| json!({
                    "serve_id": w.serve_id, "model": w.model, "version": w.version,
                    "credits": w.credits, "batches_in_flight": w.batches_in_flight,
                    "items_in_flight": w.items_in_flight, "batches_done": w.batches_done,
                    "draining": w.draining,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>()
        })),
        OutputFormat::Table => {
            let mut t = table(&[
                "SESSION",
                "TENANT",
                "WORKER",
                "PID",
                "LEASES",
                "SERVING",
                "IN FLIGHT",
            ]);
            for s in ss {
                let leases: Vec<String> = s
                    .leases
                    .iter()
                    .map(|l| format!("{}@{} on {}", l.model, l.version, l.device_uuid))
                    .collect();
                let serving: Vec<String> = s
                    .serving
                    .iter()
                    .map(|w| {
                        let drain = if w.draining { " (draining)" } else { "" };
                        format!("{}@{}{drain}", w.model, w.version)
                    })
                    .collect();
                let in_flight: Vec<String> = s
                    .serving
                    .iter()
                    .map(|w| {
                        format!(
                            "{} items / {} of {} batches",
                            w.items_in_flight, w.batches_in_flight, w.credits
                        )
                    })
                    .collect();
                t.add_row(vec![
                    Cell::new(&s.session_id),
                    Cell::new(owner_text(&s.tenant)),
                    Cell::new(&s.worker_name),
                    right(s.pid),
                    Cell::new(leases.join(", ")),
                    Cell::new(serving.join(", ")),
                    Cell::new(in_flight.join(", ")),
                ]);
            }
            say!("{t}");
            if ss.is_empty() {
                say!("no sessions");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes in tables must read as people expect.
    #[test]
    fn bytes_are_human_readable() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(12 << 30), "12.0 GiB");
    }

    /// Operators read a model's access from `ls`; a shared model shown as private (or the
    /// reverse) would mislead them.
    #[test]
    fn access_reads_as_private_public_or_shared() {
        assert_eq!(access_text(None), "private");
        assert_eq!(access_text(Some(&pb::ModelAccess::default())), "private");
        let shared = pb::ModelAccess {
            shared_with: vec!["a".into(), "b".into()],
            public: false,
        };
        assert_eq!(access_text(Some(&shared)), "shared: a,b");
        let public = pb::ModelAccess {
            public: true,
            ..shared
        };
        assert_eq!(access_text(Some(&public)), "public");
    }

    /// A quota of 0 is unlimited; showing it as `/0` would read as "nothing allowed".
    #[test]
    fn usage_against_quota() {
        let count = |n: u64| n.to_string();
        assert_eq!(against(3u32, 0, count), "3/-");
        assert_eq!(against(3u32, 8, count), "3/8");
        assert_eq!(
            against(human_bytes(1536), 2048, human_bytes),
            "1.5 KiB/2.0 KiB"
        );
        let usage = pb::TenantUsage {
            name: "search".into(),
            models: 2,
            quota: Some(pb::TenantQuota {
                models: 4,
                ..Default::default()
            }),
            ..Default::default()
        };
        let shown = tenant_table(std::slice::from_ref(&usage)).to_string();
        assert!(
            shown.contains("search") && shown.contains("2/4") && shown.contains("0/-"),
            "{shown}"
        );
        assert_eq!(tenant_usage_json(&usage)["quota"]["models"], 4);
    }
}
