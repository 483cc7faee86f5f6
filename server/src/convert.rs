//! Conversions between the domain types and the generated protobuf types. Requests that fail
//! to convert are `InvalidArgument`.

use modelshare_device::{BackendKind, DeviceInfo, Export, Handles};
use modelshare_proto::v1 as pb;

use modelshare_core::error::CoreError;
use modelshare_core::model::{Manifest, VersionState};
use modelshare_core::registry::{
    ModelSnapshot, SessionSnapshot, Stats, Usage, VersionSnapshot, WorkerHello,
};
use modelshare_core::tenants::policy::{self, Access};
use modelshare_core::tenants::{Caller, Quota, TenantTable};
use modelshare_core::weights::dtype::DType;
use modelshare_serving::engine::{ModelServing, WorkerInfo};

/// Longest worker name accepted in a hello.
pub const MAX_WORKER_NAME: usize = 128;
/// Most labels accepted in a hello.
pub const MAX_LABELS: usize = 32;
/// Longest label key or value.
pub const MAX_LABEL_LEN: usize = 128;

/// The protobuf dtype.
pub fn dtype(d: DType) -> pb::DType {
    match d {
        DType::Bool => pb::DType::DtypeBool,
        DType::U8 => pb::DType::DtypeU8,
        DType::I8 => pb::DType::DtypeI8,
        DType::I16 => pb::DType::DtypeI16,
        DType::U16 => pb::DType::DtypeU16,
        DType::F16 => pb::DType::DtypeF16,
        DType::BF16 => pb::DType::DtypeBf16,
        DType::I32 => pb::DType::DtypeI32,
        DType::U32 => pb::DType::DtypeU32,
        DType::F32 => pb::DType::DtypeF32,
        DType::F64 => pb::DType::DtypeF64,
        DType::I64 => pb::DType::DtypeI64,
        DType::U64 => pb::DType::DtypeU64,
        DType::F8E4M3 => pb::DType::DtypeF8E4m3,
        DType::F8E5M2 => pb::DType::DtypeF8E5m2,
        DType::F8E8M0 => pb::DType::DtypeF8E8m0,
        DType::C64 => pb::DType::DtypeC64,
    }
}

/// The protobuf version state.
pub fn state(s: VersionState) -> pb::VersionState {
    match s {
        VersionState::Loading => pb::VersionState::Loading,
        VersionState::Ready => pb::VersionState::Ready,
        VersionState::Draining => pb::VersionState::Draining,
        VersionState::Freed => pb::VersionState::Freed,
        VersionState::Failed => pb::VersionState::Failed,
    }
}

/// The protobuf device info.
pub fn device(d: &DeviceInfo) -> pb::DeviceInfo {
    let backend = match d.backend {
        BackendKind::Host => pb::BackendKind::Host,
        BackendKind::CudaIpc => pb::BackendKind::CudaIpc,
        BackendKind::CudaVmm => pb::BackendKind::CudaVmm,
    };
    pb::DeviceInfo {
        backend: backend.into(),
        uuid: d.uuid.clone(),
        name: d.name.clone(),
        total_bytes: d.total_bytes,
    }
}

/// The protobuf version info.
pub fn version(v: &VersionSnapshot) -> pb::VersionInfo {
    // A freed or failed version holds no arena anywhere.
    let held = v.state.holds_arena();
    pb::VersionInfo {
        version: v.version,
        state: state(v.state).into(),
        arena_bytes: v.arena_bytes,
        tensor_count: v.tensor_count,
        source: v.source.clone(),
        created_unix_ms: v.created_unix_ms,
        finished_unix_ms: v.finished_unix_ms,
        error: v.error.clone().unwrap_or_default(),
        leases: v.leases,
        bytes_loaded: v.bytes_loaded,
        bytes_total: v.bytes_total,
        devices: std::iter::once(v.device.clone())
            .chain(v.replicas.iter().filter(|r| r.1).map(|r| r.0.clone()))
            .filter(|_| held)
            .collect(),
        devices_copying: v
            .replicas
            .iter()
            .filter(|r| held && !r.1)
            .map(|r| r.0.clone())
            .collect(),
        shares_memory: v.shares_memory,
        content_sha256: v.content_sha256_text().unwrap_or_default(),
    }
}

/// The protobuf model info as `caller` may see it: redacted as [`policy::redact_model`] says
/// for a caller that does not own the model.
pub fn model_for(caller: &Caller, m: &ModelSnapshot) -> pb::ModelInfo {
    let mut info = model(m);
    let access = info.access.get_or_insert_default();
    policy::redact_model(
        m.owner.as_deref(),
        &mut access.shared_with,
        info.versions
            .iter_mut()
            .flat_map(|v| [&mut v.source, &mut v.error, &mut v.content_sha256]),
        caller,
    );
    if !policy::owns(m.owner.as_deref(), caller) {
        for v in &mut info.versions {
            v.shares_memory = false;
        }
    }
    info
}

