//! The application state shared by every service, and the one path a load takes (used both by
//! `LoadModel` and by the start-up models).

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Config;
use crate::devices::Devices;
use crate::error::ServerError;
use crate::held::{HeldRecord, HeldStore, record};
use crate::loader;
use crate::model::validate_name;
use crate::registry::{LoadFor, LoadProgress, Registry, VersionSnapshot};
use crate::serving::{Engine, EngineConfig, Limits};
use crate::sessions::Hub;
use crate::tenants::{Caller, TenantStore};
use crate::timer::Timer;
use crate::weights::{layout, source};
use modelshare_device::BackendKind;

/// State shared by the gRPC services.
#[derive(Debug, Clone)]
pub struct App {
    /// The devices, each behind its device thread.
    pub devices: Arc<Devices>,
    /// Models, versions, sessions, leases and their tickets.
    pub registry: Arc<Registry>,
    /// Live worker sessions.
    pub hub: Arc<Hub>,
    /// Every expiry: tickets, heartbeats, drain deadlines.
    pub timer: Arc<Timer>,
    /// The whole configuration.
    pub config: Arc<Config>,
    /// Cancelled when the server starts shutting down.
    pub shutdown: CancellationToken,
    /// Prometheus metrics.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Set once every start-up model is loaded; worker calls are refused before.
    pub ready: Arc<std::sync::atomic::AtomicBool>,
    /// Tenants, tokens and quotas in force.
    pub tenants: Arc<TenantStore>,
    /// The request path: queues, batches, Serve streams.
    pub engine: Engine,
    /// Records of memory that can outlive the server, and their adoption after a restart.
    pub held: Arc<HeldStore>,
    /// The bounded pool for requests' CPU-heavy work (parsing, conversion), off the runtime.
    pub cpu: crate::front::cpu::CpuPool,
    /// Request-body bytes being received at once over every door.
    pub bodies: crate::bodies::BodyBudget,
    load_slots: Arc<Semaphore>,
    /// Chunks being loaded at once, over all loads.
    chunk_gate: Arc<loader::ChunkGate>,
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
    }
}

/// A load that has been validated and admitted; its copy runs in the background.
#[derive(Debug)]
pub struct RunningLoad {
    /// Version number assigned.
    pub version: u32,
    /// Payload bytes to copy.
    pub bytes_total: u64,
    /// Number of tensors.
    pub tensor_count: u32,
    /// Shared progress.
    pub progress: Arc<LoadProgress>,
    /// Resolves when the load ends: the version as it then stands, or why it failed.
    pub done: oneshot::Receiver<Result<VersionSnapshot, ServerError>>,
}

impl App {
    /// Application state over `devices`, with an empty registry.
    pub fn new(
        devices: Arc<Devices>,
        config: Arc<Config>,
        metrics: Arc<crate::metrics::Metrics>,
        tenants: Arc<TenantStore>,
    ) -> Self {
        let shutdown = CancellationToken::new();
        let engine = Engine::start(
            engine_config(&config, &tenants),
            metrics.clone(),
            shutdown.clone(),
        );
        let adoptable = matches!(
            devices.primary().info().backend,
            BackendKind::Host | BackendKind::CudaVmm
        );
        let held_dir =
            (adoptable && !config.adopt_wait.is_zero()).then(|| records_dir(&config.handle_socket));
        Self {
            held: Arc::new(HeldStore::open(held_dir, config.adopt_wait)),
            tenants,
            engine,
            registry: Arc::new(Registry::new(config.registry.clone())),
            devices,
            hub: Arc::new(Hub::new()),
            cpu: crate::front::cpu::CpuPool::for_this_machine(),
            bodies: crate::bodies::BodyBudget::new(config.serving.max_body_bytes_in_flight),
            timer: Arc::new(Timer::new()),
            load_slots: Arc::new(Semaphore::new(config.max_concurrent_loads)),
            chunk_gate: Arc::new(loader::ChunkGate::new(config.load_threads)),
            shutdown,
            ready: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            metrics,
            config,
        }
    }

