//! `modelshare stats`: memory use and models by state, each device, the serving queues, and
//! the tenants' usage against their quotas.

use comfy_table::{Cell, Table};
use modelshare_proto::v1 as pb;
use serde_json::{Value, json};

use super::tenants::{tenant_table, tenant_usage_json};
use super::{OutputFormat, backend_name, human_bytes, print_json, right, say, state_name, table};

/// `modelshare stats`.
pub fn stats(s: &pb::GetStatsResponse, out: OutputFormat) {
    let device = s.device.clone().unwrap_or_default();
    let by_state: Vec<(&str, u32)> = s
        .versions_by_state
        .iter()
        .map(|c| (state_name(c.state), c.count))
        .collect();
    match out {
        OutputFormat::Json => print_json(&stats_json(s, &device, &by_state)),
        OutputFormat::Table => {
            say!("{}", summary_table(s, &device, &by_state));
            if s.devices.len() > 1 {
                say!("{}", devices_table(&s.devices));
            }
            if !s.serving.is_empty() {
                say!("{}", serving_table(&s.serving));
            }
            if !s.tenants.is_empty() {
                say!("{}", tenant_table(&s.tenants));
            }
        }
    }
}

/// JSON of the stats: `device` is the first device, `devices` each.
fn stats_json(
    s: &pb::GetStatsResponse,
    device: &pb::DeviceInfo,
    by_state: &[(&str, u32)],
) -> Value {
    json!({
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
    })
}

/// The server's figures, a row each: the device (or the number of devices), arenas, models,
/// versions by state, sessions, leases, requests outstanding.
fn summary_table(
    s: &pb::GetStatsResponse,
    device: &pb::DeviceInfo,
    by_state: &[(&str, u32)],
) -> Table {
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
    for (state, n) in by_state {
        t.add_row(vec![Cell::new(format!("versions {state}")), right(n)]);
    }
    t.add_row(vec![Cell::new("sessions"), right(s.sessions)]);
    t.add_row(vec![Cell::new("leases"), right(s.leases)]);
    t.add_row(vec![
        Cell::new("requests outstanding"),
        right(s.requests_outstanding),
    ]);
    t
}

/// A row per device: its memory, arenas and leases.
fn devices_table(devices: &[pb::DeviceStats]) -> Table {
    let mut d = table(&[
        "#",
        "DEVICE",
        "TOTAL",
        "USED",
        "ARENAS",
        "ARENA BYTES",
        "LEASES",
    ]);
    for (i, dev) in devices.iter().enumerate() {
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
    d
}

/// A row per model served: its workers, versions and queued items.
fn serving_table(serving: &[pb::ModelServingStats]) -> Table {
    let mut m = table(&["MODEL", "SERVING WORKERS", "VERSIONS", "QUEUED ITEMS"]);
    for q in serving {
        let versions: Vec<String> = q.versions.iter().map(u32::to_string).collect();
        m.add_row(vec![
            Cell::new(&q.model),
            right(q.serving_workers),
            Cell::new(versions.join(", ")),
            right(q.queued_items),
        ]);
    }
    m
}
