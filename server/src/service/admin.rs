//! `modelshare.v1.AdminService`: load, unload and inspect models.
//!
//! Every call runs as the [`Caller`] the authentication layer admitted: a tenant sees only the
//! models it may see (others are NOT_FOUND), changes only the models it owns, and sees only its
//! own sessions and usage. Loads, unloads, access changes and reloads go to the audit log.

use crate::status::OrStatus;
use std::pin::Pin;
use std::time::Duration;

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_server::AdminService;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::app::App;
use crate::audit;
use crate::auth::caller_of;
use crate::convert;
use modelshare_core::error::CoreError;
use modelshare_core::registry::LoadFor;
use modelshare_core::tenants::Caller;
use modelshare_core::tenants::policy;

/// How often a load's progress is reported.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// The admin service.
#[derive(Debug, Clone)]
pub struct AdminApi {
    app: App,
}

impl AdminApi {
    /// The service over `app`.
    pub fn new(app: App) -> Self {
        Self { app }
    }

    /// Who a load is for: the tenant named (an admin may name any configured tenant, a tenant
    /// only itself) or the caller's own; and the access asked for.
    fn load_for(&self, caller: &Caller, req: &pb::LoadModelRequest) -> Result<LoadFor, CoreError> {
        let table = self.app.host.tenants.current();
        let requested_owner = policy::load_owner(&req.tenant, &table, caller)?;
        let access = req
            .access
            .clone()
            .map(|a| convert::access_from(a, &table))
            .transpose()?;
        Ok(LoadFor {
            requested_owner,
            default_owner: caller.tenant().map(str::to_owned),
            access,
            resume_version: None,
            only_adopted: false,
            placement: modelshare_core::placement::Wanted {
                devices: req.devices.clone(),
                replicas: req.replicas,
            },
        })
    }
}

type ProgressStream = Pin<Box<dyn Stream<Item = Result<pb::LoadModelProgress, Status>> + Send>>;

