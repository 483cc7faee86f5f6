//! [`Caller`]: who is calling, as the authentication layer admitted it.

use std::sync::Arc;

use super::quota::Quota;

/// Who is calling: the admin, or a tenant (with its quota as it stood when the call arrived).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// An admin token, or any caller when no tenants are configured: sees and may do everything.
    Admin,
    /// A tenant's token.
    Tenant {
        /// Tenant name.
        name: Arc<str>,
        /// Its quota.
        quota: Quota,
    },
}

impl Caller {
    /// The tenant's name (`None` for the admin).
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Caller::Admin => None,
            Caller::Tenant { name, .. } => Some(name),
        }
    }

    /// Whether this is the admin.
    pub fn is_admin(&self) -> bool {
        matches!(self, Caller::Admin)
    }

    /// How the caller is named in logs and errors: `admin` or `tenant 'x'`.
    pub fn describe(&self) -> String {
        match self {
            Caller::Admin => "admin".into(),
            Caller::Tenant { name, .. } => format!("tenant '{name}'"),
        }
    }
}
