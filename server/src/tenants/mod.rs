//! Tenants: who a bearer token belongs to, what it may see and how much it may use.
pub mod token;
