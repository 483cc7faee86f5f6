//! Tenant policy: who may see or do what, decided here and nowhere else, as free functions
//! over plain inputs (the caller, a model's owner and [`Access`], a tenant's name). Every
//! service, the registry and the HTTP routes ask these.
//!
//! # The policy
//!
//! - The admin (and every caller when no tenants file is configured) sees and may do
//!   everything.
//! - A tenant sees a model it owns, one shared with it, or a public one ([`may_see`]). A model
//!   it may not see is answered as if it did not exist.
//! - Only a model's owner, or the admin, changes it: new versions, unloads, its access
//!   ([`owns`]). Refusals name the owner as [`owner_text`] does.
//! - A caller that does not own a model is not shown whom else it is shared with, where its
//!   weights come from, or why a load failed ([`redact_model`]).
//! - A tenant sees its own sessions, leases and usage; the admin sees everyone's
//!   ([`may_see_tenant`]).
//! - A session is used (attach, release, heartbeat) only by the caller that opened it
//!   ([`may_use_session`]).
//! - A tenant loads models for itself only; the admin for any configured tenant
//!   ([`load_owner`]).
//! - Only the admin reloads the tenants file ([`may_reload_tenants`]).
//! - A new version shares the memory of another version holding the same bytes
//!   ([`may_share_memory`]) only where that takes nothing from either: in device memory,
//!   which a worker running hostile code can write (VMM's read-only mapping is the worker's
//!   own to undo; legacy IPC mappings are writable), only between models that every caller
//!   may attach alike (one owner and one access, or both public), so no one gains a way to
//!   write the other's weights; in sealed host memory, which no worker can write, within one
//!   owner or from a model the new owner may see (public, or shared with it), or between any
//!   owners with the operator's opt-in (`share_identical = "any"`): otherwise a load that
//!   ends early would tell a tenant that someone holds those bytes.
//! - Whose inference requests a worker receives ([`worker_serves`]): a worker of the model's
//!   owner (and the admin's, or any worker when no tenants are configured) serves every tenant
//!   that may see the model; a worker of another tenant that may see it (shared or public)
//!   serves that tenant's own requests only. So a request's payload reaches the owner's
//!   workers or the requester's own, never a third tenant's.

use std::collections::BTreeSet;

use super::caller::Caller;
use super::file::TenantTable;
use super::serves::Serves;
use crate::error::CoreError;

/// Who besides its owner may see and attach a model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// Tenants it is shared with.
    pub shared_with: BTreeSet<String>,
    /// Visible to every tenant.
    pub public: bool,
}

impl Access {
    /// Whether `caller` may see a model with this access owned by `owner` ([`may_see`]).
    pub fn visible_to(&self, owner: Option<&str>, caller: &Caller) -> bool {
        may_see(owner, self, caller)
    }
}

/// Whether `caller` may see (list, describe, attach) a model owned by `owner` (`None`: the
/// admin) with `access`.
pub fn may_see(owner: Option<&str>, access: &Access, caller: &Caller) -> bool {
    match caller {
        Caller::Admin => true,
        Caller::Tenant { name, .. } => {
            access.public || owner == Some(&**name) || access.shared_with.contains(&**name)
        }
    }
}

/// Whether `caller` owns, and so may change, a model owned by `owner` (the admin owns
/// everything).
pub fn owns(owner: Option<&str>, caller: &Caller) -> bool {
    match caller {
        Caller::Admin => true,
        Caller::Tenant { name, .. } => owner == Some(&**name),
    }
}

/// How a model's owner is named in errors: `the admin` or `tenant 'x'`.
pub fn owner_text(owner: Option<&str>) -> String {
    owner.map_or_else(|| "the admin".to_owned(), |t| format!("tenant '{t}'"))
}

/// Hides from `caller`, when it does not own the model (owned by `owner`), what only the
/// owner is shown: the tenants the model is shared with other than the caller
/// (`shared_with`), and each version's source path and failure reason (`details`).
pub fn redact_model<'a>(
    owner: Option<&str>,
    shared_with: &mut Vec<String>,
    details: impl IntoIterator<Item = &'a mut String>,
    caller: &Caller,
) {
    if owns(owner, caller) {
        return;
    }
    shared_with.retain(|t| Some(t.as_str()) == caller.tenant());
    for d in details {
        d.clear();
    }
}

