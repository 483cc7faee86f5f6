//! [`App`]: what every door shares: the model host, the request path, the live worker
//! sessions, and the doors' own bounds (the CPU pool, the body budget).

use std::sync::Arc;

use modelshare_core::error::CoreError;
use modelshare_core::host::Host;
use modelshare_core::metrics::Metrics;
use modelshare_core::tenants::{TenantStore, TenantTable};
use modelshare_serving::{Engine, EngineConfig, Limits};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::bodies::BodyBudget;
use crate::config::Config;
use crate::cpu::CpuPool;
use crate::hub::Hub;

/// State shared by the doors. Cheap to clone.
#[derive(Debug, Clone)]
pub struct App {
    /// The model host: devices, registry, tenants, held memory, timer, metrics.
    pub host: Host,
    /// Live worker sessions.
    pub hub: Arc<Hub>,
    /// The whole configuration.
    pub config: Arc<Config>,
    /// The request path: queues, batches, Serve streams.
    pub engine: Engine,
    /// The bounded pool for requests' CPU-heavy work (parsing, conversion), off the runtime.
    pub cpu: CpuPool,
    /// Request-body bytes being received at once over every door.
    pub bodies: BodyBudget,
}

/// The request path's settings, from the configuration and the tenants' weights.
fn engine_config(config: &Config, tenants: &TenantStore) -> EngineConfig {
    let serving = &config.serving;
    EngineConfig {
        limits: Limits {
            max_queue_items: serving.max_queue_items,
            max_tenant_requests: serving.max_tenant_requests,
            max_queue_delay: serving.max_queue_delay,
            quantum: 1,
            cancel_grace: serving.cancel_grace,
        },
        queue_delays: serving.queue_delays.clone(),
        tenant_weights: tenants
            .current()
            .tenants
            .values()
            .map(|t| (t.name.clone(), t.weight))
            .collect(),
        no_worker_wait: serving.no_worker_wait,
        mailbox: modelshare_serving::MAILBOX,
        stream_window: modelshare_serving::STREAM_WINDOW,
        gpu_sharing: serving.gpu_sharing,
    }
}

impl App {
    /// Application state over `devices`, with an empty registry.
    pub fn new(
        devices: Arc<modelshare_core::devices::Devices>,
        config: Arc<Config>,
        metrics: Arc<Metrics>,
        tenants: Arc<TenantStore>,
    ) -> Self {
        let shutdown = CancellationToken::new();
        let engine = Engine::start(
            engine_config(&config, &tenants),
            metrics.clone(),
            shutdown.clone(),
        );
        let host = Host::new(devices, config.host_config(), metrics, tenants, shutdown);
        Self {
            host,
            engine,
            hub: Arc::new(Hub::new()),
            cpu: CpuPool::for_this_machine(),
            bodies: BodyBudget::new(config.serving.max_body_bytes_in_flight),
            config,
        }
    }

    /// Turns a refusal into its status, counting quota refusals.
    pub fn refuse(&self, e: CoreError) -> tonic::Status {
        self.host.count_refusal(&e);
        crate::status::from_core(e)
    }

    /// Reads the tenants file again (SIGHUP or `ReloadTenants`); on error the old tenants stay.
    /// The request path's fair queues take the new weights.
    pub fn reload_tenants(&self, trigger: &str) -> Result<Arc<TenantTable>, CoreError> {
        let result = self
            .host
            .tenants
            .reload()
            .map_err(CoreError::from)
            .and_then(|t| t.ok_or(CoreError::NoTenantsFile));
        match &result {
            Ok(table) => {
                info!(
                    trigger,
                    tenants = table.tenants.len(),
                    admin_tokens = table.admin_hashes.len(),
                    "tenants reloaded"
                );
                crate::audit::tenants_reloaded(trigger, Ok(table.tenants.len()));
                self.engine.set_tenant_weights(
                    table
                        .tenants
                        .values()
                        .map(|t| (t.name.clone(), t.weight))
                        .collect(),
                );
            }
            Err(e) => {
                warn!(trigger, error = %e, "tenants not reloaded; the previous tenants stay in force");
                crate::audit::tenants_reloaded(trigger, Err(&e.to_string()));
            }
        }
        result
    }
}
