//! The `[limits]` table and its flags: loads at once, the registry's bytes, sessions, leases
//! and tickets, each listener's connections, and the weight files' headers.

use std::time::Duration;

use super::args::ServeArgs;
use super::error::ConfigError;
use super::file::FileLimits;
use crate::connections::ConnLimits;
use modelshare_core::registry::{RegistryLimits, TicketLimits};
use modelshare_core::weights::WeightLimits;

/// Loads allowed at once: the flag's, else the file's, else 4; at least 1.
pub(super) fn max_concurrent_loads(
    args: &ServeArgs,
    limits: &FileLimits,
) -> Result<usize, ConfigError> {
    let max_concurrent_loads = args
        .max_concurrent_loads
        .or(limits.max_concurrent_loads)
        .unwrap_or(4);
    if max_concurrent_loads == 0 {
        return Err(ConfigError::Invalid(
            "max_concurrent_loads must be at least 1".into(),
        ));
    }
    Ok(max_concurrent_loads)
}

/// Refuses a connection cap or timeout of 0.
pub(super) fn check_connections(limits: &FileLimits) -> Result<(), ConfigError> {
    for (key, value) in [
        ("max_connections", limits.max_connections.map(|v| v as u64)),
        (
            "max_connections_per_peer",
            limits.max_connections_per_peer.map(|v| v as u64),
        ),
        (
            "connection_handshake_timeout_ms",
            limits.connection_handshake_timeout_ms,
        ),
        (
            "connection_idle_timeout_ms",
            limits.connection_idle_timeout_ms,
        ),
    ] {
        if value == Some(0) {
            return Err(ConfigError::Invalid(format!(
                "[limits] {key} must be at least 1"
            )));
        }
    }
    Ok(())
}

/// The registry's limits: the flags' bytes over the file's, the file's counts over the
/// defaults; `max_device_bytes` as the devices' merge checked it.
pub(super) fn registry(
    args: &ServeArgs,
    limits: &FileLimits,
    max_device_bytes: Option<u64>,
) -> RegistryLimits {
    let defaults = RegistryLimits::default();
    RegistryLimits {
        max_model_bytes: args.max_model_bytes.or(limits.max_model_bytes),
        max_total_bytes: args.max_total_bytes.or(limits.max_total_bytes),
        max_device_bytes,
        max_sessions: limits.max_sessions.unwrap_or(defaults.max_sessions),
        max_leases_per_session: limits
            .max_leases_per_session
            .unwrap_or(defaults.max_leases_per_session),
        tickets: TicketLimits {
            per_session: limits
                .max_tickets_per_session
                .unwrap_or(defaults.tickets.per_session),
            per_tenant: limits
                .max_tickets_per_tenant
                .unwrap_or(defaults.tickets.per_tenant),
            total: limits.max_tickets.unwrap_or(defaults.tickets.total),
        },
    }
}

/// Each listener's connection caps and timeouts: the file's over the defaults (checked by
/// [`check_connections`]).
pub(super) fn connections(limits: &FileLimits) -> ConnLimits {
    let d = ConnLimits::default();
    let ms = |v: Option<u64>, default: Duration| v.map_or(default, Duration::from_millis);
    ConnLimits {
        max_per_listener: limits.max_connections.unwrap_or(d.max_per_listener),
        max_per_peer: limits.max_connections_per_peer.unwrap_or(d.max_per_peer),
        handshake: ms(limits.connection_handshake_timeout_ms, d.handshake),
        idle: ms(limits.connection_idle_timeout_ms, d.idle),
    }
}

/// The limits on weight files: the file's over the defaults.
pub(super) fn weights(limits: &FileLimits) -> WeightLimits {
    let weight_defaults = WeightLimits::default();
    WeightLimits {
        max_header_bytes: limits
            .max_header_bytes
            .unwrap_or(weight_defaults.max_header_bytes),
        max_tensors: limits.max_tensors.unwrap_or(weight_defaults.max_tensors),
        max_shards: limits.max_shards.unwrap_or(weight_defaults.max_shards),
        max_header_metadata_bytes: limits
            .max_header_metadata_bytes
            .unwrap_or(weight_defaults.max_header_metadata_bytes),
        ..weight_defaults
    }
}
