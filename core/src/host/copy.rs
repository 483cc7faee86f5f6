//! The copy of a load whose arena is allocated, on its blocking thread, and the finish of a
//! load adopted from memory a worker kept: the version's outcome, its metrics, its
//! held-memory record.

use std::sync::Arc;

use modelshare_device::BackendKind;
use tokio::sync::OwnedSemaphorePermit;
use tracing::{info, warn};

use crate::error::CoreError;
use crate::held::{HeldRecord, HeldStore, record};
use crate::loader;
use crate::metrics::Metrics;
use crate::model::Manifest;
use crate::registry::{Registry, Reservation, SharedArena, VersionSnapshot};
use crate::weights::{layout, source};

/// A load whose arena is allocated: what the copy needs, on its blocking thread.
pub(super) struct LoadCopy {
    pub(super) registry: Arc<Registry>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) held: Arc<HeldStore>,
    pub(super) threads: usize,
    /// Hash on the CPU too where the device checksums (`load_cpu_hash`).
    pub(super) cpu_hash: bool,
    /// Which loads of bytes a version already holds share its memory.
    pub(super) share_identical: crate::tenants::policy::ShareIdentical,
    /// The server's chunk gate, shared with every other load.
    pub(super) gate: Arc<loader::ChunkGate>,
    /// When the load was asked for, and how long its arena took to allocate (for the log).
    pub(super) requested: std::time::Instant,
    pub(super) allocate_seconds: f64,
    /// The CPUs of the device's NUMA node, where the machine has several.
    pub(super) cpus: Option<Vec<usize>>,
    pub(super) reservation: Reservation,
    pub(super) src: source::ModelSource,
    pub(super) plan: layout::Layout,
    pub(super) files: Vec<record::FileId>,
    pub(super) backend: BackendKind,
    /// The load slot, held until the load ends.
    pub(super) _permit: OwnedSemaphorePermit,
}

impl LoadCopy {
    /// Fills `arena`, records the outcome, and returns the version as it then stands.
    pub(super) fn run(
        self,
        arena: &modelshare_device::ArenaHandle,
    ) -> Result<VersionSnapshot, CoreError> {
        let started = std::time::Instant::now();
        let before_copy = started.duration_since(self.requested).as_secs_f64();
        match loader::copy_into(
            &self.reservation,
            arena,
            &self.src,
            &self.plan,
            &loader::CopyOptions {
                threads: self.threads,
                cpu_hash: self.cpu_hash,
                gate: &self.gate,
                cpus: self.cpus.as_deref(),
            },
        ) {
            Ok(loader::Copied { manifest, .. }) => {
                let (registry, metrics, job, plan) =
                    (&self.registry, &self.metrics, &self.reservation, &self.plan);
                // The version is ready first; its held-memory record (a file synced to disk,
                // which can wait behind other files' writeback for a long while) is written
                // after, off this thread. A crash in between only costs the adoption of that
                // memory by a restarted server (it loads from the files instead).
                let record = self.held_record(&manifest);
                registry.finish_load(&job.model, job.version, Ok(manifest));
                self.remember_later(record);
                let secs = started.elapsed().as_secs_f64();
                metrics.loads.with_label_values(&["ok"]).inc();
                metrics.load_seconds.observe(secs);
                metrics.load_bytes.inc_by(plan.payload_bytes);
                info!(
                    model = %job.model,
                    version = job.version,
                    bytes = plan.payload_bytes,
                    seconds = secs,
                    gb_per_s = plan.payload_bytes as f64 / secs.max(1e-9) / 1e9,
                    // From the request to the copy's start, and the arena's allocation in it.
                    before_copy_seconds = before_copy,
                    allocate_seconds = self.allocate_seconds,
                    "model loaded"
                );
                self.snapshot()
            }
            Err(e) => {
                let job = &self.reservation;
                self.metrics.loads.with_label_values(&["error"]).inc();
                warn!(model = %job.model, version = job.version, error = %e, "load failed");
                self.registry
                    .finish_load(&job.model, job.version, Err(e.to_string()));
                Err(e)
            }
        }
    }

