//! Tenants: a new token and its hash (`token new`, `token hash`), the tenants in force after
//! `reload-tenants`, and each tenant's usage against its quota (in `stats`).

use comfy_table::{Cell, Table};
use modelshare_proto::v1 as pb;
use serde_json::{Value, json};

use super::{OutputFormat, human_bytes, print_json, right, say, table};

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

/// JSON of a tenant's usage and quota.
pub(super) fn tenant_usage_json(t: &pb::TenantUsage) -> Value {
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
            "max_tokens": q.max_tokens,
            "prompt_tokens": q.prompt_tokens,
            "stop_strings": q.stop_strings,
        },
    })
}

/// A tenant's generation caps, `max_tokens 1024, prompt 8192, stop 2`; `-` when it has none.
fn generation_caps(q: &pb::TenantQuota) -> String {
    let caps: Vec<String> = [
        ("max_tokens", q.max_tokens),
        ("prompt", q.prompt_tokens),
        ("stop", q.stop_strings),
    ]
    .into_iter()
    .filter(|(_, cap)| *cap > 0)
    .map(|(name, cap)| format!("{name} {cap}"))
    .collect();
    if caps.is_empty() {
        "-".to_owned()
    } else {
        caps.join(", ")
    }
}

/// Usage against quota per tenant (`used/limit`; `-`: unlimited).
pub(super) fn tenant_table(tenants: &[pb::TenantUsage]) -> Table {
    let mut t = table(&[
        "TENANT",
        "DEVICE BYTES",
        "MODELS",
        "SESSIONS",
        "LEASES",
        "INFLIGHT",
        "LOADS",
        "REQUESTS",
        "GENERATION CAPS",
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
            Cell::new(generation_caps(&q)),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

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
                max_tokens: 1024,
                stop_strings: 2,
                ..Default::default()
            }),
            ..Default::default()
        };
        let shown = tenant_table(std::slice::from_ref(&usage)).to_string();
        assert!(
            shown.contains("search") && shown.contains("2/4") && shown.contains("0/-"),
            "{shown}"
        );
        assert!(shown.contains("max_tokens 1024, stop 2"), "{shown}");
        let json = tenant_usage_json(&usage);
        assert_eq!(json["quota"]["models"], 4);
        assert_eq!(
            (
                &json["quota"]["max_tokens"],
                &json["quota"]["prompt_tokens"]
            ),
            (&serde_json::json!(1024), &serde_json::json!(0))
        );
        let none = pb::TenantUsage::default();
        assert!(
            tenant_table(std::slice::from_ref(&none))
                .to_string()
                .contains(" - ")
        );
    }
}
