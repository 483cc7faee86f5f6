//! [`CudaBert`]: the encoder on the GPU, made over an arena's weights, and its call.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream, PinnedHostSlice};
use modelshare_device::Mapping;

use super::buffers::Buffers;
use super::graphs::{Graphs, launch_shape};
use super::pack::{Group, Packed, Padding, Tokens, input_ints, pack};
use super::placement::{Placed, place};
use super::sizes::{Dims, Limits, buffer_tokens, check_dims, padded_len};
use super::stages::{Marks, Stage, StageTimes};
use super::weights::EncoderWeights;
use crate::blas::Blas;
use crate::error::KernelError;
use crate::{KernelCache, WeightDtype, sys};

/// A BERT encoder on the GPU holding an arena.
#[derive(Debug)]
pub struct CudaBert {
    pub(super) dims: Dims,
    limits: Limits,
    pub(super) dtype: WeightDtype,
    /// Absolute device addresses of the weights (checked inside `_arena`).
    pub(super) weights: EncoderWeights<u64>,
    /// Keeps the arena (and so every address in `weights`) alive.
    _arena: Mapping,
    pub(super) stream: Arc<CudaStream>,
    pub(super) blas: Blas,
    pub(super) cache: KernelCache,
    pub(super) buffers: Buffers,
    /// Attention in one kernel over the packed projections
    /// ([`crate::encoder::attention_packed`]): f16/bf16, a head size it is built for, sm_80
    /// or newer.
    pub(super) fused_attention: bool,
    /// The stages' GPU time, once [`CudaBert::time_stages`] asked for it.
    stages: Option<StageTimes>,
    /// Page-locked host memory the pooled vectors are copied into, `[max_sequences, hidden]`
    /// f32: the copies down are queued behind each group's work, and read after one wait.
    pinned: PinnedHostSlice<f32>,
    /// Page-locked host memory the groups' integer inputs are staged in for their copies up
    /// (asynchronous, one per group), room for [`STAGED_GROUPS`] full groups between waits.
    pub(super) staging: PinnedHostSlice<i32>,
    /// Recorded behind the queued groups and waited for with the thread asleep (a blocking
    /// sync event): a stream's own wait spins a core for as long as the GPU works, and a
    /// worker's compute slots would spin one each, cores its tokenization, the server and the
    /// other workers of the machine need.
    done: CudaEvent,
    /// Tokens the activation buffers hold (what a launch shape may reach).
    buffer_tokens: usize,
    /// The forward pass's graphs by launch shape: `Some` while they are used (the fused
    /// attention, whose buffers are all per token, and not turned off).
    pub(super) graphs: Option<Graphs>,
    /// Why graphs were turned off after a capture failed, until [`CudaBert::graphs_failure`]
    /// takes it.
    pub(super) graphs_failure: Option<String>,
    /// Graphs captured so far (kept or since dropped).
    pub(super) captured: usize,
}

/// Full-size groups whose inputs the staging holds at once (a job's groups are mostly far
/// smaller; when they do not fit, the queued ones are waited for first).
const STAGED_GROUPS: usize = 4;

/// A group queued on the stream: where its vectors land in the pinned memory, how many, and
/// its stage marks.
struct Queued {
    offset: usize,
    sequences: usize,
    tokens: usize,
    computed: usize,
    marks: Option<Marks>,
}

