//! `modelshare.v1.WorkerService`: sessions, attach and release — a thin adapter over the
//! sessions hub ([`crate::sessions`]) and the registry — and Serve ([`super::serve`]).
//!
//! A session lives as long as its stream: it ends when the worker closes it, when the
//! connection breaks (the worker exited or was killed: the kernel closes its socket), after
//! `heartbeat_misses` heartbeat intervals without a message, or at shutdown. Ending a session
//! releases every lease it held.

use crate::status::OrStatus;
use std::pin::Pin;

use modelshare_device::{DeviceThread, PeerWatch};
use modelshare_proto::v1 as pb;
use modelshare_proto::v1::worker_service_server::WorkerService;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::debug;

use crate::app::App;
use crate::audit;
use crate::convert;
use modelshare_core::error::{CoreError, NotOnDevice};

use crate::auth::{caller_of, peer_uid};
use modelshare_core::tenants::Caller;
use modelshare_core::timer::Expiry;

/// The worker service.
#[derive(Debug, Clone)]
pub struct WorkerApi {
    app: App,
}

impl WorkerApi {
    /// A model not found (or without a ready version) that the server is bringing back from
    /// memory workers kept is `Restoring` (UNAVAILABLE: retry), not NOT_FOUND; so is one that
    /// became attachable since the refusal (the restore finished in between).
    fn restoring_or(&self, caller: &Caller, model: &str, version: u32, e: CoreError) -> CoreError {
        let absent = matches!(
            e,
            CoreError::ModelNotFound(_)
                | CoreError::VersionNotFound { .. }
                | CoreError::NoReadyVersion(_)
        );
        if absent
            && self.app.host.held.pending_of(model).iter().any(|r| {
                (version == 0 || r.version == version)
                    && modelshare_core::tenants::policy::may_see(
                        r.owner.as_deref(),
                        &r.access(),
                        caller,
                    )
            })
        {
            return CoreError::Restoring(model.to_owned());
        }
        // Brought back between the refusal and this check: asking again will find it.
        if absent
            && self
                .app
                .host
                .registry
                .attachable_now(caller, model, version)
        {
            return CoreError::Restoring(model.to_owned());
        }
        e
    }

    /// `replicate_on_attach`: the refusal of a worker whose device holds no copy of the
    /// version (`not`). A copy started there (or under way, or to follow the load) is
    /// `Replicating` (UNAVAILABLE: retry); no copy (the version is ending) leaves `not`; a copy
    /// that does not fit says why (RESOURCE_EXHAUSTED).
    async fn replicate_for(
        &self,
        caller: &Caller,
        target: &DeviceThread,
        not: NotOnDevice,
    ) -> CoreError {
        let quota_of = |t: &str| self.app.host.tenants.quota_of(t).unwrap_or_default();
        let server = modelshare_core::replicate::Replicator {
            registry: &self.app.host.registry,
            metrics: &self.app.host.metrics,
            devices: &self.app.host.devices,
            quota_of: &quota_of,
        };
        match modelshare_core::replicate::for_worker(
            &server,
            caller,
            &not.model,
            not.version,
            target,
        )
        .await
        {
            Ok(true) => CoreError::Replicating {
                model: not.model,
                version: not.version,
                device: not.wanted,
            },
            Ok(false) => CoreError::NotOnDevice(Box::new(not)),
            Err(e) => e,
        }
    }