    /// Validates `name` and the weights at `path` (every header, before anything is allocated),
    /// allocates the arena and starts the copy on a blocking thread. The copy goes on if the
    /// caller stops listening.
    ///
    /// Unless `keep_previous`, older ready versions of the name are retired once this one is
    /// ready.
    pub async fn start_load(
        &self,
        caller: &Caller,
        load_for: LoadFor,
        name: &str,
        path: &str,
        keep_previous: bool,
    ) -> Result<RunningLoad, ServerError> {
        let requested = std::time::Instant::now();
        validate_name(name)?;
        let quota_of = |t: &str| self.tenants.quota_of(t).unwrap_or_default();
        // The tenant's `loads` and `models` quotas first, counting its loads admitted and not yet
        // reserved: a tenant at its quota never holds one of the server's load slots.
        let claim = self
            .registry
            .authorize_load(caller, &load_for, &quota_of, name)?;
        let permit = self.load_permit()?;
        // A tenant with a model directory loads from under it only (symlinks out of it are
        // refused as they are out of the root); other tenants' model directories are out of
        // bounds for a tenant, with or without a directory of its own.
        let (tenant_dir, reserved) = match caller.tenant() {
            Some(me) => {
                let table = self.tenants.current();
                let own = table.tenants.get(me).and_then(|t| t.model_dir.clone());
                let others: Vec<std::path::PathBuf> = table
                    .tenants
                    .values()
                    .filter(|t| t.name != me)
                    .filter_map(|t| t.model_dir.as_ref())
                    .map(|d| self.config.model_root.join(d))
                    .collect();
                (own, others)
            }
            None => (None, Vec::new()),
        };
        let root = match &tenant_dir {
            Some(dir) => self.config.model_root.join(dir),
            None => self.config.model_root.clone(),
        };
        let limits = self.config.weights.clone();
        let rel = path.to_owned();
        let registry = self.registry.clone();
        let model = name.to_owned();
        let caller = caller.clone();
        let tenants = self.tenants.clone();
        let devices = self.devices.clone();
        let max_device_bytes = self.config.max_device_bytes;
        let held = self.held.clone();
        let only_adopted = load_for.only_adopted;
        let mut load_for = load_for;
        // Validation reads files, and placement asks the devices for their free memory: it
        // blocks.
        let (reservation, src, plan, files, placed, memory) =
            tokio::task::spawn_blocking(move || {
                // Other tenants' directories count as missing for every file the load reads (the
                // path asked for, the index, shards, metadata files, and links among them), before
                // anything there is opened: the answer is exactly that of a missing path.
                let mut src = source::resolve_denying(&root, &rel, &limits, &reserved)?;
                if let Some(dir) = &tenant_dir {
                    // Reported relative to the model root, like every other source.
                    src.source = format!("{dir}/{}", src.source);
                }
                let plan = layout::plan(&src)?;
                if plan.tensors.is_empty() {
                    return Err(ServerError::InvalidArgument {
                        field: "path".into(),
                        reason: format!("'{rel}' holds no tensors: nothing to share"),
                    });
                }
                let manifest = loader::manifest(&model, &src, &plan);
                let files = record::file_ids(&src);
                let hint = held.version_hint(&model, &src.source);
                if load_for.resume_version.is_none() {
                    load_for.resume_version = hint;
                }
                // A load that may adopt memory workers kept needs no free memory: those bytes are
                // on the device already, and count as used there (as they do for `admit` below).
                let placed = place(
                    &devices,
                    &registry,
                    &load_for.placement,
                    max_device_bytes,
                    manifest.arena_bytes,
                    hint.is_none(),
                )?;
                let uuids: Vec<String> = placed.iter().map(|d| d.uuid().to_owned()).collect();
                // Refused before anything is allocated when the memory is not there, counting the
                // loads in progress (a load that may adopt memory workers kept needs none). Each
                // device placed is reserved: the host's stand-ins are one memory.
                let memory = if hint.is_none() {
                    placed
                        .iter()
                        .map(|device| devices.reserve(device, &model, manifest.arena_bytes))
                        .collect::<Result<Vec<_>, _>>()?
                } else {
                    Vec::new()
                };
                let quota_of = |t: &str| tenants.quota_of(t).unwrap_or_default();
                let reservation = registry.reserve(
                    &caller,
                    &load_for,
                    &quota_of,
                    manifest,
                    &src.source,
                    plan.payload_bytes,
                    &uuids,
                    keep_previous,
                    claim,
                )?;
                Ok::<_, ServerError>((reservation, src, plan, files, placed, memory))
            })
            .await
            .map_err(|e| ServerError::Internal(format!("validation task failed: {e}")))??;
        let mut placed = placed.into_iter();
        let device = placed
            .next()
            .ok_or_else(|| ServerError::Internal("a load placed on no device".into()))?;
        let replicas: Vec<modelshare_device::DeviceThread> = placed.collect();
        // The first device's reservation, and the replicas'; given back as the load ends (on
        // every path of the task below, as they drop).
        let mut memory = memory.into_iter();
        let first_memory = memory.next();
        let replica_memory: Vec<crate::devices::MemoryReservation> = memory.collect();

        let (tx, done) = oneshot::channel();
        let running = RunningLoad {
            version: reservation.version,
            bytes_total: plan.payload_bytes,
            tensor_count: u32::try_from(plan.tensors.len()).unwrap_or(u32::MAX),
            progress: reservation.progress.clone(),
            done,
        };
        // From here the load runs to its end whether or not the caller still listens: the
        // arena is allocated on the device thread (outside the registry's lock), then filled.
        let (allocated_tx, allocated) = oneshot::channel();
        let copy = LoadCopy {
            registry: self.registry.clone(),
            metrics: self.metrics.clone(),
            held: self.held.clone(),
            threads: self.config.load_threads,
            cpu_hash: self.config.load_cpu_hash,
            gate: self.chunk_gate.clone(),
            requested,
            allocate_seconds: 0.0,
            cpus: device
                .info()
                .numa_node
                .and_then(modelshare_device::numa::cpus_of),
            reservation,
            src,
            plan,
            files,
            backend: device.info().backend,
            _permit: permit,
        };
        let devices_now = self.devices.clone();
        tokio::spawn(async move {
            // Memory a worker kept across a restart, if it is these bytes: adopted, not loaded.
            if let Some((arena, record)) = copy
                .held
                .claim(&copy.reservation.manifest, &copy.files)
                .await
            {
                let mut copy = copy;
                let key = copy.reservation.key();
                let (model, version) = (key.model.clone(), key.version);
                copy.registry.set_arena(&model, version, arena.clone());
                // The memory is on the device the worker kept it on: that one is the version's
                // first, whatever placement chose; the other devices placed get the replicas.
                let targets: Vec<modelshare_device::DeviceThread> = copy
                    .registry
                    .adopted_on(&key, &record.device_uuid)
                    .iter()
                    .filter_map(|uuid| devices_now.get(uuid).cloned())
                    .collect();
                record.device_uuid.clone_into(&mut copy.reservation.device);
                let _ = allocated_tx.send(Ok(()));
                let registry = copy.registry.clone();
                let metrics = copy.metrics.clone();
                let mut reply = copy.adopted(&record);
                if reply.is_ok() && !targets.is_empty() {
                    let source = arena.clone();
                    let (r, metrics) = (registry.clone(), metrics.clone());
                    let _ = tokio::task::spawn_blocking(move || {
                        crate::replicate::copy_all(&r, &metrics, &key, &source, &targets);
                    })
                    .await;
                    if let Some(now) = registry.version_snapshot(&model, version) {
                        reply = Ok(now);
                    }
                }
                let _ = tx.send(reply);
                drop(arena);
                return;
            }
            if only_adopted {
                let r = &copy.reservation;
                let err = ServerError::FilesChanged {
                    model: r.model.clone(),
                    version: r.version,
                };
                copy.registry
                    .finish_load(&r.model, r.version, Err(err.to_string()));
                let _ = allocated_tx.send(Err(err));
                return;
            }
            let label = format!("{}@{}", copy.reservation.model, copy.reservation.version);
            let allocating = std::time::Instant::now();
            let arena = match device
                .allocate(copy.reservation.manifest.arena_bytes, &label)
                .await
            {
                Ok(arena) => arena,
                Err(e) => {
                    let err = ServerError::Device(e);
                    let r = &copy.reservation;
                    copy.registry
                        .finish_load(&r.model, r.version, Err(err.to_string()));
                    let _ = allocated_tx.send(Err(err));
                    return;
                }
            };
            // Memory that allocation takes at once (CUDA) is in the device's free figure now;
            // a host arena's pages are taken as the copy writes them, so its reservation
            // stays until the load ends.
            let first_memory = match copy.backend {
                BackendKind::Host => first_memory,
                BackendKind::CudaVmm | BackendKind::CudaIpc => None,
            };
            let mut copy = copy;
            copy.allocate_seconds = allocating.elapsed().as_secs_f64();
            let r = &copy.reservation;
            copy.registry.set_arena(&r.model, r.version, arena.clone());
            let _ = allocated_tx.send(Ok(()));
            let registry = copy.registry.clone();
            let metrics = copy.metrics.clone();
            let key = r.key();
            let _ = tokio::task::spawn_blocking(move || {
                let mut reply = copy.run(&arena);
                // Further replicas are copied from this one, device to device, before the
                // load's caller hears it is done.
                if reply.is_ok() && !replicas.is_empty() {
                    crate::replicate::copy_all(&registry, &metrics, &key, &arena, &replicas);
                    if let Some(now) = registry.version_snapshot(&key.model, key.version) {
                        reply = Ok(now);
                    }
                }
                // The loader's handle goes before the reply, so a failed load's arena is
                // released by the time its caller hears of it; so does the memory reserved.
                drop(arena);
                drop((first_memory, replica_memory));
                let _ = tx.send(reply);
            })
            .await;
        });
        allocated
            .await
            .map_err(|_| ServerError::Internal("the load task vanished".into()))??;
        Ok(running)
    }

