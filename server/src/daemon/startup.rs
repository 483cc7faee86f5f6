//! The daemon's start-up, before anything listens: the configuration fitted to this process
//! (the model root checked, the open-file limit raised and the limits fitted to it), then the
//! devices, the metrics registry and the tenants opened into the [`App`].

use std::sync::Arc;

use tracing::{info, warn};

use super::error::ServeError;
use crate::app::App;
use crate::config::Config;
use modelshare_core::devices::Devices;
use modelshare_core::metrics::Metrics;
use modelshare_core::tenants::TenantStore;

/// The configuration as this process can serve it: refuses a missing model root, raises the
/// open-file limit to the hard limit and lowers the limits that hold descriptors to fit it.
pub(super) fn fit_config(mut config: Config) -> Result<Config, ServeError> {
    check_model_root(&config.model_root)?;
    if let Some((before, after)) = crate::accept::raise_fd_limit() {
        info!(
            before,
            after, "raised the open-file limit (soft) to the hard limit"
        );
    }
    if let Some(nofile) = crate::accept::fd_limit() {
        let config = &mut config;
        if fit_to_fd_limit(&mut config.registry, &mut config.connections, nofile) {
            warn!(
                open_file_limit = nofile,
                max_sessions = config.registry.max_sessions,
                max_tickets = config.registry.tickets.total,
                max_tickets_per_tenant = config.registry.tickets.per_tenant,
                max_connections = config.connections.max_per_listener,
                "sessions, unredeemed tickets and connections per listener lowered to a quarter \
                 of the open-file limit each (a tenant's tickets to half of those)"
            );
        }
    }
    Ok(config)
}

/// Refuses a model root that does not exist or is not a directory (every load would fail).
fn check_model_root(root: &std::path::Path) -> Result<(), ServeError> {
    let reason = match std::fs::metadata(root) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => "is not a directory".to_owned(),
        Err(e) => e.to_string(),
    };
    Err(ServeError::ModelRoot {
        path: root.display().to_string(),
        reason,
    })
}

/// Lowers the most sessions (each holds a pidfd of its worker), the most unredeemed tickets
/// (each holds a descriptor of an arena; a tenant's scaled with them, to half at most) and the
/// most connections of each listener so that each takes at most a quarter of `nofile`; the
/// rest stays for arenas, model files and the log. Returns whether it changed any.
pub fn fit_to_fd_limit(
    limits: &mut modelshare_core::registry::RegistryLimits,
    connections: &mut crate::connections::ConnLimits,
    nofile: u64,
) -> bool {
    let share = usize::try_from(nofile / 4).unwrap_or(usize::MAX).max(1);
    let before = (
        limits.max_sessions,
        limits.tickets,
        connections.max_per_listener,
    );
    limits.max_sessions = limits.max_sessions.min(share);
    // A tenant's unredeemed tickets are scaled with the total (half of it at most), so one
    // tenant cannot take them all.
    limits.tickets = limits.tickets.lowered_to(share);
    connections.max_per_listener = connections.max_per_listener.min(share);
    connections.max_per_peer = connections.max_per_peer.min(connections.max_per_listener);
    before
        != (
            limits.max_sessions,
            limits.tickets,
            connections.max_per_listener,
        )
}

/// Opens the devices, the metrics registry and the tenants, and builds the [`App`] over them.
pub(super) fn open_app(config: Arc<Config>) -> Result<App, ServeError> {
    let devices =
        Devices::open(&config.device_config()).map_err(|e| ServeError::Backend(e.to_string()))?;
    for device in devices.infos() {
        info!(backend = ?device.backend, device = %device.name, uuid = %device.uuid, "device ready");
    }
    let devices = Arc::new(devices);
    let metrics = Arc::new(Metrics::new().map_err(|e| ServeError::Metrics(e.to_string()))?);
    let tenants = Arc::new(TenantStore::open(config.tenants_file.as_deref())?);
    log_who_may_call(&config, &tenants);
    Ok(App::new(devices, config, metrics, tenants))
}

/// Says who may call the server, listener by listener: token holders (warning where tokens
/// would travel in clear text), or, without a tenants file, whoever may connect to the Unix
/// socket, reach the TCP port, or reach the HTTP port (this machine's processes on loopback).
fn log_who_may_call(config: &Config, tenants: &TenantStore) {
    if tenants.enabled() {
        let table = tenants.current();
        info!(
            tenants = table.tenants.len(),
            admin_tokens = table.admin_hashes.len(),
            "tenants loaded; every call needs a bearer token"
        );
        if config.listen.is_some() && config.tls.is_none() {
            warn!(
                "tenants are configured but the TCP listener has no TLS: tokens travel in clear text"
            );
        }
    } else {
        // What is open to whom, listener by listener: without tokens, whoever reaches one is
        // the admin.
        if let Some(path) = &config.unix_socket {
            info!(
                unix = %path.display(),
                mode = ?config.unix_socket_mode.map(|m| format!("{m:o}")),
                "no tenants file: whoever may connect to the Unix socket is the admin"
            );
        }
        if let Some(addr) = config.listen {
            warn!(
                tcp = %addr,
                "no tenants file and --unauthenticated-tcp: every caller who reaches the gRPC TCP port is the admin"
            );
        }
        if let Some(addr) = config.http_listen {
            if addr.ip().is_loopback() {
                info!(
                    http = %addr,
                    "no tenants file: every process on this machine that reaches the HTTP port is the admin"
                );
            } else {
                warn!(
                    http = %addr,
                    "no tenants file and --unauthenticated-tcp: every caller who reaches the HTTP port is the admin"
                );
            }
        }
    }
    if config.tenants_file.is_some()
        && config.tls.is_none()
        && let Some(addr) = config.http_listen
    {
        warn!(
            http = %addr,
            "the HTTP port has no TLS: the bearer tokens of /v1 and /v2 calls travel in clear text (give --server-tls-cert and --server-tls-key for HTTPS, or keep it on a private network)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use modelshare_core::registry::RegistryLimits;

    #[test]
    fn sessions_tickets_and_connections_fit_a_low_descriptor_limit() {
        let mut limits = RegistryLimits::default();
        let mut conns = crate::connections::ConnLimits::default();
        assert!(
            !fit_to_fd_limit(&mut limits, &mut conns, 1 << 20),
            "room for the defaults"
        );
        assert!(
            fit_to_fd_limit(&mut limits, &mut conns, 1024),
            "the defaults exceed a quarter of 1024 each"
        );
        assert_eq!((limits.max_sessions, limits.tickets.total), (256, 256));
        assert_eq!(
            limits.tickets.per_tenant, 128,
            "a tenant's ticket cap is scaled with the total: half of it"
        );
        assert_eq!((conns.max_per_listener, conns.max_per_peer), (256, 256));
    }
}