impl CudaBert {
    /// An encoder over `weights` (placed in `arena`, of `dtype`), on the arena's device and
    /// context, which is bound to the calling thread. Checks every tensor's size against
    /// `dims` and its range against the arena, makes a stream that waits for the arena's
    /// load, and allocates the buffers.
    pub fn new(
        arena: &Mapping,
        weights: &EncoderWeights<Placed>,
        dtype: WeightDtype,
        dims: Dims,
        limits: Limits,
    ) -> Result<Self, KernelError> {
        sys::driver_available()?;
        let (Some(base), Some(ctx)) = (arena.device_ptr(), arena.context()) else {
            return Err(KernelError::bad("the arena is not in device memory"));
        };
        check_dims(&dims, &limits)?;
        let weights = place(arena, base, weights, dtype, &dims)?;
        ctx.bind_to_thread()?;
        let stream = ctx.new_stream()?;
        arena
            .wait_ready(&stream)
            .map_err(|e| KernelError::bad(format!("cannot wait for the arena's load: {e}")))?;
        let blas = Blas::new(stream.clone())?;
        let es = dtype.size_bytes();
        let cache = KernelCache::new();
        let major = cache.device_info(ctx)?.major;
        let fused_attention =
            crate::encoder::attention_supported(dtype, dims.hidden / dims.heads, major);
        let buffers = Buffers::new(&stream, &dims, &limits, es, fused_attention)?;
        // SAFETY: the memory is unset until a copy down writes it; `encode_groups` reads only
        // the rows its copies wrote, after waiting for them. Not write-combined: it is read.
        let pinned =
            unsafe { ctx.alloc_pinned_with_flags::<f32>(limits.max_sequences * dims.hidden, 0)? };
        let tokens = buffer_tokens(&dims, &limits, es)?;
        let group_ints = input_ints(tokens, limits.max_sequences);
        // SAFETY: the memory is unset until `upload` writes a group's range, which it then
        // copies up. Write-combined: the host only writes it, the device only reads it.
        let staging = unsafe {
            ctx.alloc_pinned_with_flags::<i32>(
                STAGED_GROUPS * group_ints,
                cudarc::driver::sys::CU_MEMHOSTALLOC_WRITECOMBINED,
            )?
        };
        let done = ctx.new_event(Some(
            cudarc::driver::sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC,
        ))?;
        Ok(Self {
            dims,
            limits,
            dtype,
            weights,
            _arena: arena.clone(),
            stream,
            blas,
            cache,
            fused_attention,
            buffers,
            stages: None,
            pinned,
            staging,
            done,
            buffer_tokens: tokens,
            graphs: fused_attention.then(Graphs::default),
            graphs_failure: None,
            captured: 0,
        })
    }

    /// Whether the forward pass is replayed as CUDA graphs (the default where the fused
    /// attention runs; see [`super::graphs`]): `false` launches each kernel every call.
    pub fn use_graphs(&mut self, on: bool) {
        self.graphs = (on && self.fused_attention).then(Graphs::default);
    }

    /// Graphs captured so far (one per launch shape, again for a shape whose graph was
    /// dropped to keep at most 64).
    pub fn graphs_captured(&self) -> usize {
        self.captured
    }

    /// Why graphs were turned off, once: a capture failed, and calls since launch each kernel.
    pub fn graphs_failure(&mut self) -> Option<String> {
        self.graphs_failure.take()
    }

    /// The shape `g` is launched at: bucketed while graphs are in use, else (and while stages
    /// are timed, which launches each kernel) its own.
    fn launch_shape(&self, g: Group) -> Group {
        if self.graphs.is_none() || self.stages.is_some() {
            return g;
        }
        let d = &self.dims;
        let s = padded_len(self.limits.max_seq_len, d.max_positions - d.position_offset);
        launch_shape(g, self.buffer_tokens, self.limits.max_sequences, s)
    }

    /// From now on, times each stage of every call on the GPU (an event after each; see
    /// [`CudaBert::stage_times`]).
    pub fn time_stages(&mut self) {
        self.stages.get_or_insert_with(StageTimes::default);
    }

    /// The stages' GPU time so far, if [`CudaBert::time_stages`] turned timing on.
    pub fn stage_times(&self) -> Option<&StageTimes> {
        self.stages.as_ref()
    }

    /// The limits the buffers were sized for.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Whether a group's sequences are padded to its longest, so that `max_tokens` bounds
    /// its sequences × their padded length: only without the fused attention (whose
    /// buffers are all per real token; its kernel skips the padding), else `max_tokens`
    /// bounds the sum of the lengths, and a group's lengths may differ as they will.
    pub fn pads(&self) -> bool {
        self.padding() == Padding::Padded
    }

    fn padding(&self) -> Padding {
        if self.fused_attention {
            Padding::Packed
        } else {
            Padding::Padded
        }
    }