/// The protobuf model info.
pub fn model(m: &ModelSnapshot) -> pb::ModelInfo {
    pb::ModelInfo {
        name: m.name.clone(),
        latest_ready: m.latest_ready,
        versions: m.versions.iter().map(version).collect(),
        owner: m.owner.clone().unwrap_or_default(),
        access: Some(access(&m.access)),
    }
}

/// The protobuf manifest.
pub fn manifest(m: &Manifest) -> pb::Manifest {
    pb::Manifest {
        model: m.model.clone(),
        version: m.version,
        arena_bytes: m.arena_bytes,
        alignment: m.alignment,
        tensors: m
            .tensors
            .iter()
            .map(|t| pb::TensorInfo {
                name: t.name.clone(),
                dtype: dtype(t.dtype).into(),
                shape: t.shape.clone(),
                offset: t.offset,
                byte_length: t.byte_length,
                xxh3: t.xxh3,
                ms64: t.ms64,
            })
            .collect(),
        header_metadata: m
            .header_metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        files: m
            .files
            .iter()
            .map(|(name, content)| pb::MetadataFile {
                name: name.clone(),
                content: content.clone(),
            })
            .collect(),
    }
}

/// A ticket filed for an export's descriptor, and where to redeem it.
#[derive(Debug, Clone)]
pub struct Ticket {
    /// The one-time ticket.
    pub ticket: String,
    /// The handle socket's path.
    pub handle_socket: String,
    /// How long the ticket is good for.
    pub ttl: std::time::Duration,
}

/// The wire name of a backend kind ("host", "cuda-ipc", "cuda-vmm"), as the CLI and the
/// metrics show it.
pub fn handles_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Host => "host",
        BackendKind::CudaIpc => "cuda-ipc",
        BackendKind::CudaVmm => "cuda-vmm",
    }
}

/// The attach reply's handle for `export` (whose descriptor, if any, was filed under
/// `ticket`): the one place that knows which `oneof` arm each kind of handle takes.
pub fn attach_handle(
    export: Export,
    ticket: Option<Ticket>,
) -> Result<pb::attach_response::Handle, CoreError> {
    let kind = export.kind();
    let missing = |what: &str| {
        CoreError::Internal(format!(
            "the backend exported a {kind:?} handle without {what}"
        ))
    };
    let Export {
        device_uuid,
        handles,
        alloc_len,
        ..
    } = export;
    Ok(match handles {
        Handles::Host => {
            let t = ticket.ok_or_else(|| missing("a descriptor"))?;
            pb::attach_response::Handle::Host(pb::HostArenaHandle {
                ticket: t.ticket,
                handle_socket: t.handle_socket,
                ticket_ttl_ms: u32::try_from(t.ttl.as_millis()).unwrap_or(u32::MAX),
            })
        }
        Handles::CudaIpc { memory, event } => {
            pb::attach_response::Handle::CudaIpc(pb::CudaIpcArenaHandle {
                mem_handle: memory,
                event_handle: event,
                device_uuid,
            })
        }
        Handles::CudaVmm { event } => {
            let t = ticket.ok_or_else(|| missing("a descriptor"))?;
            pb::attach_response::Handle::CudaVmm(pb::CudaVmmArenaHandle {
                ticket: t.ticket,
                handle_socket: t.handle_socket,
                ticket_ttl_ms: u32::try_from(t.ttl.as_millis()).unwrap_or(u32::MAX),
                event_handle: event,
                device_uuid,
                allocation_bytes: alloc_len,
            })
        }
    })
}

/// The protobuf stats: the registry's figures, with the device's (`used`: as the device
/// reports it, where known).
pub fn stats(s: &Stats, dev: &DeviceInfo, used: Option<u64>) -> pb::GetStatsResponse {
    pb::GetStatsResponse {
        device: Some(device(dev)),
        arena_bytes: s.arena_bytes,
        arenas: s.arenas,
        models: s.models,
        versions_by_state: s
            .versions_by_state
            .iter()
            .map(|(st, n)| pb::StateCount {
                state: state(*st).into(),
                count: *n,
            })
            .collect(),
        sessions: s.sessions,
        leases: s.leases,
        device_used_bytes: used.unwrap_or(0),
        tenants: Vec::new(),
        serving: Vec::new(),
        requests_outstanding: 0,
        held_by_workers_bytes: 0,
        devices: Vec::new(),
    }
}