fn progress(event: pb::load_model_progress::Event) -> Result<pb::LoadModelProgress, Status> {
    Ok(pb::LoadModelProgress { event: Some(event) })
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    type LoadModelStream = ProgressStream;

    async fn load_model(
        &self,
        request: Request<pb::LoadModelRequest>,
    ) -> Result<Response<Self::LoadModelStream>, Status> {
        let caller = caller_of(&request).or_status()?;
        let req = request.into_inner();
        let started = match self.load_for(&caller, &req) {
            Ok(load_for) => {
                self.app
                    .host
                    .start_load(&caller, load_for, &req.name, &req.path, req.keep_previous)
                    .await
            }
            Err(e) => Err(e),
        }
        .map_err(|e| self.app.refuse(e));
        audit::record(
            &caller,
            "load",
            &req.name,
            started.as_ref().map_or(0, |l| l.version),
            &started,
        );
        let mut load = started?;
        let (tx, rx) = mpsc::channel(8);
        let started = pb::load_model_progress::Event::Started(pb::LoadStarted {
            version: load.version,
            bytes_total: load.bytes_total,
            tensor_count: load.tensor_count,
        });
        // The channel is empty and has room: this cannot fail.
        let _ = tx.try_send(progress(started));
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(PROGRESS_EVERY);
            let mut last = u64::MAX;
            loop {
                tokio::select! {
                    outcome = &mut load.done => {
                        let msg = match outcome {
                            Ok(Ok(v)) => progress(pb::load_model_progress::Event::Done(convert::version(&v))),
                            Ok(Err(e)) => Err(crate::status::from_core(e)),
                            Err(_) => Err(Status::internal("the load task ended without a result")),
                        };
                        let _ = tx.send(msg).await;
                        return;
                    }
                    _ = ticker.tick() => {
                        let done = load.progress.done.load(std::sync::atomic::Ordering::Relaxed);
                        if done != last {
                            last = done;
                            let event = pb::load_model_progress::Event::Progress(pb::LoadBytes {
                                bytes_done: done,
                                bytes_total: load.bytes_total,
                            });
                            // A caller that went away stops the reports, not the load.
                            if tx.send(progress(event)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn unload_model(
        &self,
        request: Request<pb::UnloadModelRequest>,
    ) -> Result<Response<pb::UnloadModelResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        let mut req = request.into_inner();
        req.name = self.app.host.registry.canonical(&caller, &req.name);
        let version = (req.version != 0).then_some(req.version);
        let result = self
            .app
            .host
            .registry
            .unload(&caller, &req.name, version, req.force)
            .map_err(|e| self.app.refuse(e));
        audit::record(&caller, "unload", &req.name, req.version, &result);
        let (versions, generation) = result?;
        tracing::info!(model = %req.name, version = req.version, force = req.force, "unload");
        let draining: Vec<u32> = versions
            .iter()
            .filter(|v| v.state == modelshare_core::model::VersionState::Draining)
            .map(|v| v.version)
            .collect();
        if req.drain_timeout_ms > 0 && !draining.is_empty() {
            let deadline = Duration::from_millis(u64::from(req.drain_timeout_ms));
            self.app.host.timer.schedule(
                tokio::time::Instant::now() + deadline,
                modelshare_core::timer::Expiry::Drain {
                    model: req.name.clone(),
                    generation,
                    versions: draining,
                },
            );
        }
        Ok(Response::new(pb::UnloadModelResponse {
            versions: versions.iter().map(convert::version).collect(),
        }))
    }

    async fn list_models(
        &self,
        request: Request<pb::ListModelsRequest>,
    ) -> Result<Response<pb::ListModelsResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        let models = self.app.host.registry.list(&caller);
        Ok(Response::new(pb::ListModelsResponse {
            models: models
                .iter()
                .map(|m| convert::model_for(&caller, m))
                .collect(),
        }))
    }

    async fn describe_model(
        &self,
        request: Request<pb::DescribeModelRequest>,
    ) -> Result<Response<pb::DescribeModelResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        let mut req = request.into_inner();
        req.name = self.app.host.registry.canonical(&caller, &req.name);
        let (model, manifest) = self
            .app
            .host
            .registry
            .describe(&caller, &req.name, req.version)
            .or_status()?;
        // The device of the version described (its first arena's), else the server's first.
        let on = manifest.as_ref().and_then(|m| {
            model
                .versions
                .iter()
                .find(|v| v.version == m.version)
                .and_then(|v| self.app.host.devices.get(&v.device))
        });
        let device = on.unwrap_or_else(|| self.app.host.devices.primary());
        Ok(Response::new(pb::DescribeModelResponse {
            model: Some(convert::model_for(&caller, &model)),
            manifest: manifest.map(|m| convert::manifest(&m)),
            device: Some(convert::device(device.info())),
        }))
    }

    async fn get_stats(
        &self,
        request: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::GetStatsResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        let registry = &self.app.host.registry;
        // The registry's figures (no device call), then the device's own, from its thread.
        let stats = registry.stats(&caller);
        let device = self.app.host.devices.primary();
        let used = self.app.host.devices.used_bytes(device.uuid()).await;
        let mut reply = convert::stats(&stats, device.info(), used);
        let by_device = registry.by_device();
        for d in self.app.host.devices.threads() {
            let used = if d.uuid() == device.uuid() {
                used
            } else {
                self.app.host.devices.used_bytes(d.uuid()).await
            };
            // What other tenants hold where is the admin's to see.
            let held = if caller.is_admin() {
                by_device.get(d.uuid()).copied().unwrap_or_default()
            } else {
                Default::default()
            };
            reply.devices.push(pb::DeviceStats {
                device: Some(convert::device(d.info())),
                // Where the device reports none (host memory), what the arenas hold on it, as
                // the proto says and as `modelshare_device_memory_used_bytes` counts.
                used_bytes: used.unwrap_or(held.arena_bytes),
                arena_bytes: held.arena_bytes,
                arenas: held.arenas,
                leases: held.leases,
                max_arena_bytes: self.app.config.max_device_bytes.unwrap_or(0),
            });
        }
        let serving = self.app.engine.snapshot().await;
        reply.serving = serving
            .models
            .iter()
            .filter(|m| registry.visible(&caller, &m.model))
            .map(convert::model_serving)
            .collect();
        let own = caller.tenant().map(str::to_owned);
        let outstanding = if caller.is_admin() {
            serving.outstanding
        } else {
            serving.outstanding_for(&own)
        };
        reply.requests_outstanding = u32::try_from(outstanding).unwrap_or(u32::MAX);
        if caller.is_admin() {
            let orphaned: u64 = registry.orphans().iter().map(|o| o.bytes).sum();
            reply.held_by_workers_bytes = self.app.host.held.held_by_workers_bytes() + orphaned;
        }
        let table = self.app.host.tenants.current();
        reply.tenants = table
            .tenants
            .values()
            .filter(|t| policy::may_see_tenant(Some(&t.name), &caller))
            .map(|t| {
                convert::tenant_usage(
                    &t.name,
                    registry.usage(&t.name),
                    self.app.host.tenants.inflight(&t.name),
                    serving.outstanding_for(&Some(t.name.clone())),
                    t.quota,
                )
            })
            .collect();
        Ok(Response::new(reply))
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        let sessions = self.app.host.registry.sessions(&caller);
        let serving = self.app.engine.snapshot().await;
        let sessions = sessions
            .iter()
            .map(|s| {
                let mut info = convert::session(s);
                info.serving = serving
                    .workers
                    .iter()
                    .filter(|w| w.session_id == s.id)
                    .map(convert::serve_stream)
                    .collect();
                info
            })
            .collect();
        Ok(Response::new(pb::ListSessionsResponse { sessions }))
    }

    async fn set_model_access(
        &self,
        request: Request<pb::SetModelAccessRequest>,
    ) -> Result<Response<pb::SetModelAccessResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        let mut req = request.into_inner();
        req.name = self.app.host.registry.canonical(&caller, &req.name);
        let table = self.app.host.tenants.current();
        let result = convert::access_from(req.access.unwrap_or_default(), &table)
            .and_then(|access| {
                self.app
                    .host
                    .registry
                    .set_access(&caller, &req.name, access)
            })
            .map_err(|e| self.app.refuse(e));
        audit::record(&caller, "set_access", &req.name, 0, &result);
        Ok(Response::new(pb::SetModelAccessResponse {
            model: Some(convert::model_for(&caller, &result?)),
        }))
    }

    async fn reload_tenants(
        &self,
        request: Request<pb::ReloadTenantsRequest>,
    ) -> Result<Response<pb::ReloadTenantsResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        if !caller.is_admin() {
            let status = crate::status::from_core(CoreError::PermissionDenied(
                "only an admin may reload the tenants".into(),
            ));
            audit::record::<()>(&caller, "reload_tenants", "", 0, &Err(status.clone()));
            return Err(status);
        }
        let table = self.app.reload_tenants("rpc").or_status()?;
        Ok(Response::new(pb::ReloadTenantsResponse {
            tenants: table.tenants.keys().cloned().collect(),
            admin_tokens: u32::try_from(table.admin_hashes.len()).unwrap_or(u32::MAX),
        }))
    }
}