    /// The service over `app`.
    pub fn new(app: App) -> Self {
        Self { app }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::SessionEvent, Status>> + Send>>;

#[tonic::async_trait]
impl WorkerService for WorkerApi {
    type SessionStream = EventStream;

    async fn session(
        &self,
        request: Request<Streaming<pb::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        // On the Unix socket the kernel tells who the peer is; watch that process.
        let peer_pid = request
            .extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
            .and_then(|info| info.peer_cred)
            .and_then(|cred| cred.pid())
            .and_then(|pid| u32::try_from(pid).ok());
        let peer = PeerWatch::open(peer_pid);
        let caller = caller_of(&request).or_status()?;
        self.app.host.require_ready().or_status()?;
        let mut inbound = request.into_inner();
        let deadline = self.app.config.heartbeat_interval * self.app.config.heartbeat_misses;
        let first = tokio::time::timeout(deadline, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no hello within the heartbeat deadline"))??;
        let (protocol_version, hello) = match first.and_then(|m| m.kind) {
            Some(pb::session_request::Kind::Hello(h)) => (
                modelshare_proto::version::negotiate_hello(h.protocol_version)
                    .map_err(|e| Status::failed_precondition(e.to_string()))?,
                crate::convert::worker_hello(h).or_status()?,
            ),
            _ => {
                return Err(Status::invalid_argument(
                    "the first message of a session must be a hello",
                ));
            }
        };
        let device = convert::device(self.app.host.devices.primary().info());
        let outbound = crate::sessions::open(
            &self.app,
            caller,
            hello,
            protocol_version,
            peer,
            inbound,
            device,
        )
        .map_err(|e| self.app.refuse(e))?;
        Ok(Response::new(Box::pin(ReceiverStream::new(outbound))))
    }

    async fn attach(
        &self,
        request: Request<pb::AttachRequest>,
    ) -> Result<Response<pb::AttachResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.attach_inner(request).await;
        let m = &self.app.host.metrics;
        match &result {
            Ok(_) => {
                m.attaches.with_label_values(&["ok"]).inc();
                m.attach_seconds.observe(started.elapsed().as_secs_f64());
            }
            Err(_) => m.attaches.with_label_values(&["error"]).inc(),
        }
        result
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        let req = request.into_inner();
        let result = self
            .app
            .host
            .registry
            .release(&caller, &req.session_id, &req.lease_id)
            .map_err(crate::status::from_core);
        let (model, version) = result.as_ref().map_or(("", 0), |(m, v)| (m.as_str(), *v));
        audit::record(&caller, "release", model, version, &result);
        result?;
        Ok(Response::new(pb::ReleaseResponse {}))
    }

    type ServeStream = super::serve::ServeStream;

    /// A worker's stream of batches ([`super::serve`]).
    async fn serve(
        &self,
        request: Request<Streaming<pb::ServeRequest>>,
    ) -> Result<Response<Self::ServeStream>, Status> {
        let caller = caller_of(&request).or_status()?;
        let stream = super::serve::open(&self.app, caller, request.into_inner()).await?;
        Ok(Response::new(stream))
    }

    /// Memory a worker kept across a restart, offered back ([`modelshare_core::held`]). Taken while the
    /// server is still starting: start-up loads may be waiting for it.
    async fn offer_held(
        &self,
        request: Request<pb::OfferHeldRequest>,
    ) -> Result<Response<pb::OfferHeldResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        let peer_uid = peer_uid(request.extensions());
        let mut req = request.into_inner();
        if req.model.is_empty() {
            return Err(Status::invalid_argument("model: the offer names no model"));
        }
        let held = &self.app.host.held;
        let not_wanted = |reason: String| pb::OfferHeldResponse {
            wanted: false,
            reason,
            ..Default::default()
        };
        let Some(record) = held.pending_record(&req.model, req.version) else {
            return Ok(Response::new(not_wanted(format!(
                "the server holds no record of version {} of '{}' from before a restart",
                req.version, req.model
            ))));
        };
        if !modelshare_core::tenants::policy::may_see(
            record.owner.as_deref(),
            &record.access(),
            &caller,
        ) {
            return Err(crate::status::from_core(CoreError::ModelNotFound(
                req.model,
            )));
        }
        // The spelling recorded, whichever case the worker attached with.
        req.model.clone_from(&record.model);
        let key = (req.model.clone(), req.version);
        if modelshare_core::adopt::loaded_from_files(&self.app.host, &key) {
            // Loaded from its files already (its files changed, or no worker offered in time):
            // this memory is a second copy now.
            held.forget(&key);
            return Ok(Response::new(not_wanted(format!(
                "the server loaded version {} of '{}' from its files already",
                req.version, req.model
            ))));
        }
        let ttl = self.app.config.ticket_ttl;
        let reply = match held.offer(
            &req.model,
            req.version,
            &req.device_uuid,
            req.allocation_bytes,
            peer_uid,
            ttl,
        ) {
            Ok(ticket) => pb::OfferHeldResponse {
                wanted: true,
                ticket,
                handle_socket: self.app.config.handle_socket.display().to_string(),
                ticket_ttl_ms: u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX),
                reason: String::new(),
            },
            Err(reason) => not_wanted(reason),
        };
        Ok(Response::new(reply))
    }
}