/// The protobuf session info.
pub fn session(s: &SessionSnapshot) -> pb::SessionInfo {
    pb::SessionInfo {
        session_id: s.id.clone(),
        worker_name: s.hello.name.clone(),
        pid: s.hello.pid,
        labels: s
            .hello
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        opened_unix_ms: s.opened_unix_ms,
        leases: s
            .leases
            .iter()
            .map(|(id, model, version, device)| pb::LeaseInfo {
                lease_id: id.clone(),
                model: model.clone(),
                version: *version,
                device_uuid: device.clone(),
            })
            .collect(),
        tenant: s.tenant.clone().unwrap_or_default(),
        serving: Vec::new(),
    }
}

/// A Serve stream as the admin API shows it.
pub fn serve_stream(w: &WorkerInfo) -> pb::ServeStreamInfo {
    let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    pb::ServeStreamInfo {
        serve_id: w.serve_id.clone(),
        model: w.model.clone(),
        version: w.version,
        credits: w.credits,
        batches_in_flight: n(w.batches_in_flight),
        items_in_flight: n(w.items_in_flight),
        batches_done: w.batches_done,
        draining: w.draining,
    }
}

/// One model's request path as the admin API shows it.
pub fn model_serving(m: &ModelServing) -> pb::ModelServingStats {
    pb::ModelServingStats {
        model: m.model.clone(),
        queued_items: u32::try_from(m.queued_items).unwrap_or(u32::MAX),
        serving_workers: u32::try_from(m.workers).unwrap_or(u32::MAX),
        versions: m.versions.clone(),
    }
}

/// A worker's hello, checked: its name and labels within their limits.
pub fn worker_hello(h: pb::Hello) -> Result<WorkerHello, CoreError> {
    let invalid = |field: &str, reason: String| CoreError::InvalidArgument {
        field: field.into(),
        reason,
    };
    if h.worker_name.len() > MAX_WORKER_NAME {
        return Err(invalid(
            "hello.worker_name",
            format!(
                "{} bytes, over the limit of {MAX_WORKER_NAME}",
                h.worker_name.len()
            ),
        ));
    }
    if h.labels.len() > MAX_LABELS {
        return Err(invalid(
            "hello.labels",
            format!("{} labels, over the limit of {MAX_LABELS}", h.labels.len()),
        ));
    }
    if let Some((k, _)) = h
        .labels
        .iter()
        .find(|(k, v)| k.len() > MAX_LABEL_LEN || v.len() > MAX_LABEL_LEN)
    {
        return Err(invalid(
            "hello.labels",
            format!(
                "label '{}' is over the limit of {MAX_LABEL_LEN} bytes",
                k.chars().take(32).collect::<String>()
            ),
        ));
    }
    Ok(WorkerHello {
        name: h.worker_name,
        pid: h.pid,
        labels: h.labels.into_iter().collect(),
        peer_pid: None,
        peer_start: None,
    })
}

/// The protobuf model access.
pub fn access(a: &Access) -> pb::ModelAccess {
    pb::ModelAccess {
        shared_with: a.shared_with.iter().cloned().collect(),
        public: a.public,
    }
}

/// A requested access, every tenant named checked against `table`.
pub fn access_from(a: pb::ModelAccess, table: &TenantTable) -> Result<Access, CoreError> {
    if a.shared_with.len() > modelshare_core::tenants::file::MAX_TENANTS {
        return Err(CoreError::InvalidArgument {
            field: "access.shared_with".into(),
            reason: format!(
                "{} tenants, more than the limit of {}",
                a.shared_with.len(),
                modelshare_core::tenants::file::MAX_TENANTS
            ),
        });
    }
    let mut shared_with = std::collections::BTreeSet::new();
    for t in a.shared_with {
        if !table.tenants.contains_key(&t) {
            return Err(CoreError::UnknownTenant(t.escape_debug().to_string()));
        }
        shared_with.insert(t);
    }
    Ok(Access {
        shared_with,
        public: a.public,
    })
}

/// The protobuf usage of one tenant.
pub fn tenant_usage(
    name: &str,
    used: Usage,
    inflight: u32,
    requests: usize,
    quota: Quota,
) -> pb::TenantUsage {
    pb::TenantUsage {
        name: name.to_owned(),
        device_bytes: used.device_bytes,
        models: used.models,
        sessions: used.sessions,
        leases: used.leases,
        inflight,
        loads: used.loads,
        requests: u32::try_from(requests).unwrap_or(u32::MAX),
        quota: Some(pb::TenantQuota {
            device_bytes: quota.device_bytes.unwrap_or(0),
            models: quota.models.unwrap_or(0),
            sessions: quota.sessions.unwrap_or(0),
            leases: quota.leases.unwrap_or(0),
            inflight: quota.inflight.unwrap_or(0),
            loads: quota.loads.unwrap_or(0),
            requests: quota.requests.unwrap_or(0),
            max_tokens: quota.max_tokens.unwrap_or(0),
            prompt_tokens: quota.prompt_tokens.unwrap_or(0),
            stop_strings: quota.stop_strings.unwrap_or(0),
        }),
    }
}