    /// Refuses worker calls until the start-up models are loaded, so that a worker reconnecting
    /// to a restarting server does not find its models missing.
    pub fn require_ready(&self) -> Result<(), ServerError> {
        if self.ready.load(std::sync::atomic::Ordering::SeqCst) {
            Ok(())
        } else {
            Err(ServerError::Starting)
        }
    }

    /// Whether requests are taken: the start-up models are loaded and shutdown has not begun
    /// (OIP `ServerReady`, `/v2/health/ready`).
    pub fn takes_requests(&self) -> bool {
        self.require_ready().is_ok() && !self.shutdown.is_cancelled()
    }

    /// Turns a refusal into its status, counting quota refusals.
    pub fn refuse(&self, e: ServerError) -> tonic::Status {
        if let ServerError::QuotaExceeded { tenant, quota, .. } = &e {
            self.metrics.quota_denied(tenant, quota);
        }
        e.into()
    }

    /// Reads the tenants file again (SIGHUP or `ReloadTenants`); on error the old tenants stay.
    pub fn reload_tenants(
        &self,
        trigger: &str,
    ) -> Result<Arc<crate::tenants::TenantTable>, ServerError> {
        let result = self
            .tenants
            .reload()
            .map_err(ServerError::from)
            .and_then(|t| t.ok_or(ServerError::NoTenantsFile));
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

    fn load_permit(&self) -> Result<OwnedSemaphorePermit, ServerError> {
        self.load_slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| ServerError::LimitExceeded {
                what: "loads running at once".into(),
                limit: self.config.max_concurrent_loads as u64,
                requested: self.config.max_concurrent_loads as u64 + 1,
            })
    }
}

