//! A lease on one model version and the mapping of its arena.

use std::collections::HashMap;
use std::sync::Arc;

use modelshare_device::{HostMapping, handoff};
use modelshare_proto::v1 as pb;

use crate::WorkerError;
use crate::session::Shared;
use crate::tensor::Tensor;

/// An attached model version. Its tensors stay readable while the `Model` (or a [`Tensor`]
/// cloned from it) lives; dropping the `Model` releases the lease.
#[derive(Debug)]
pub struct Model {
    session: Arc<Shared>,
    lease_id: String,
    manifest: pb::Manifest,
    mapping: Arc<HostMapping>,
    index: HashMap<String, usize>,
    released: bool,
}

impl Model {
    pub(crate) async fn attach(
        session: Arc<Shared>,
        model: &str,
        version: u32,
    ) -> Result<Self, WorkerError> {
        let reply = session
            .client
            .clone()
            .attach(pb::AttachRequest {
                session_id: session.id.clone(),
                model: model.to_owned(),
                version,
            })
            .await
            .map_err(|status| WorkerError::Rpc {
                call: "Attach",
                status,
            })?
            .into_inner();
        let lease_id = reply.lease_id.clone();
        // From here on, give the lease back if anything fails.
        let mut guard = ReleaseOnError {
            session: Some(session.clone()),
            lease_id: lease_id.clone(),
        };
        let manifest = reply
            .manifest
            .ok_or_else(|| WorkerError::Protocol("attach reply without a manifest".into()))?;
        let device_err = |source| WorkerError::Device {
            model: manifest.model.clone(),
            version: manifest.version,
            source,
        };
        let mapping = match reply.handle {
            Some(pb::attach_response::Handle::Host(h)) => {
                let fd = handoff::redeem(std::path::Path::new(&h.handle_socket), &h.ticket)
                    .await
                    .map_err(device_err)?;
                HostMapping::map(fd, manifest.arena_bytes).map_err(device_err)?
            }
            None => {
                return Err(WorkerError::Protocol(
                    "attach reply without an arena handle".into(),
                ));
            }
        };
        for t in &manifest.tensors {
            let fits = t
                .offset
                .checked_add(t.byte_length)
                .is_some_and(|end| end <= manifest.arena_bytes);
            if !fits {
                return Err(WorkerError::Protocol(format!(
                    "tensor '{}' lies outside the {}-byte arena",
                    t.name, manifest.arena_bytes
                )));
            }
        }
        let index = manifest
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        guard.session = None;
        Ok(Self {
            session,
            lease_id,
            manifest,
            mapping: Arc::new(mapping),
            index,
            released: false,
        })
    }

    /// Model name.
    pub fn name(&self) -> &str {
        &self.manifest.model
    }

    /// Version attached.
    pub fn version(&self) -> u32 {
        self.manifest.version
    }

    /// Lease id.
    pub fn lease_id(&self) -> &str {
        &self.lease_id
    }

    /// The whole manifest.
    pub fn manifest(&self) -> &pb::Manifest {
        &self.manifest
    }

    /// Metadata file `name` (config.json, ...), if the model has one.
    pub fn metadata(&self, name: &str) -> Option<&[u8]> {
        self.manifest
            .files
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.content.as_slice())
    }

    /// Every tensor, in arena order.
    pub fn tensors(&self) -> impl Iterator<Item = Tensor> + '_ {
        self.manifest
            .tensors
            .iter()
            .map(|t| Tensor::new(t.clone(), self.mapping.clone()))
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Result<Tensor, WorkerError> {
        self.index
            .get(name)
            .and_then(|i| self.manifest.tensors.get(*i))
            .map(|t| Tensor::new(t.clone(), self.mapping.clone()))
            .ok_or_else(|| WorkerError::NoSuchTensor {
                model: self.manifest.model.clone(),
                tensor: name.to_owned(),
            })
    }

    /// The whole arena, read-only.
    pub fn arena_bytes(&self) -> &[u8] {
        self.mapping.as_slice()
    }

    /// Gives the lease back now and waits for the server's answer.
    pub async fn release(mut self) -> Result<(), WorkerError> {
        self.released = true;
        release(&self.session, &self.lease_id).await
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        if !self.released {
            spawn_release(self.session.clone(), self.lease_id.clone());
        }
    }
}

async fn release(session: &Shared, lease_id: &str) -> Result<(), WorkerError> {
    session
        .client
        .clone()
        .release(pb::ReleaseRequest {
            session_id: session.id.clone(),
            lease_id: lease_id.to_owned(),
        })
        .await
        .map_err(|status| WorkerError::Rpc {
            call: "Release",
            status,
        })?;
    Ok(())
}

/// Releases in the background when a runtime is there; otherwise the session's end releases.
fn spawn_release(session: Arc<Shared>, lease_id: String) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let _ = release(&session, &lease_id).await;
        });
    }
}

struct ReleaseOnError {
    session: Option<Arc<Shared>>,
    lease_id: String,
}

impl Drop for ReleaseOnError {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            spawn_release(s, std::mem::take(&mut self.lease_id));
        }
    }
}