impl WorkerApi {
    async fn attach_inner(
        &self,
        request: Request<pb::AttachRequest>,
    ) -> Result<Response<pb::AttachResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        // A ticket is redeemable only by the uid that attached (when the kernel told us).
        let peer_uid = peer_uid(request.extensions());
        let mut req = request.into_inner();
        req.model = self.app.host.registry.canonical(&caller, &req.model);
        let result = self.attach_as(&caller, &req, peer_uid).await;
        audit::record(
            &caller,
            "attach",
            &req.model,
            result
                .as_ref()
                .ok()
                .and_then(|r| r.manifest.as_ref())
                .map_or(req.version, |m| m.version),
            &result,
        );
        result.map(Response::new)
    }

    async fn attach_as(
        &self,
        caller: &Caller,
        req: &pb::AttachRequest,
        peer_uid: Option<u32>,
    ) -> Result<pb::AttachResponse, Status> {
        self.app.host.require_ready().or_status()?;
        let registry = &self.app.host.registry;
        // On a server of one device, whichever device the worker says it is on, the arena is
        // the one there is.
        let device = (self.app.host.devices.len() > 1 && !req.device_uuid.is_empty())
            .then_some(req.device_uuid.as_str());
        // The worker's device among the server's (`None`: one this server does not serve).
        let served = device.and_then(|d| self.app.host.devices.with_uuid(d));
        // The lease goes back on every failure below, as `pending` drops, unless committed.
        let (att, pending) =
            match registry.attach_pending(caller, &req.session_id, &req.model, req.version, device)
            {
                Err(CoreError::NotOnDevice(mut not)) => {
                    not.served = served.is_some();
                    match served {
                        Some(target) if self.app.config.replicate_on_attach => {
                            Err(self.replicate_for(caller, target, *not).await)
                        }
                        _ => Err(CoreError::NotOnDevice(not)),
                    }
                }
                other => other,
            }
            .map_err(|e| {
                self.app
                    .refuse(self.restoring_or(caller, &req.model, req.version, e))
            })?;
        // Exported on the device thread.
        let mut export = att
            .arena
            .export()
            .await
            .map_err(|e| crate::status::from_core(CoreError::Device(e)))?;
        // A descriptor travels by the handle socket, against a ticket filed on the lease.
        let ticket = match export.fd.take() {
            Some(fd) => {
                let ttl = self.app.config.ticket_ttl;
                let expires = tokio::time::Instant::now() + ttl;
                let ticket = registry
                    .issue_ticket(&att.lease_id, fd, peer_uid, expires.into_std())
                    .map_err(|e| self.app.refuse(e))?;
                self.app.host.timer.schedule(
                    expires,
                    Expiry::Ticket {
                        lease: att.lease_id.clone(),
                        ticket: ticket.clone(),
                    },
                );
                Some(convert::Ticket {
                    ticket,
                    handle_socket: self.app.config.handle_socket.display().to_string(),
                    ttl,
                })
            }
            None => None,
        };
        let handle = convert::attach_handle(export, ticket).or_status()?;
        debug!(session = %req.session_id, model = %req.model, version = att.manifest.version, lease = %att.lease_id, "attach");
        // A manifest of many tensors is megabytes of reply: built on the request pool, off
        // the runtime that carries every session's heartbeats.
        let manifest = att.manifest.clone();
        // About 32 bytes of reply per tensor, beside its name.
        let size = manifest.tensors.len().saturating_mul(32);
        let build_by = std::time::Instant::now() + self.app.config.serving.max_request_time;
        let manifest = self
            .app
            .cpu
            .run_sized(size, build_by, move || convert::manifest(&manifest))
            .await
            .map_err(|e| {
                Status::unavailable(format!("the attach reply could not be built: {e}"))
            })?;
        Ok(pb::AttachResponse {
            lease_id: pending.commit(),
            manifest: Some(manifest),
            device: self
                .app
                .host
                .devices
                .get(&att.device)
                .map(|d| convert::device(d.info())),
            handle: Some(handle),
            loading: att.loading,
        })
    }
}
