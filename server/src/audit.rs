//! The audit log: one event per load, unload, access change, attach, release, tenant reload and
//! refusal, on its own tracing target ([`TARGET`]) so that operators can route it apart
//! (`RUST_LOG=modelshare::audit=info`, or filter the JSON logs on `target`).
//!
//! Fields: `action`, `caller` (`admin` or the tenant's name), `model`, `version`, `outcome`
//! (`ok` or `refused`), `code` (the gRPC code of a refusal) and `reason`. Tokens never appear.

use modelshare_core::tenants::Caller;

/// The tracing target of audit events.
pub const TARGET: &str = "modelshare::audit";

/// Who, in an audit field.
fn who(caller: &Caller) -> &str {
    caller.tenant().unwrap_or("admin")
}

/// Records the outcome of `action` by `caller` on `model`@`version` (0: none or latest).
pub fn record<T>(
    caller: &Caller,
    action: &'static str,
    model: &str,
    version: u32,
    outcome: &Result<T, tonic::Status>,
) {
    match outcome {
        Ok(_) => tracing::info!(
            target: TARGET,
            action,
            caller = who(caller),
            model,
            version,
            outcome = "ok",
        ),
        Err(status) => tracing::warn!(
            target: TARGET,
            action,
            caller = who(caller),
            model,
            version,
            outcome = "refused",
            code = ?status.code(),
            reason = status.message(),
        ),
    }
}

/// Records a request refused by the authentication layer.
pub fn auth_refused(path: &str, reason: &str, peer: &str) {
    tracing::warn!(
        target: TARGET,
        action = "authenticate",
        method = path,
        outcome = "refused",
        reason,
        peer,
    );
}

/// Records a tenants reload.
pub fn tenants_reloaded(trigger: &str, result: Result<usize, &str>) {
    match result {
        Ok(tenants) => {
            tracing::info!(target: TARGET, action = "reload_tenants", trigger, tenants, outcome = "ok")
        }
        Err(reason) => {
            tracing::warn!(target: TARGET, action = "reload_tenants", trigger, outcome = "refused", reason)
        }
    }
}

/// Records a session opened, refused or ended (`detail`: the reason it ended or was refused).
pub fn session(caller: &Caller, action: &'static str, session: &str, ok: bool, detail: &str) {
    if ok {
        tracing::info!(target: TARGET, action, caller = who(caller), session, outcome = "ok", detail);
    } else {
        tracing::warn!(target: TARGET, action, caller = who(caller), session, outcome = "refused", reason = detail);
    }
}

/// Records a request refused before any service ran, for a known caller (the in-flight quota).
pub fn call_refused(caller: &Caller, method: &str, reason: &str) {
    tracing::warn!(
        target: TARGET,
        action = "call",
        caller = who(caller),
        method,
        outcome = "refused",
        reason,
    );
}

/// Records a ticket refused on the handle socket.
pub fn ticket_refused(reason: &str, peer_uid: Option<u32>) {
    tracing::warn!(
        target: TARGET,
        action = "redeem_ticket",
        outcome = "refused",
        reason,
        peer_uid = ?peer_uid,
    );
}