    /// Finishes a load whose files hold the bytes of `shared`'s memory (their SHA-256
    /// `sha256`), handed to it already ([`Registry::share_arena`]): the version is ready with
    /// that memory's checksums. It writes a held-memory record of its own, as a copy does, so
    /// that a restarted server adopts it whatever became of the holder.
    pub(super) fn shared(
        self,
        shared: &SharedArena,
        sha256: [u8; 32],
    ) -> Result<VersionSnapshot, CoreError> {
        let job = &self.reservation;
        let manifest = manifest_for_record(&job.manifest, shared);
        let record = self.held_record(&manifest);
        self.registry
            .finish_load(&job.model, job.version, Ok(manifest));
        self.remember_later(record);
        self.metrics.loads.with_label_values(&["shared"]).inc();
        info!(
            model = %job.model,
            version = job.version,
            bytes = job.manifest.arena_bytes,
            holder = %format!("{}@{}", shared.holder.model, shared.holder.version),
            device = %shared.device,
            sha256 = %hex::encode(sha256),
            seconds = self.requested.elapsed().as_secs_f64(),
            "model loaded into the memory of a version holding the same bytes (compared, not copied)"
        );
        self.snapshot()
    }

    /// Finishes a load with memory adopted from a worker (`record`'s bytes, checked when the
    /// worker offered them): the version is ready with the record's checksums.
    pub(super) fn adopted(self, record: &HeldRecord) -> Result<VersionSnapshot, CoreError> {
        let job = &self.reservation;
        let mut manifest = job.manifest.clone();
        record.fill_checksums(&mut manifest);
        self.remember(&manifest);
        self.registry
            .finish_load(&job.model, job.version, Ok(manifest));
        self.held.restored(&(record.model.clone(), record.version));
        self.metrics.loads.with_label_values(&["adopted"]).inc();
        info!(
            model = %job.model,
            version = job.version,
            bytes = job.manifest.arena_bytes,
            "model back from memory a worker kept across the restart (not read from the files)"
        );
        self.snapshot()
    }

    /// The version as it stands now; a version unloaded meanwhile is a cancelled load.
    fn snapshot(&self) -> Result<VersionSnapshot, CoreError> {
        let job = &self.reservation;
        self.registry
            .version_snapshot(&job.model, job.version)
            .ok_or_else(|| CoreError::LoadCancelled {
                model: job.model.clone(),
                version: job.version,
            })
    }

    /// Writes `record` (a file synced to disk, which can wait behind other files' writeback
    /// for a long while) off this thread.
    fn remember_later(&self, record: Option<HeldRecord>) {
        if let Some(record) = record {
            let held = self.held.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(move || held.remember(&record))),
                Err(_) => held.remember(&record),
            }
        }
    }

    /// Writes the held-memory record of the loaded version (kinds whose memory can outlive
    /// the server; a no-op otherwise).
    fn remember(&self, manifest: &Manifest) {
        if let Some(record) = self.held_record(manifest) {
            self.held.remember(&record);
        }
    }

    /// The held-memory record of this version, where there is one to write (memory that can
    /// outlive the server, a held-records directory).
    fn held_record(&self, manifest: &Manifest) -> Option<HeldRecord> {
        if !self.held.enabled() {
            return None;
        }
        let (owner, access) = self.registry.ownership(&manifest.model)?;
        let backend = match self.backend {
            BackendKind::Host => "host",
            BackendKind::CudaVmm => "cuda-vmm",
            BackendKind::CudaIpc => return None,
        };
        Some(HeldRecord::new(
            manifest,
            owner,
            &access,
            &self.src.source,
            self.files.clone(),
            backend,
            &self.reservation.device,
        ))
    }
}

/// The manifest of a version that shares `shared`'s memory, with that memory's checksums.
fn manifest_for_record(planned: &Manifest, shared: &SharedArena) -> Manifest {
    let mut manifest = planned.clone();
    for (t, held) in manifest.tensors.iter_mut().zip(&shared.manifest.tensors) {
        t.xxh3 = held.xxh3;
        t.ms64 = held.ms64;
    }
    manifest
}
