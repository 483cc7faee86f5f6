//! `GET /metrics`: the gauges are set from the registry as it is now, then every metric is
//! encoded as Prometheus text.

use axum::extract::State;
use axum::http::StatusCode;

use super::state::HttpState;
use modelshare_core::devices::Devices;
use modelshare_core::held::HeldStore;
use modelshare_core::metrics::{ArenaBytes, DeviceMemory, GaugeValues, TenantGauges};
use modelshare_core::registry::Registry;
use modelshare_core::tenants::Caller;

/// `GET /metrics`.
pub async fn metrics(
    State(s): State<HttpState>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let app = &s.app;
    app.host
        .metrics
        .refresh(&gauge_values(&app.host.registry, &app.host.devices, &app.host.held).await);
    (
        StatusCode::OK,
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        app.host.metrics.encode(),
    )
}

/// The gauges' values, read from `registry` as the admin sees it (every model, every
/// session) and from each device's thread (its memory; a busy device gives its last figure).
/// Per-device values are labelled with the device's UUID.
pub async fn gauge_values(registry: &Registry, devices: &Devices, held: &HeldStore) -> GaugeValues {
    let stats = registry.stats(&Caller::Admin);
    let mut arena_bytes = Vec::new();
    // On each device, an arena several versions share counts once.
    let held_by_device = registry.bytes_by_device();
    for m in registry.list(&Caller::Admin) {
        let mut by_device: std::collections::BTreeMap<String, u64> = Default::default();
        for v in m.versions.iter().filter(|v| v.state.holds_arena()) {
            *by_device.entry(v.device.clone()).or_default() += v.arena_bytes;
            for (replica, _) in &v.replicas {
                *by_device.entry(replica.clone()).or_default() += v.arena_bytes;
            }
        }
        for (device, bytes) in by_device.into_iter().filter(|(_, b)| *b > 0) {
            arena_bytes.push(ArenaBytes {
                model: m.name.clone(),
                device,
                bytes,
            });
        }
    }
    let tenants = registry
        .sessions_by_tenant()
        .into_iter()
        .map(|(tenant, sessions, leases)| TenantGauges {
            tenant: tenant.unwrap_or_else(|| modelshare_core::metrics::ADMIN_TENANT.to_owned()),
            sessions,
            leases,
        })
        .collect();
    let mut memory = Vec::new();
    for info in devices.infos() {
        let used = devices.used_bytes(&info.uuid).await;
        let held = held_by_device.get(&info.uuid).copied().unwrap_or(0);
        memory.push(DeviceMemory {
            handles: crate::convert::handles_name(info.backend),
            total_bytes: info.total_bytes,
            // Where the device reports none (host memory), what the arenas hold on it.
            used_bytes: used.unwrap_or(held),
            device: info.uuid,
        });
    }
    GaugeValues {
        versions_by_state: stats
            .versions_by_state
            .iter()
            .map(|(state, n)| (state.as_str(), *n))
            .collect(),
        arena_bytes,
        models: stats.models,
        tenants,
        devices: memory,
        held_by_workers: held_by_workers(held, registry),
    }
}

/// Memory only workers may hold now, per model and device: versions from before a restart not
/// yet adopted, and versions force-unloaded while their workers live.
fn held_by_workers(held: &HeldStore, registry: &Registry) -> Vec<ArenaBytes> {
    let mut sums: std::collections::BTreeMap<(String, String), u64> = Default::default();
    for p in held.pending() {
        *sums.entry((p.model, p.device)).or_default() += p.bytes;
    }
    for o in registry.orphans() {
        *sums.entry((o.model, o.device)).or_default() += o.bytes;
    }
    sums.into_iter()
        .map(|((model, device), bytes)| ArenaBytes {
            model,
            device,
            bytes,
        })
        .collect()
}

#[cfg(test)]
mod tests {

    use modelshare_device::HostBackend;

    use super::*;
    use modelshare_core::registry::RegistryLimits;

    /// The scrape of an empty registry would miss a state, invent series, or lose the device.
    #[tokio::test]
    async fn an_empty_registry_has_every_state_at_zero_and_its_device() {
        let registry = Registry::new(RegistryLimits::default());
        let devices = Devices::single(HostBackend::thread().expect("host device"));
        let v = gauge_values(&registry, &devices, &HeldStore::disabled()).await;
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
        assert_eq!(
            v.devices[0].total_bytes,
            devices.primary().info().total_bytes
        );
    }
}
