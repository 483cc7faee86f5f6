//! `GET /metrics`: the gauges are set from the registry as it is now, then every metric is
//! encoded as Prometheus text.

use axum::extract::State;
use axum::http::StatusCode;

use super::state::HttpState;
use crate::metrics::{ArenaBytes, DeviceMemory, GaugeValues, TenantGauges};
use crate::registry::Registry;
use crate::tenants::Caller;

/// `GET /metrics`.
pub async fn metrics(
    State(s): State<HttpState>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    s.metrics.refresh(&gauge_values(&s.registry));
    (
        StatusCode::OK,
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        s.metrics.encode(),
    )
}

/// The gauges' values, read from `registry` as the admin sees it (every model, every
/// session). Per-device values are labelled with the device's UUID.
pub fn gauge_values(registry: &Registry) -> GaugeValues {
    let stats = registry.stats(&Caller::Admin);
    let device = stats.device.uuid.clone();
    let arena_bytes = registry
        .list(&Caller::Admin)
        .into_iter()
        .filter_map(|m| {
            let bytes: u64 = m
                .versions
                .iter()
                .filter(|v| v.state.holds_arena())
                .map(|v| v.arena_bytes)
                .sum();
            (bytes > 0).then(|| ArenaBytes {
                model: m.name,
                device: device.clone(),
                bytes,
            })
        })
        .collect();
    let tenants = registry
        .sessions_by_tenant()
        .into_iter()
        .map(|(tenant, sessions, leases)| TenantGauges {
            tenant: tenant.unwrap_or_default(),
            sessions,
            leases,
        })
        .collect();
    GaugeValues {
        versions_by_state: stats
            .versions_by_state
            .iter()
            .map(|(state, n)| (state.as_str(), *n))
            .collect(),
        arena_bytes,
        models: stats.models,
        tenants,
        devices: vec![DeviceMemory {
            total_bytes: stats.device.total_bytes,
            used_bytes: stats.device_used_bytes.unwrap_or(stats.arena_bytes),
            device,
        }],
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use modelshare_device::HostBackend;

    use super::*;
    use crate::registry::RegistryLimits;

    /// The scrape of an empty registry would miss a state, invent series, or lose the device.
    #[test]
    fn an_empty_registry_has_every_state_at_zero_and_its_device() {
        let registry = Registry::new(Arc::new(HostBackend::new()), RegistryLimits::default());
        let v = gauge_values(&registry);
        assert_eq!(
            v.versions_by_state,
            ["loading", "ready", "draining", "freed", "failed"]
                .iter()
                .map(|s| (*s, 0))
                .collect::<Vec<_>>()
        );
        assert!(v.arena_bytes.is_empty() && v.tenants.is_empty());
        assert_eq!(v.models, 0);
        assert_eq!(v.devices.len(), 1);
        assert_eq!(v.devices[0].device, "host");
        assert_eq!(v.devices[0].used_bytes, 0, "host: arena bytes, none held");
        assert_eq!(v.devices[0].total_bytes, registry.device().total_bytes);
    }
}
