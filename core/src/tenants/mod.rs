//! Tenants: who a bearer token belongs to, what it may see and how much it may use.
//!
//! - [`caller`]: [`Caller`], who is calling (the admin, or a tenant and its quota).
//! - [`quota`]: [`Quota`] and the [`Resource`]s it limits, and the check a limited call makes.
//! - [`policy`]: every decision about who may see or do what (models, sessions, usage, loads),
//!   as free functions, and a model's [`Access`]. The rules are listed at its top.
//! - [`token`]: token generation, hashing and constant-time checking.
//! - [`file`](mod@file): the tenants file (TOML): tenants, their token hashes, uids and quotas; the admin
//!   tokens. Parsed and validated into a [`TenantTable`]; [`crate::error::TenantsFileError`] says why one
//!   was refused.
//! - [`store`]: the table in force, swapped whole on reload (SIGHUP or `ReloadTenants`), and the
//!   per-tenant in-flight counters that outlive reloads.
//! - [`serves`]: whose requests a worker may receive ([`Serves`]).
//!
//! This file only re-exports: the children import each other, never their parent.
//!
//! Without a tenants file every caller is [`Caller::Admin`]: authentication is off, as it was
//! before tenants existed (the server logs a warning).

pub mod caller;
pub mod file;
pub mod policy;
pub mod quota;
pub mod serves;
pub mod store;
pub mod token;

pub use caller::Caller;
pub use file::{TenantSpec, TenantTable};
pub use policy::{Access, owns};
pub use quota::{Quota, Resource};
pub use serves::Serves;
pub use store::TenantStore;
