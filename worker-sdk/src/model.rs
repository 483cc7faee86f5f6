//! A lease on one model version and the mapping of its arena.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use modelshare_device::{Mapping, Reservation};
use modelshare_proto::v1 as pb;

use crate::WorkerError;
use crate::import;
use crate::link::{KeepOpen, Link, SessionCore};
use crate::tensor::Tensor;

/// What one successful attach gave: the lease (and the session it belongs to), the manifest
/// and the mapped arena.
#[derive(Debug, Clone)]
struct Attached {
    lease_id: String,
    session_id: String,
    manifest: Arc<pb::Manifest>,
    view: Mapping,
    index: Arc<HashMap<String, usize>>,
    loading: bool,
}

/// The shared part of a [`Model`], also known (weakly) to the session, which re-attaches it
/// after a reconnection.
#[derive(Debug)]
pub(crate) struct ModelInner {
    name: String,
    requested_version: u32,
    current: RwLock<Attached>,
}

impl ModelInner {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn current(&self) -> Attached {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The version attached now and its mapping (to offer it back to a restarted server).
    pub(crate) fn attached(&self) -> (u32, Mapping) {
        let cur = self.current();
        (cur.manifest.version, cur.view)
    }

    /// Attaches again on the session's new `link` (after a reconnection); returns the version.
    pub(crate) async fn reattach(&self, link: &Link) -> Result<u32, WorkerError> {
        let fresh = attach_once(link, &self.name, self.requested_version).await?;
        let version = fresh.manifest.version;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(version)
    }
}

/// An attached model version. Its tensors stay readable while the `Model` (or a [`Tensor`]
/// taken from it) lives; dropping the `Model` releases the lease. The session stays open as
/// long as a `Model` of it lives.
#[derive(Debug)]
pub struct Model {
    session: KeepOpen,
    inner: Arc<ModelInner>,
    released: bool,
}

impl Model {
    /// Attaches `version` of `model` (0: latest ready, or the first version still loading on a CUDA server) on the session's current link. The
    /// session registers [`Model::shared`] to re-attach it after a reconnection.
    pub(crate) async fn attach(
        session: KeepOpen,
        model: &str,
        version: u32,
    ) -> Result<Self, WorkerError> {
        let link = session.link()?;
        let attached = attach_once(&link, model, version).await?;
        Ok(Self::new(session, version, attached))
    }

    /// The model `attached` gave, asked for as `version`.
    fn new(session: KeepOpen, version: u32, attached: Attached) -> Self {
        let inner = Arc::new(ModelInner {
            // The spelling the server records (names are found in any case): what it offers
            // back after a restart and re-attaches by, and what the worker shows.
            name: attached.manifest.model.clone(),
            requested_version: version,
            current: RwLock::new(attached),
        });
        Self {
            session,
            inner,
            released: false,
        }
    }

    /// Asks the server for `version` of `model` as [`Model::attach`] does, and returns once it
    /// has granted the lease: the manifest and, where the handle's kind allows (CUDA VMM), the
    /// address space the arena will be mapped at are known before the mapping, which
    /// [`Granted::map`] then does.
    pub(crate) async fn grant(
        session: KeepOpen,
        model: &str,
        version: u32,
    ) -> Result<Granted, WorkerError> {
        let link = session.link()?;
        let (reply, manifest) = granted(&link, model, version).await?;
        let reservation = import::reserve(reply.handle.as_ref()).await;
        Ok(Granted {
            session,
            link,
            version,
            manifest,
            reservation,
            reply,
        })
    }

    /// The part the session re-attaches after a reconnection.
    pub(crate) fn shared(&self) -> &Arc<ModelInner> {
        &self.inner
    }

    /// Model name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Version attached now.
    pub fn version(&self) -> u32 {
        self.inner.current().manifest.version
    }

    /// Lease id now held.
    pub fn lease_id(&self) -> String {
        self.inner.current().lease_id
    }

    /// The session id the current lease belongs to: until the supervisor has re-attached the
    /// model after a reconnection, an old one.
    pub(crate) fn lease_session(&self) -> String {
        self.inner.current().session_id
    }

    /// Whether the model was attached by the session whose core is `core`.
    pub(crate) fn belongs_to(&self, core: &Arc<SessionCore>) -> bool {
        Arc::ptr_eq(self.session.core(), core)
    }