/// Whether `caller` may see the sessions, leases and usage of `tenant` (`None`: the admin's).
pub fn may_see_tenant(tenant: Option<&str>, caller: &Caller) -> bool {
    caller.is_admin() || tenant == caller.tenant()
}

/// Whether `caller` may use a session opened by `session_tenant` (`None`: the admin): only
/// the caller that opened it may, the admin included.
pub fn may_use_session(session_tenant: Option<&str>, caller: &Caller) -> bool {
    session_tenant == caller.tenant()
}

/// Who a load names as the model's owner: `requested` (empty: nobody, `None`), which a tenant
/// may set to itself only and the admin to any tenant `table` defines.
pub fn load_owner(
    requested: &str,
    table: &TenantTable,
    caller: &Caller,
) -> Result<Option<String>, CoreError> {
    if requested.is_empty() {
        return Ok(None);
    }
    match caller {
        Caller::Tenant { name, .. } if **name != *requested => Err(CoreError::PermissionDenied(
            format!("{} may only load models for itself", caller.describe()),
        )),
        _ if !table.tenants.contains_key(requested) => Err(CoreError::UnknownTenant(
            requested.escape_debug().to_string(),
        )),
        _ => Ok(Some(requested.to_owned())),
    }
}

/// Which loads of bytes some version already holds take that version's memory instead of
/// a copy of their own (the server's `share_identical`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum ShareIdentical {
    /// Every load has its own copy.
    Off,
    /// Between versions of one owner, and from a version the new one's owner may see.
    #[default]
    Visible,
    /// Between any owners (the operator accepts that a load's duration can tell a tenant that
    /// some other tenant holds the same bytes).
    Any,
}

/// Whether a new version owned by `owner` (`None`: the admin) with `access` may share the
/// memory of a version owned by `holder` with `holder_access`, where no worker can write that
/// memory (`immutable`: a sealed memfd) or some could (device memory). See the module's rules.
pub fn may_share_memory(
    rule: ShareIdentical,
    (owner, access): (Option<&str>, &Access),
    (holder, holder_access): (Option<&str>, &Access),
    immutable: bool,
) -> bool {
    if rule == ShareIdentical::Off {
        return false;
    }
    if !immutable {
        // Whoever may attach either may attach both: sharing gives no one a way in.
        return same_audience((owner, access), (holder, holder_access));
    }
    match rule {
        ShareIdentical::Off => false,
        ShareIdentical::Any => true,
        ShareIdentical::Visible => match owner {
            _ if owner == holder => true,
            // The admin sees every model.
            None => true,
            Some(tenant) => holder_access.public || holder_access.shared_with.contains(tenant),
        },
    }
}

/// Whether a model owned by `owner` may take `access` while memory of it is also held by a
/// model owned by `other` with `other_access`: always where no worker can write that memory
/// (`immutable`), else only if every caller would still attach both alike.
pub fn may_change_access(
    immutable: bool,
    (owner, access): (Option<&str>, &Access),
    other: (Option<&str>, &Access),
) -> bool {
    immutable || same_audience((owner, access), other)
}

/// Whether every caller may attach a model owned by `a` with its access exactly when it may
/// attach one owned by `b` with its own: one owner and one access, or both public.
pub fn same_audience(a: (Option<&str>, &Access), b: (Option<&str>, &Access)) -> bool {
    (a.1.public && b.1.public) || (a.0 == b.0 && a.1 == b.1)
}

