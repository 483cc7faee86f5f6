//! `modelshare.v1.AdminService`: load, unload and inspect models.

use std::pin::Pin;
use std::time::Duration;

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_server::AdminService;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::convert;
use crate::app::App;

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
        let req = request.into_inner();
        let mut load = self
            .app
            .start_load(&req.name, &req.path, req.keep_previous)
            .await?;
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
                            Ok(Err(e)) => Err(Status::from(e)),
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
        let req = request.into_inner();
        let version = (req.version != 0).then_some(req.version);
        let registry = self.app.registry.clone();
        let versions = registry.unload(&req.name, version, req.force)?;
        tracing::info!(model = %req.name, version = req.version, force = req.force, "unload");
        let draining: Vec<u32> = versions
            .iter()
            .filter(|v| v.state == crate::model::VersionState::Draining)
            .map(|v| v.version)
            .collect();
        if req.drain_timeout_ms > 0 && !draining.is_empty() {
            let deadline = Duration::from_millis(u64::from(req.drain_timeout_ms));
            let name = req.name.clone();
            let stop = self.app.shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(deadline) => {
                        let ended = registry.force_drained(&name, &draining);
                        if ended > 0 {
                            tracing::warn!(model = %name, sessions = ended, "drain deadline passed; ended the sessions still holding the model");
                        }
                    }
                    () = stop.cancelled() => {}
                }
            });
        }
        Ok(Response::new(pb::UnloadModelResponse {
            versions: versions.iter().map(convert::version).collect(),
        }))
    }

    async fn list_models(
        &self,
        _request: Request<pb::ListModelsRequest>,
    ) -> Result<Response<pb::ListModelsResponse>, Status> {
        let models = self.app.registry.list();
        Ok(Response::new(pb::ListModelsResponse {
            models: models.iter().map(convert::model).collect(),
        }))
    }

    async fn describe_model(
        &self,
        request: Request<pb::DescribeModelRequest>,
    ) -> Result<Response<pb::DescribeModelResponse>, Status> {
        let req = request.into_inner();
        let (model, manifest) = self.app.registry.describe(&req.name, req.version)?;
        Ok(Response::new(pb::DescribeModelResponse {
            model: Some(convert::model(&model)),
            manifest: manifest.map(|m| convert::manifest(&m)),
        }))
    }

    async fn get_stats(
        &self,
        _request: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::GetStatsResponse>, Status> {
        Ok(Response::new(convert::stats(&self.app.registry.stats())))
    }

    async fn list_sessions(
        &self,
        _request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let sessions = self.app.registry.sessions();
        Ok(Response::new(pb::ListSessionsResponse {
            sessions: sessions.iter().map(convert::session).collect(),
        }))
    }

    async fn set_model_access(
        &self,
        _request: Request<pb::SetModelAccessRequest>,
    ) -> Result<Response<pb::SetModelAccessResponse>, Status> {
        Err(Status::unimplemented("in progress"))
    }

    async fn reload_tenants(
        &self,
        _request: Request<pb::ReloadTenantsRequest>,
    ) -> Result<Response<pb::ReloadTenantsResponse>, Status> {
        Err(Status::unimplemented("in progress"))
    }
}
