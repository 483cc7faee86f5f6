//! `modelshare ps`: the worker sessions, their leases, and the models they serve with what
//! they hold.

use comfy_table::Cell;
use modelshare_proto::v1 as pb;
use serde_json::{Value, json};

use super::{OutputFormat, owner_text, print_json, right, say, table};

/// `modelshare ps`.
pub fn sessions(ss: &[pb::SessionInfo], out: OutputFormat) {
    match out {
        OutputFormat::Json => print_json(&json!({
            "sessions": ss.iter().map(session_json).collect::<Vec<_>>()
        })),
        OutputFormat::Table => sessions_table(ss),
    }
}

/// JSON of a session, its leases and what it serves.
fn session_json(s: &pb::SessionInfo) -> Value {
    json!({
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
    })
}

/// `modelshare ps` as a table: a row per session.
fn sessions_table(ss: &[pb::SessionInfo]) {
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