/// Whether `caller` may reload the tenants file.
pub fn may_reload_tenants(caller: &Caller) -> bool {
    caller.is_admin()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::tenants::quota::Quota;
    use crate::tenants::token::TokenHash;

    fn tenant(name: &str) -> Caller {
        Caller::Tenant {
            name: Arc::from(name),
            quota: Quota::default(),
        }
    }

    fn access(shared_with: &[&str], public: bool) -> Access {
        Access {
            shared_with: shared_with.iter().map(|t| (*t).to_owned()).collect(),
            public,
        }
    }

    /// A tenant would see models it was not given, or lose sight of ones it was.
    #[test]
    fn a_model_is_seen_by_its_owner_its_sharers_everyone_when_public_and_the_admin() {
        let private = access(&[], false);
        let shared = access(&["b"], false);
        let public = access(&[], true);
        assert!(may_see(Some("a"), &private, &tenant("a")));
        assert!(!may_see(Some("a"), &private, &tenant("b")));
        assert!(!may_see(None, &private, &tenant("b")));
        assert!(may_see(Some("a"), &shared, &tenant("b")));
        assert!(!may_see(Some("a"), &shared, &tenant("c")));
        assert!(may_see(Some("a"), &public, &tenant("c")));
        assert!(may_see(Some("a"), &private, &Caller::Admin));
        assert_eq!(
            shared.visible_to(Some("a"), &tenant("c")),
            may_see(Some("a"), &shared, &tenant("c"))
        );
    }

    /// A tenant could change another tenant's (or the admin's) model.
    #[test]
    fn only_the_owner_and_the_admin_own_a_model() {
        assert!(owns(Some("a"), &tenant("a")));
        assert!(!owns(Some("a"), &tenant("b")));
        assert!(!owns(None, &tenant("a")));
        assert!(owns(None, &Caller::Admin));
        assert!(owns(Some("a"), &Caller::Admin));
        assert_eq!(owner_text(None), "the admin");
        assert_eq!(owner_text(Some("a")), "tenant 'a'");
    }

    /// A tenant a model is shared with would learn whom else it is shared with, its source
    /// path or its failure reasons; its owner would lose them.
    #[test]
    fn non_owners_see_a_redacted_model() {
        let fresh = || {
            (
                vec!["b".to_owned(), "c".to_owned()],
                vec!["m/model.safetensors".to_owned(), "disk full".to_owned()],
            )
        };
        let (mut shared, mut details) = fresh();
        redact_model(Some("a"), &mut shared, &mut details, &tenant("b"));
        assert_eq!(shared, vec!["b".to_owned()]);
        assert!(details.iter().all(String::is_empty));

        for owner in [tenant("a"), Caller::Admin] {
            let (mut shared, mut details) = fresh();
            redact_model(Some("a"), &mut shared, &mut details, &owner);
            assert_eq!((shared, details), fresh());
        }
    }

    /// A tenant would see another tenant's sessions or usage, or use its sessions.
    #[test]
    fn sessions_and_usage_are_seen_by_their_tenant_and_the_admin() {
        assert!(may_see_tenant(Some("a"), &tenant("a")));
        assert!(!may_see_tenant(Some("a"), &tenant("b")));
        assert!(!may_see_tenant(None, &tenant("b")));
        assert!(may_see_tenant(Some("a"), &Caller::Admin));
        assert!(may_see_tenant(None, &Caller::Admin));

        assert!(may_use_session(Some("a"), &tenant("a")));
        assert!(!may_use_session(Some("a"), &tenant("b")));
        assert!(!may_use_session(Some("a"), &Caller::Admin));
        assert!(may_use_session(None, &Caller::Admin));
    }

    /// A tenant could load a model for another tenant, or the admin for one that does not
    /// exist.
    #[test]
    fn loads_are_for_the_caller_or_by_the_admin_for_a_configured_tenant() {
        let table = TenantTable::parse(&format!(
            "[[tenants]]\nname = \"a\"\ntoken_hashes = [\"{}\"]\n",
            TokenHash::of("ta")
        ))
        .expect("table");
        assert_eq!(load_owner("", &table, &tenant("a")).expect("none"), None);
        assert_eq!(
            load_owner("a", &table, &tenant("a")).expect("itself"),
            Some("a".to_owned())
        );
        let err = load_owner("b", &table, &tenant("a")).expect_err("another tenant");
        assert_eq!(
            err.to_string(),
            "permission denied: tenant 'a' may only load models for itself"
        );
        assert_eq!(
            load_owner("a", &table, &Caller::Admin).expect("admin"),
            Some("a".to_owned())
        );
        let err = load_owner("z\n", &table, &Caller::Admin).expect_err("unknown");
        assert_eq!(err.to_string(), "unknown tenant 'z\\n'");
        assert!(may_reload_tenants(&Caller::Admin));
        assert!(!may_reload_tenants(&tenant("a")));
    }
}