    /// The pooled vectors of `seqs`, row-major `[seqs.len(), hidden]` f32. The group must fit
    /// the limits (sequences of 1 to `max_seq_len` tokens; their count times the longest at
    /// most `max_tokens`), ids inside the vocabularies. Blocks until the result is on the host.
    pub fn encode(&mut self, seqs: &[Tokens<'_>]) -> Result<Vec<f32>, KernelError> {
        Ok(self.encode_groups(&[seqs])?.pop().unwrap_or_default())
    }

    /// The pooled vectors of each group, as [`CudaBert::encode`] gives them, with the groups
    /// queued one after the other on the stream (each group's copy down into page-locked
    /// memory behind its work) and one wait for as many as the pinned rows hold: the GPU goes
    /// from one group to the next without waiting on the host. Blocks until every result is on
    /// the host.
    pub fn encode_groups(
        &mut self,
        groups: &[&[Tokens<'_>]],
    ) -> Result<Vec<Vec<f32>>, KernelError> {
        let mut out = Vec::with_capacity(groups.len());
        let result = self.queue_groups(groups, &mut out);
        if result.is_err() {
            // Queued copies may still read the staging that the next call writes: wait for
            // them (their results are dropped with the error).
            let _ = self.stream.synchronize();
        }
        result.map(|()| out)
    }

    /// The body of [`CudaBert::encode_groups`], its vectors appended to `out`; on an error,
    /// groups may still be queued.
    fn queue_groups(
        &mut self,
        groups: &[&[Tokens<'_>]],
        out: &mut Vec<Vec<f32>>,
    ) -> Result<(), KernelError> {
        let h = self.dims.hidden;
        let mut queued: Vec<Queued> = Vec::new();
        // Rows of the pinned output and ints of the staging taken by the queued groups.
        let (mut offset, mut staged) = (0, 0);
        for seqs in groups {
            let Some(packed) = pack(self.dims, self.limits, self.padding(), seqs)? else {
                self.collect(&mut queued, out)?;
                out.push(Vec::new());
                (offset, staged) = (0, 0);
                continue;
            };
            let b = packed.group.b;
            let launch = self.launch_shape(packed.group);
            let ints = input_ints(launch.t, launch.b);
            if offset + b > self.limits.max_sequences || staged + ints > self.staging.len() {
                self.collect(&mut queued, out)?;
                (offset, staged) = (0, 0);
            }
            let marks = self.queue(&packed, launch, offset * h, staged)?;
            staged += ints;
            queued.push(Queued {
                offset,
                sequences: b,
                tokens: packed.lengths.iter().map(|&l| l as usize).sum(),
                computed: packed.group.b * packed.group.s,
                marks,
            });
            offset += b;
        }
        self.collect(&mut queued, out)
    }

    /// Waits for the queued groups and appends their vectors to `out`, in order.
    fn collect(
        &mut self,
        queued: &mut Vec<Queued>,
        out: &mut Vec<Vec<f32>>,
    ) -> Result<(), KernelError> {
        if queued.is_empty() {
            return Ok(());
        }
        self.done.record(&self.stream)?;
        self.done.synchronize()?;
        let h = self.dims.hidden;
        // The copies down were queued on this stream, which has just been waited for.
        let rows = self.pinned.as_slice()?;
        for q in queued.drain(..) {
            out.push(rows[q.offset * h..(q.offset + q.sequences) * h].to_vec());
            if let (Some(marks), Some(times)) = (q.marks, self.stages.as_mut()) {
                marks.add_to(times, q.sequences, q.tokens, q.computed)?;
            }
        }
        Ok(())
    }

    /// Queues one packed group at its launch shape `launch`: its inputs up, the forward pass
    /// (replayed as a graph when graphs are in use and no stage is timed), and the copy of its
    /// vectors down into the pinned rows from `at` (elements); returns its stage marks.
    fn queue(
        &mut self,
        packed: &Packed,
        launch: Group,
        at: usize,
        staged: usize,
    ) -> Result<Option<Marks>, KernelError> {
        let mut marks = match self.stages {
            Some(_) => Some(Marks::start(&self.stream)?),
            None => None,
        };
        let stream = self.stream.clone();
        let mut mark = |stage: Stage| match marks.as_mut() {
            Some(m) => m.mark(&stream, stage),
            None => Ok(()),
        };
        self.upload(packed, launch, staged)?;
        mark(Stage::Upload)?;
        if self.stages.is_none() {
            self.replay(launch)?;
        } else {
            self.forward(launch, &mut mark)?;
        }
        // The pinned memory's own event is never recorded (it is only used here), so taking
        // its pointer does not wait.
        let rows = (self.pinned.as_mut_ptr()?, self.pinned.len());
        self.copy_down(packed.group.b, rows, at)?;
        mark(Stage::Pool)?;
        Ok(marks)
    }
}