    /// The manifest of the version attached now.
    pub fn manifest(&self) -> Arc<pb::Manifest> {
        self.inner.current().manifest
    }

    /// Metadata file `name` (config.json, ...), if the model has one.
    pub fn metadata(&self, name: &str) -> Option<Vec<u8>> {
        self.inner
            .current()
            .manifest
            .files
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.content.clone())
    }

    /// Every tensor, in arena order.
    pub fn tensors(&self) -> Vec<Tensor> {
        let cur = self.inner.current();
        cur.manifest
            .tensors
            .iter()
            .map(|t| Tensor::new(t.clone(), cur.view.clone()))
            .collect()
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Result<Tensor, WorkerError> {
        let cur = self.inner.current();
        cur.index
            .get(name)
            .and_then(|i| cur.manifest.tensors.get(*i))
            .map(|t| Tensor::new(t.clone(), cur.view.clone()))
            .ok_or_else(|| WorkerError::NoSuchTensor {
                model: self.inner.name.clone(),
                tensor: name.to_owned(),
            })
    }

    /// Every tensor whose bytes do not hash to the manifest's checksum (empty when all match).
    /// On the CUDA backend this copies every tensor to the host (after the ready event); a
    /// model attached while loading has no checksums yet and reports every tensor.
    pub fn verify(&self) -> Vec<String> {
        self.tensors()
            .into_iter()
            .filter(|t| !t.verify())
            .map(|t| t.name().to_owned())
            .collect()
    }

    /// The mapping of the arena attached now: its host bytes ([`Mapping::host_bytes`]) or its
    /// device address and CUDA context ([`Mapping::device_ptr`], [`Mapping::context`]).
    pub fn view(&self) -> Mapping {
        self.inner.current().view
    }

    /// Whether the arena is mapped read-only in this process: true for host memory (a
    /// read-only mapping of a write-sealed memfd); false for legacy CUDA IPC, whose mappings
    /// are writable (nothing but the worker's own care stops a kernel writing the weights).
    pub fn read_only(&self) -> bool {
        self.inner.current().view.read_only()
    }

    /// Whether the version was still loading when it was attached (CUDA only): its manifest
    /// has no checksums, and kernels must wait for the ready event ([`Model::wait_ready`]).
    pub fn attached_while_loading(&self) -> bool {
        self.inner.current().loading
    }

    /// Makes `stream` wait, on the device, until the version is fully loaded (CUDA). A no-op
    /// on the host backend, where only loaded versions are attached.
    pub fn wait_ready(&self, stream: &cudarc::driver::CudaStream) -> Result<(), WorkerError> {
        let cur = self.inner.current();
        cur.view
            .wait_ready(stream)
            .map_err(|source| WorkerError::Device {
                model: self.inner.name.clone(),
                version: cur.manifest.version,
                source,
            })
    }

    /// Gives the lease back now and waits for the server's answer.
    pub async fn release(mut self) -> Result<(), WorkerError> {
        self.released = true;
        let link = self.session.link()?;
        release(&link, &self.inner.current().lease_id).await
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // A lease of a session that already ended is gone anyway; otherwise release in the
        // background when a runtime is there (the session's end releases it at the latest, and
        // its goodbye waits for this release).
        if let (Ok(link), Ok(_)) = (self.session.link(), tokio::runtime::Handle::try_current()) {
            let lease = self.inner.current().lease_id;
            self.session.core().spawn_release(async move {
                let _ = release(&link, &lease).await;
            });
        }
    }
}

/// How long an attach keeps retrying while the server answers UNAVAILABLE (start-up models
/// still loading, or the version's memory being allocated: both mean "retry shortly").
const UNAVAILABLE_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// The Attach call, retried with backoff while the server answers UNAVAILABLE.
async fn attach_rpc(
    link: &Link,
    model: &str,
    version: u32,
) -> Result<pb::AttachResponse, WorkerError> {
    let deadline = tokio::time::Instant::now() + UNAVAILABLE_RETRY;
    let mut backoff = std::time::Duration::from_millis(5);
    loop {
        let result = link
            .client
            .clone()
            .attach(pb::AttachRequest {
                session_id: link.id.clone(),
                model: model.to_owned(),
                version,
                device_uuid: link.device_uuid.clone().unwrap_or_default(),
            })
            .await;
        match result {
            Ok(reply) => return Ok(reply.into_inner()),
            Err(status)
                if status.code() == tonic::Code::Unavailable
                    && tokio::time::Instant::now() + backoff < deadline =>
            {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_millis(200));
            }
            Err(status) => {
                return Err(WorkerError::Rpc {
                    call: "Attach",
                    status,
                });
            }
        }
    }
}

