//! Versions and models: a finished `load`, the versions an `unload` affected, `ls`, and a
//! model's `access`.

use comfy_table::Cell;
use modelshare_proto::v1 as pb;
use serde_json::{Value, json};

use super::{OutputFormat, human_bytes, owner_text, print_json, right, say, state_name, table};

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
        "shares_memory": v.shares_memory,
        "content_sha256": v.content_sha256,
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

/// A model's access as shown in tables: `private`, `public` or `shared: a,b`.
pub fn access_text(access: Option<&pb::ModelAccess>) -> String {
    match access {
        Some(a) if a.public => "public".into(),
        Some(a) if !a.shared_with.is_empty() => format!("shared: {}", a.shared_with.join(",")),
        _ => "private".into(),
    }
}

/// JSON of a model's access.
fn access_json(access: Option<&pb::ModelAccess>) -> Value {
    let access = access.cloned().unwrap_or_default();
    json!({"shared_with": access.shared_with, "public": access.public})
}

/// JSON of a model and its versions.
pub(super) fn model_json(m: &pb::ModelInfo) -> Value {
    json!({
        "name": m.name,
        "owner": m.owner,
        "access": access_json(m.access.as_ref()),
        "latest_ready": m.latest_ready,
        "versions": m.versions.iter().map(version_json).collect::<Vec<_>>(),
    })
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

/// A finished load.
pub fn loaded(name: &str, v: &pb::VersionInfo, out: OutputFormat) {
    match out {
        OutputFormat::Json => print_json(&json!({"model": name, "version": version_json(v)})),
        OutputFormat::Table => say!(
            "loaded {name} v{}: {} tensors, {} ({}) on {}{}",
            v.version,
            v.tensor_count,
            human_bytes(v.arena_bytes),
            state_name(v.state),
            v.devices.join(", "),
            if v.shares_memory {
                ", in the memory of a version holding the same bytes (no copy)"
            } else {
                ""
            }
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
        OutputFormat::Table => models_table(ms),
    }
}

/// `modelshare ls` as a table: a row per version, its devices in a column once the versions
/// listed are on more than one device.
fn models_table(ms: &[pb::ModelInfo]) {
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
                // Memory another version holds too counts once on the device.
                right(if v.shares_memory {
                    format!("{} (shared)", human_bytes(v.arena_bytes))
                } else {
                    human_bytes(v.arena_bytes)
                }),
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