/// Whose inference requests a worker of `worker` may receive for a model owned by `owner`
/// (the worker's session may see the model: it holds a lease on it).
pub fn worker_serves(owner: Option<&str>, worker: &Caller) -> Serves {
    match worker {
        Caller::Admin => Serves::Everyone,
        Caller::Tenant { name, .. } if owner == Some(&**name) => Serves::Everyone,
        Caller::Tenant { name, .. } => Serves::Only(Some(name.to_string())),
    }
}

#[cfg(test)]
mod serving_tests {
    use super::*;

    fn tenant(name: &str) -> Caller {
        Caller::Tenant {
            name: name.into(),
            quota: Default::default(),
        }
    }

    #[test]
    fn owners_workers_serve_everyone_and_others_serve_themselves() {
        assert_eq!(worker_serves(Some("a"), &tenant("a")), Serves::Everyone);
        assert_eq!(worker_serves(None, &Caller::Admin), Serves::Everyone);
        assert_eq!(worker_serves(Some("a"), &Caller::Admin), Serves::Everyone);
        assert_eq!(
            worker_serves(Some("a"), &tenant("b")),
            Serves::Only(Some("b".into()))
        );
        assert_eq!(
            worker_serves(None, &tenant("b")),
            Serves::Only(Some("b".into()))
        );
    }

    /// Memory shared where it would leak that someone holds the bytes, or give a tenant a way
    /// to write another's weights; or not shared where it safely may be.
    #[test]
    fn memory_is_shared_only_where_it_gives_no_one_anything() {
        use ShareIdentical::{Any, Off, Visible};
        let access = |shared_with: &[&str], public| Access {
            shared_with: shared_with.iter().map(|t| (*t).to_owned()).collect(),
            public,
        };
        let (private, shared_b, public) =
            (access(&[], false), access(&["b"], false), access(&[], true));
        let a = |acc| (Some("a"), acc);
        let b = |acc| (Some("b"), acc);
        let c = |acc| (Some("c"), acc);
        // Off: never.
        assert!(!may_share_memory(Off, a(&private), a(&private), true));
        assert!(!may_share_memory(Off, a(&private), a(&private), false));
        // Device memory (a worker could write it): only between equal audiences.
        assert!(may_share_memory(Visible, a(&private), a(&private), false));
        assert!(may_share_memory(Visible, b(&public), a(&public), false));
        assert!(may_share_memory(Any, b(&public), a(&public), false));
        assert!(!may_share_memory(Visible, a(&private), a(&public), false));
        assert!(!may_share_memory(Visible, b(&private), a(&public), false));
        assert!(!may_share_memory(Any, b(&private), a(&private), false));
        assert!(!may_share_memory(
            Visible,
            b(&shared_b),
            a(&shared_b),
            false
        ));
        // Sealed host memory: within an owner, from what the new owner may see, or any with the
        // opt-in.
        assert!(may_share_memory(Visible, a(&public), a(&private), true));
        assert!(!may_share_memory(Visible, b(&private), a(&private), true));
        assert!(may_share_memory(Any, b(&private), a(&private), true));
        assert!(may_share_memory(Visible, b(&private), a(&shared_b), true));
        assert!(!may_share_memory(Visible, c(&private), a(&shared_b), true));
        assert!(may_share_memory(Visible, c(&private), a(&public), true));
        // A change of access while memory is shared: free in host memory; in device memory
        // only to an audience equal to the other holder's.
        assert!(may_change_access(true, a(&public), b(&private)));
        assert!(!may_change_access(false, a(&private), b(&public)));
        assert!(may_change_access(false, a(&public), b(&public)));
        assert!(!may_change_access(false, a(&shared_b), a(&private)));
        // The admin's own model sees every model; a tenant's never the admin's private one.
        assert!(may_share_memory(
            Visible,
            (None, &private),
            a(&private),
            true
        ));
        assert!(!may_share_memory(
            Visible,
            a(&private),
            (None, &private),
            true
        ));
    }
}