/// An attach the server has granted, its arena not mapped yet ([`Model::grant`]).
#[derive(Debug)]
pub(crate) struct Granted {
    session: KeepOpen,
    link: Link,
    version: u32,
    manifest: Arc<pb::Manifest>,
    reservation: Option<Reservation>,
    reply: pb::AttachResponse,
}

impl Granted {
    /// The version's manifest, its tensors checked to lie inside the arena.
    pub(crate) fn manifest(&self) -> &Arc<pb::Manifest> {
        &self.manifest
    }

    /// Where the arena will be mapped, when reserved before the mapping (CUDA VMM).
    pub(crate) fn reservation(&self) -> Option<&Reservation> {
        self.reservation.as_ref()
    }

    /// Whether the version was still loading when granted.
    pub(crate) fn loading(&self) -> bool {
        self.reply.loading
    }

    /// Redeems the handle and maps the arena (at the reservation, if any): the attached model.
    /// Releases the lease if that fails.
    pub(crate) async fn map(self) -> Result<Model, WorkerError> {
        let Granted {
            session,
            link,
            version,
            manifest,
            reservation,
            reply,
        } = self;
        let attached = map_granted(&link, reply, manifest, reservation).await?;
        Ok(Model::new(session, version, attached))
    }
}

/// One attach, the handle redeemed and mapped; releases the lease if anything fails.
async fn attach_once(link: &Link, model: &str, version: u32) -> Result<Attached, WorkerError> {
    let (reply, manifest) = granted(link, model, version).await?;
    map_granted(link, reply, manifest, None).await
}

/// The Attach call and its reply's manifest, taken out of it and checked; releases the lease
/// if the manifest is wrong.
async fn granted(
    link: &Link,
    model: &str,
    version: u32,
) -> Result<(pb::AttachResponse, Arc<pb::Manifest>), WorkerError> {
    let asked = std::time::Instant::now();
    let mut reply = attach_rpc(link, model, version).await?;
    tracing::trace!(
        model,
        rpc_us = asked.elapsed().as_micros() as u64,
        "attach: granted"
    );
    match checked_manifest(reply.manifest.take()) {
        Ok(m) => Ok((reply, Arc::new(m))),
        Err(e) => {
            let _ = release(link, &reply.lease_id).await;
            Err(e)
        }
    }
}

/// The granted `reply`'s arena mapped (at `reserved`, if any) for `manifest`, as an
/// [`Attached`]; releases the lease if that fails.
async fn map_granted(
    link: &Link,
    reply: pb::AttachResponse,
    manifest: Arc<pb::Manifest>,
    reserved: Option<Reservation>,
) -> Result<Attached, WorkerError> {
    let lease_id = reply.lease_id;
    match import::map(reply.handle, &manifest, reserved).await {
        Ok(view) => {
            let index = manifest
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect();
            Ok(Attached {
                lease_id,
                session_id: link.id.clone(),
                manifest,
                view,
                index: Arc::new(index),
                loading: reply.loading,
            })
        }
        Err(e) => {
            let _ = release(link, &lease_id).await;
            Err(e)
        }
    }
}

/// The reply's manifest, every tensor checked to lie inside the arena.
fn checked_manifest(manifest: Option<pb::Manifest>) -> Result<pb::Manifest, WorkerError> {
    let manifest =
        manifest.ok_or_else(|| WorkerError::Protocol("attach reply without a manifest".into()))?;
    if let Some(t) = manifest.tensors.iter().find(|t| {
        t.offset
            .checked_add(t.byte_length)
            .is_none_or(|end| end > manifest.arena_bytes)
    }) {
        return Err(WorkerError::Protocol(format!(
            "tensor '{}' lies outside the {}-byte arena",
            t.name, manifest.arena_bytes
        )));
    }
    Ok(manifest)
}

async fn release(link: &Link, lease_id: &str) -> Result<(), WorkerError> {
    link.client
        .clone()
        .release(pb::ReleaseRequest {
            session_id: link.id.clone(),
            lease_id: lease_id.to_owned(),
        })
        .await
        .map_err(|status| WorkerError::Rpc {
            call: "Release",
            status,
        })?;
    Ok(())
}