/// A load whose arena is allocated: what the copy needs, on its blocking thread.
struct LoadCopy {
    registry: Arc<Registry>,
    metrics: Arc<crate::metrics::Metrics>,
    held: Arc<HeldStore>,
    threads: usize,
    /// Hash on the CPU too where the device checksums (`load_cpu_hash`).
    cpu_hash: bool,
    /// The server's chunk gate, shared with every other load.
    gate: Arc<loader::ChunkGate>,
    /// When the load was asked for, and how long its arena took to allocate (for the log).
    requested: std::time::Instant,
    allocate_seconds: f64,
    /// The CPUs of the device's NUMA node, where the machine has several.
    cpus: Option<Vec<usize>>,
    reservation: crate::registry::Reservation,
    src: source::ModelSource,
    plan: layout::Layout,
    files: Vec<record::FileId>,
    backend: BackendKind,
    /// The load slot, held until the load ends.
    _permit: OwnedSemaphorePermit,
}

impl LoadCopy {
    /// Fills `arena`, records the outcome, and returns the version as it then stands.
    fn run(self, arena: &modelshare_device::ArenaHandle) -> Result<VersionSnapshot, ServerError> {
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
                if let Some(record) = record {
                    let held = self.held.clone();
                    match tokio::runtime::Handle::try_current() {
                        Ok(rt) => drop(rt.spawn_blocking(move || held.remember(&record))),
                        Err(_) => held.remember(&record),
                    }
                }
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
                registry
                    .version_snapshot(&job.model, job.version)
                    .ok_or_else(|| ServerError::LoadCancelled {
                        model: job.model.clone(),
                        version: job.version,
                    })
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

    /// Finishes a load with memory adopted from a worker (`record`'s bytes, checked when the
    /// worker offered them): the version is ready with the record's checksums.
    fn adopted(self, record: &HeldRecord) -> Result<VersionSnapshot, ServerError> {
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
        self.registry
            .version_snapshot(&job.model, job.version)
            .ok_or_else(|| ServerError::LoadCancelled {
                model: job.model.clone(),
                version: job.version,
            })
    }

    /// Writes the held-memory record of the loaded version (kinds whose memory can outlive
    /// the server; a no-op otherwise).
    fn remember(&self, manifest: &crate::model::Manifest) {
        if let Some(record) = self.held_record(manifest) {
            self.held.remember(&record);
        }
    }

    /// The held-memory record of this version, where there is one to write (memory that can
    /// outlive the server, a held-records directory).
    fn held_record(&self, manifest: &crate::model::Manifest) -> Option<HeldRecord> {
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

/// The devices a load of `need` bytes goes to, first the one it is loaded on (see
/// [`crate::placement`]): those named, or the least used with room. With `ask_free`, asks
/// each device for its free memory (blocking, on its thread).
fn place(
    devices: &Devices,
    registry: &Registry,
    wanted: &crate::placement::Wanted,
    max_device_bytes: Option<u64>,
    need: u64,
    ask_free: bool,
) -> Result<Vec<modelshare_device::DeviceThread>, ServerError> {
    let held = registry.bytes_by_device();
    let candidates: Vec<crate::placement::Candidate> = devices
        .threads()
        .map(|d| crate::placement::Candidate {
            uuid: d.uuid().to_owned(),
            held_bytes: held.get(d.uuid()).copied().unwrap_or(0),
            // One device: `admit` says it better (NoRoom names the model and the memory).
            free_bytes: if ask_free && devices.len() > 1 {
                d.free_bytes()
                    .wait()
                    .ok()
                    .flatten()
                    .map(|free| free.saturating_sub(devices.reserved_bytes(d.uuid())))
            } else {
                None
            },
            limit: max_device_bytes,
        })
        .collect();
    crate::placement::place(wanted, &candidates, need)?
        .iter()
        .map(|uuid| {
            devices
                .get(uuid)
                .cloned()
                .ok_or_else(|| ServerError::Internal(format!("placement chose unknown {uuid}")))
        })
        .collect()
}

/// Where the held-memory records go: beside the handle socket (`<socket>.held/`).
pub fn records_dir(handle_socket: &std::path::Path) -> std::path::PathBuf {
    let mut name = handle_socket
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "modelshare-handles".into());
    name.push(".held");
    handle_socket.with_file_name(name)
}
