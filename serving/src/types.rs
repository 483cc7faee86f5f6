//! The values the request path passes around: its configuration, a request and its answer, a
//! worker's offer and how its stream ended, and the snapshot the admin API shows. A leaf of
//! `serving` besides the scheduler's types: the engine and the driver both import it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use modelshare_proto::v1 as pb;

use super::kind::Kind;
use super::scheduler::{Limits, Serves, Tenant, WorkerSpec};

/// The default [`EngineConfig::mailbox`].
pub const MAILBOX: usize = 4096;

/// Why the server ends a worker's Serve stream: the door turns it into its transport's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamError {
    /// The kind of failure.
    pub kind: Kind,
    /// What the worker is told.
    pub message: String,
}

impl StreamError {
    /// A stream ended with `kind` and `message`.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// How the request path behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Queue and quota limits, and the default queue delay.
    pub limits: Limits,
    /// Queue delay of particular models (the default is `limits.max_queue_delay`).
    pub queue_delays: HashMap<String, Duration>,
    /// Tenants' weights in the fair queues (the default is 1).
    pub tenant_weights: HashMap<String, u32>,
    /// How long a request for a model that no worker serves waits for one.
    pub no_worker_wait: Duration,
    /// The most new work (requests, worker results, Serve streams opening) waiting for the
    /// driver at once; past it a request is refused at once (UNAVAILABLE, retry after a
    /// second) and a worker's next result waits for room.
    pub mailbox: usize,
    /// Parts of one streamed item a worker may send before its caller has taken them (the
    /// stream's window, [`super::Engine::infer_stream`]).
    pub stream_window: u32,
    /// How the workers of one GPU share it.
    pub gpu_sharing: GpuSharing,
}

/// How the workers of one GPU share it (`[serving] gpu_sharing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuSharing {
    /// Measured per GPU: side by side or taking turns, whichever completes more
    /// (`driver::gpus`).
    #[default]
    Auto,
    /// Always side by side.
    SideBySide,
    /// Always taking turns.
    Turns,
}

/// Default of [`EngineConfig::stream_window`].
pub const STREAM_WINDOW: u32 = 16;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            queue_delays: HashMap::new(),
            tenant_weights: HashMap::new(),
            no_worker_wait: Duration::from_secs(5),
            mailbox: MAILBOX,
            stream_window: STREAM_WINDOW,
            gpu_sharing: GpuSharing::Auto,
        }
    }
}

/// A request as a front door hands it in.
#[derive(Debug, Clone)]
pub struct InferRequest {
    /// Who asks (`None`: the admin).
    pub tenant: Tenant,
    /// The model asked for.
    pub model: String,
    /// The items, each with its input and parameters (ids and deadlines are filled in here).
    pub items: Vec<pb::Item>,
    /// After this instant no item is dispatched and the request fails with DEADLINE_EXCEEDED.
    pub deadline: Instant,
    /// The tenant's own limit on requests outstanding, if its quota sets one.
    pub max_outstanding: Option<usize>,
    /// The OIP input the text items came from (a lone BYTES input), which a worker that
    /// declares its inputs must have declared; `None` for texts that name no input (OpenAI).
    pub text_input: Option<String>,
}

/// A computed request.
#[derive(Debug, Clone, PartialEq)]
pub struct InferResponse {
    /// The model.
    pub model: String,
    /// Each item's version (during a hot swap items of one request may be computed by two).
    pub versions: Vec<u32>,
    /// One output per item, in item order.
    pub outputs: Vec<pb::ItemOutput>,
}

/// Part of a streamed item's answer, as its worker sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// Its number among the item's parts, from 0.
    pub seq: u64,
    /// The part.
    pub output: pb::ItemOutput,
}

impl InferResponse {
    /// The version that computed the first item: the one a response names.
    pub fn version(&self) -> u32 {
        self.versions.first().copied().unwrap_or(0)
    }
}

/// A Serve stream's offer, as the Serve handler validated it.
#[derive(Debug, Clone)]
pub struct WorkerOffer {
    /// Model, version, credits, batch limits, and whose requests it may receive.
    pub spec: WorkerSpec,
    /// The stream's id, for logs and `modelshare ps`.
    pub serve_id: String,
    /// The session it belongs to.
    pub session_id: String,
    /// The session's tenant.
    pub tenant: Tenant,
    /// It takes text items.
    pub accepts_text: bool,
    /// It takes tensor items.
    pub accepts_tensors: bool,
    /// The inputs it declared.
    pub inputs: Vec<pb::TensorSpec>,
    /// The outputs it declared.
    pub outputs: Vec<pb::TensorSpec>,
    /// The GPU its weights are mapped on (its lease's device), `None` or `"host"` off a GPU:
    /// the workers of one GPU are dispatched to together (see `driver::workers`).
    pub device: Option<String>,
}

/// How a Serve stream ended, as its handler saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The worker closed its side (after a drain, or to stop): nothing of it is in flight, or
    /// what is goes back to the queue.
    Closed,
    /// The stream broke, the worker went silent, or its session ended.
    Lost,
}

/// One Serve stream, as `modelshare ps` and the admin API show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    /// The stream's id.
    pub serve_id: String,
    /// Its session.
    pub session_id: String,
    /// The session's tenant.
    pub tenant: Tenant,
    /// The model.
    pub model: String,
    /// The version.
    pub version: u32,
    /// Batches it takes at once.
    pub credits: u32,
    /// Batches it holds now.
    pub batches_in_flight: usize,
    /// Items it holds now.
    pub items_in_flight: usize,
    /// Batches it has answered.
    pub batches_done: u64,
    /// Whether it is draining.
    pub draining: bool,
    /// Whose requests it may receive.
    pub serves: Serves,
}

/// One model on the request path.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelServing {
    /// The model.
    pub model: String,
    /// Items queued.
    pub queued_items: usize,
    /// Serve streams of the model.
    pub workers: usize,
    /// The versions they serve, newest first, each once.
    pub versions: Vec<u32>,
    /// Inputs declared by a worker of the newest version.
    pub inputs: Vec<pb::TensorSpec>,
    /// Outputs declared by a worker of the newest version.
    pub outputs: Vec<pb::TensorSpec>,
}

/// The whole request path at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServingSnapshot {
    /// Every Serve stream.
    pub workers: Vec<WorkerInfo>,
    /// Every model with a queue or a worker, by name.
    pub models: Vec<ModelServing>,
    /// Requests outstanding (queued or in flight) per tenant, tenants with none left out.
    pub tenants: Vec<(Tenant, usize)>,
    /// Requests outstanding, over all tenants.
    pub outstanding: usize,
    /// Whether nothing is queued, in flight or counted against a tenant.
    pub drained: bool,
}

impl ServingSnapshot {
    /// The model's entry, if it has a queue or a worker.
    pub fn model(&self, name: &str) -> Option<&ModelServing> {
        self.models.iter().find(|m| m.model == name)
    }

    /// Whether a worker that takes batches (not draining) may receive `tenant`'s requests for
    /// `model` (of `version`, if given): the model is ready for that caller.
    pub fn ready_for(&self, model: &str, version: Option<u32>, tenant: &Tenant) -> bool {
        self.workers.iter().any(|w| {
            w.model == model
                && !w.draining
                && version.is_none_or(|v| w.version == v)
                && w.serves.admits(tenant)
        })
    }

    /// Requests `tenant` has outstanding.
    pub fn outstanding_for(&self, tenant: &Tenant) -> usize {
        self.tenants
            .iter()
            .find(|(t, _)| t == tenant)
            .map_or(0, |(_, n)| *n)
    }
}
