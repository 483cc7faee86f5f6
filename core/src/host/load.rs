//! The one path a load takes, shared by `LoadModel` and the start-up models: admission on the
//! caller's task (name, quotas, a load slot), validation and placement on a blocking thread
//! ([`Admission::admit`]), then a task that allocates the arena, adopts kept memory or copies
//! the files ([`super::copy`]), and copies the replicas.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use modelshare_device::{BackendKind, DeviceThread};
use tokio::sync::oneshot;

use super::Host;
use super::copy::LoadCopy;
use crate::devices::{Devices, MemoryReservation};
use crate::error::CoreError;
use crate::held::record;
use crate::loader;
use crate::model::validate_name;
use crate::placement::{Candidate, Wanted};
use crate::registry::{
    LoadClaim, LoadFor, LoadProgress, Registry, Reservation, SharedArena, VersionSnapshot,
};
use crate::tenants::Caller;
use crate::weights::{layout, source};

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
    pub done: oneshot::Receiver<Result<VersionSnapshot, CoreError>>,
}

impl Host {
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
    ) -> Result<RunningLoad, CoreError> {
        let requested = Instant::now();
        validate_name(name)?;
        // A new version of a model loaded under another case is that model's.
        let name = &self.registry.canonical(caller, name);
        let quota_of = |t: &str| self.tenants.quota_of(t).unwrap_or_default();
        // The tenant's `loads` and `models` quotas first, counting its loads admitted and not yet
        // reserved: a tenant at its quota never holds one of the server's load slots.
        let claim = self
            .registry
            .authorize_load(caller, &load_for, &quota_of, name)?;
        let permit = self.load_permit()?;
        let only_adopted = load_for.only_adopted;
        let admission = self.admission(caller, load_for, name, path, keep_previous, claim);
        // Validation reads files, and placement asks the devices for their free memory: it
        // blocks.
        let admitted = tokio::task::spawn_blocking(move || admission.admit())
            .await
            .map_err(|e| CoreError::Internal(format!("validation task failed: {e}")))??;
        let Admitted {
            reservation,
            src,
            plan,
            files,
            placed,
            memory,
            share,
        } = admitted;
        let mut placed = placed.into_iter();
        let device = placed
            .next()
            .ok_or_else(|| CoreError::Internal("a load placed on no device".into()))?;
        let (tx, done) = oneshot::channel();
        let running = RunningLoad {
            version: reservation.version,
            bytes_total: plan.payload_bytes,
            tensor_count: u32::try_from(plan.tensors.len()).unwrap_or(u32::MAX),
            progress: reservation.progress.clone(),
            done,
        };
        let copy = LoadCopy {
            registry: self.registry.clone(),
            metrics: self.metrics.clone(),
            held: self.held.clone(),
            threads: self.config.load_threads,
            cpu_hash: self.config.load_cpu_hash,
            share_identical: self.config.share_identical,
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
        // From here the load runs to its end whether or not the caller still listens: the
        // arena is allocated on the device thread (outside the registry's lock), then filled.
        let (allocated_tx, allocated) = oneshot::channel();
        let job = LoadTask {
            copy,
            device,
            replicas: placed.collect(),
            memory,
            only_adopted,
            share,
            devices: self.devices.clone(),
            allocated: allocated_tx,
            done: tx,
        };
        tokio::spawn(job.run());
        allocated
            .await
            .map_err(|_| CoreError::Internal("the load task vanished".into()))??;
        Ok(running)
    }

    /// What the blocking part of a load needs, taken from the host and the caller.
    fn admission(
        &self,
        caller: &Caller,
        load_for: LoadFor,
        name: &str,
        path: &str,
        keep_previous: bool,
        claim: LoadClaim,
    ) -> Admission {
        // A tenant with a model directory loads from under it only (symlinks out of it are
        // refused as they are out of the root); other tenants' model directories are out of
        // bounds for a tenant, with or without a directory of its own.
        let (tenant_dir, reserved) = match caller.tenant() {
            Some(me) => {
                let table = self.tenants.current();
                let own = table.tenants.get(me).and_then(|t| t.model_dir.clone());
                let others: Vec<PathBuf> = table
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
        Admission {
            host: self.clone(),
            root,
            tenant_dir,
            reserved,
            rel: path.to_owned(),
            model: name.to_owned(),
            caller: caller.clone(),
            load_for,
            keep_previous,
            claim,
        }
    }
}

/// A load on its way to admission, on a blocking thread.
struct Admission {
    /// The host (cheap to clone: its parts are shared).
    host: Host,
    root: PathBuf,
    tenant_dir: Option<String>,
    /// Other tenants' model directories: missing, for this load.
    reserved: Vec<PathBuf>,
    rel: String,
    model: String,
    caller: Caller,
    load_for: LoadFor,
    keep_previous: bool,
    claim: LoadClaim,
}

/// An admitted load: its reservation, validated source and plan, the devices it goes to (the
/// first one loaded, the others replicas) and the memory reserved on them.
struct Admitted {
    reservation: Reservation,
    src: source::ModelSource,
    plan: layout::Layout,
    files: Vec<record::FileId>,
    placed: Vec<DeviceThread>,
    memory: Vec<MemoryReservation>,
    /// Memory of a version with the same layout, to take if the files hold its bytes.
    share: Option<SharedArena>,
}

impl Admission {
    /// Validates the source, plans the arena, places it and reserves it (blocking).
    fn admit(self) -> Result<Admitted, CoreError> {
        let Self {
            host,
            root,
            tenant_dir,
            reserved,
            rel,
            model,
            caller,
            mut load_for,
            keep_previous,
            claim,
        } = self;
        // Other tenants' directories count as missing for every file the load reads (the path
        // asked for, the index, shards, metadata files, and links among them), before anything
        // there is opened: the answer is exactly that of a missing path.
        let Host {
            registry,
            tenants,
            devices,
            held,
            config,
            ..
        } = &host;
        let mut src = source::resolve_denying(&root, &rel, &config.weights, &reserved)?;
        if let Some(dir) = &tenant_dir {
            // Reported relative to the model root, like every other source.
            src.source = format!("{dir}/{}", src.source);
        }
        let plan = layout::plan(&src)?;
        if plan.tensors.is_empty() {
            return Err(CoreError::InvalidArgument {
                field: "path".into(),
                reason: format!("'{rel}' holds no tensors: nothing to share"),
            });
        }
        let manifest = loader::manifest(&model, &src, &plan);
        let files = record::file_ids(&src);
        let hint = held.version_hint(&model, &src.source);
        // Before the version is registered (and looks loaded from its files to an offer).
        held.mark_claimed(&manifest, &files);
        if load_for.resume_version.is_none() {
            load_for.resume_version = hint;
        }
        // Memory a version of the same layout holds, which the load takes if its files hold
        // the same bytes: on its device, so the load needs no free memory (unless the bytes
        // differ, when it reserves and copies as any other).
        let share = if hint.is_none() && !load_for.only_adopted {
            arenas_to_share(&host, &caller, &load_for, &manifest)
                .into_iter()
                .find(|s| loader::sample_matches(&s.arena, &src, &plan))
        } else {
            None
        };
        // A load that may adopt memory workers kept needs no free memory: those bytes are on
        // the device already, and count as used there (as they do for `admit` below).
        let placed = match share.as_ref().and_then(|s| devices.get(&s.device)) {
            Some(device) => vec![device.clone()],
            None => place(
                devices,
                registry,
                &load_for.placement,
                config.max_device_bytes,
                manifest.arena_bytes,
                hint.is_none(),
            )?,
        };
        let uuids: Vec<String> = placed.iter().map(|d| d.uuid().to_owned()).collect();
        // Refused before anything is allocated when the memory is not there, counting the
        // loads in progress (a load that may adopt memory workers kept, or share memory,
        // needs none). Each device placed is reserved: the host's stand-ins are one memory.
        let memory = if hint.is_none() && share.is_none() {
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
            share.is_some(),
        )?;
        Ok(Admitted {
            reservation,
            src,
            plan,
            files,
            placed,
            memory,
            share,
        })
    }
}

/// The memory a load of `manifest` may share ([`Registry::arenas_to_share`]), where the load
/// wants one copy: on the device it names, else wherever that memory is.
fn arenas_to_share(
    host: &Host,
    caller: &Caller,
    load_for: &LoadFor,
    manifest: &crate::model::Manifest,
) -> Vec<SharedArena> {
    let wanted = &load_for.placement;
    if wanted.replicas > 1 || wanted.devices.len() > 1 {
        return Vec::new();
    }
    let on = if wanted.devices.is_empty() {
        None
    } else {
        // The device named, by UUID or index, whatever room it has.
        let named = place(
            &host.devices,
            &host.registry,
            wanted,
            None,
            manifest.arena_bytes,
            false,
        );
        match named.ok().as_deref() {
            Some([device, ..]) => Some(device.uuid().to_owned()),
            _ => return Vec::new(),
        }
    };
    let mut found = host.registry.arenas_to_share(
        caller,
        load_for,
        manifest,
        host.config.share_identical,
        on.as_deref(),
    );
    found.retain(|s| host.devices.get(&s.device).is_some());
    found
}

/// An admitted load's task: adopts the memory a worker kept, or allocates the arena and
/// copies the files, then the replicas; says when the arena is in (`allocated`) and when the
/// load ends (`done`).
struct LoadTask {
    copy: LoadCopy,
    device: DeviceThread,
    replicas: Vec<DeviceThread>,
    /// The first device's reservation, and the replicas'; given back as the load ends (on
    /// every path, as they drop).
    memory: Vec<MemoryReservation>,
    only_adopted: bool,
    /// Memory to take instead of a copy, if the files hold its bytes.
    share: Option<SharedArena>,
    devices: Arc<Devices>,
    allocated: oneshot::Sender<Result<(), CoreError>>,
    done: oneshot::Sender<Result<VersionSnapshot, CoreError>>,
}

impl LoadTask {
    async fn run(self) {
        // Memory a worker kept across a restart, if it is these bytes: adopted, not loaded.
        if let Some((arena, record)) = self
            .copy
            .held
            .claim(&self.copy.reservation.manifest, &self.copy.files)
            .await
        {
            return self.adopt(arena, record).await;
        }
        let Self {
            mut copy,
            device,
            replicas,
            mut memory,
            only_adopted,
            share,
            devices,
            allocated,
            done,
        } = self;
        // Told once the arena is in, or why it is not; taken by a load that shared memory's
        // comparison (which its caller follows instead), after which a failure goes to `done`.
        let mut allocated = Some(allocated);
        if only_adopted {
            let r = &copy.reservation;
            let err = CoreError::FilesChanged {
                model: r.model.clone(),
                version: r.version,
            };
            copy.registry
                .finish_load(&r.model, r.version, Err(err.to_string()));
            if let Some(tx) = allocated {
                let _ = tx.send(Err(err));
            }
            return;
        }
        if let Some(shared) = share {
            // Started: the caller follows the comparison's progress, and hears the outcome
            // when the load ends.
            if let Some(tx) = allocated.take() {
                let _ = tx.send(Ok(()));
            }
            let rule = copy.share_identical;
            copy = match super::share::take(copy, shared, rule, &devices, &device).await {
                super::share::Outcome::Done(reply) => {
                    let _ = done.send(reply);
                    return;
                }
                super::share::Outcome::Copy(taken, reservation) => {
                    memory = vec![reservation];
                    *taken
                }
            };
        }
        let label = format!("{}@{}", copy.reservation.model, copy.reservation.version);
        let allocating = Instant::now();
        let arena = match device
            .allocate(copy.reservation.manifest.arena_bytes, &label)
            .await
        {
            Ok(arena) => arena,
            Err(e) => {
                let err = CoreError::Device(e);
                let r = &copy.reservation;
                copy.registry
                    .finish_load(&r.model, r.version, Err(err.to_string()));
                match allocated {
                    Some(tx) => drop(tx.send(Err(err))),
                    None => drop(done.send(Err(err))),
                }
                return;
            }
        };
        let mut memory = memory.into_iter();
        let first_memory = memory.next();
        let replica_memory: Vec<MemoryReservation> = memory.collect();
        // Memory that allocation takes at once (CUDA) is in the device's free figure now;
        // a host arena's pages are taken as the copy writes them, so its reservation
        // stays until the load ends.
        let first_memory = match copy.backend {
            BackendKind::Host => first_memory,
            BackendKind::CudaVmm | BackendKind::CudaIpc => None,
        };
        copy.allocate_seconds = allocating.elapsed().as_secs_f64();
        let r = &copy.reservation;
        copy.registry.set_arena(&r.model, r.version, arena.clone());
        if let Some(tx) = allocated {
            let _ = tx.send(Ok(()));
        }
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
            let _ = done.send(reply);
        })
        .await;
    }

    /// Finishes the load with the memory a worker kept (`record`'s bytes), then copies the
    /// replicas from it.
    async fn adopt(self, arena: modelshare_device::ArenaHandle, record: record::HeldRecord) {
        let mut copy = self.copy;
        let key = copy.reservation.key();
        let (model, version) = (key.model.clone(), key.version);
        copy.registry.set_arena(&model, version, arena.clone());
        // The memory is on the device the worker kept it on: that one is the version's
        // first, whatever placement chose; the other devices placed get the replicas.
        let targets: Vec<DeviceThread> = copy
            .registry
            .adopted_on(&key, &record.device_uuid)
            .iter()
            .filter_map(|uuid| self.devices.get(uuid).cloned())
            .collect();
        record.device_uuid.clone_into(&mut copy.reservation.device);
        let _ = self.allocated.send(Ok(()));
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
        let _ = self.done.send(reply);
        drop(arena);
    }
}

/// The devices a load of `need` bytes goes to, first the one it is loaded on (see
/// [`crate::placement`]): those named, or the least used with room. With `ask_free`, asks
/// each device for its free memory (blocking, on its thread).
fn place(
    devices: &Devices,
    registry: &Registry,
    wanted: &Wanted,
    max_device_bytes: Option<u64>,
    need: u64,
    ask_free: bool,
) -> Result<Vec<DeviceThread>, CoreError> {
    let held = registry.bytes_by_device();
    let candidates: Vec<Candidate> = devices
        .threads()
        .map(|d| Candidate {
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
                .ok_or_else(|| CoreError::Internal(format!("placement chose unknown {uuid}")))
        })
        .collect()
}
