//! [`StageTimes`]: where a [`CudaBert`](super::CudaBert)'s GPU time goes, stage by stage, for a
//! breakdown of a worker's time (`modelshare-embed --profile-stages`). When it is on, each call
//! records a CUDA event after every stage (an event per mark, read once the call has waited for
//! its result) and adds the times between them here. Off, a call records nothing.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};

use crate::error::KernelError;

/// The stages of a call, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The group's ids, types and lengths copied up.
    Upload,
    /// The embedding layer (lookups, sum, LayerNorm).
    Embed,
    /// Per layer: the query, key and value products and the heads split.
    Projections,
    /// Per layer: scores, masked softmax and context (batched products over the padded group).
    Attention,
    /// Per layer: heads merged, the output product, bias, residual and LayerNorm.
    AttentionOutput,
    /// Per layer: the up product with bias and GELU, the down product, bias, residual and
    /// LayerNorm.
    FeedForward,
    /// Pooling (and normalizing), the copy down and the wait for it.
    Pool,
}

impl Stage {
    /// Every stage, in order.
    pub const ALL: [Stage; 7] = [
        Stage::Upload,
        Stage::Embed,
        Stage::Projections,
        Stage::Attention,
        Stage::AttentionOutput,
        Stage::FeedForward,
        Stage::Pool,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Upload => "upload",
            Stage::Embed => "embed",
            Stage::Projections => "qkv",
            Stage::Attention => "attention",
            Stage::AttentionOutput => "attn_out",
            Stage::FeedForward => "ffn",
            Stage::Pool => "pool+down",
        }
    }
}

/// GPU time per stage, summed over calls, with what the calls computed. The first call is
/// kept apart: its kernels are compiled and loaded as it runs.
#[derive(Clone, Debug, Default)]
pub struct StageTimes {
    /// Milliseconds of the first call, every stage together (`None` before it).
    pub first_call_ms: Option<f64>,
    /// Calls (groups) timed, the first left out.
    pub calls: u64,
    /// Sequences encoded.
    pub sequences: u64,
    /// Their tokens.
    pub tokens: u64,
    /// Tokens attention computed: sequences times their group's padded length (the other
    /// stages compute the packed tokens only).
    pub padded_tokens: u64,
    /// Milliseconds per stage, in [`Stage::ALL`]'s order.
    pub ms: [f64; 7],
}

impl StageTimes {
    /// Milliseconds of every stage together.
    pub fn total_ms(&self) -> f64 {
        self.ms.iter().sum()
    }

    /// One line: calls, tokens, padding, then each stage's milliseconds and share.
    pub fn report(&self) -> String {
        let total = self.total_ms().max(f64::MIN_POSITIVE);
        let stages: Vec<String> = Stage::ALL
            .iter()
            .zip(self.ms)
            .map(|(s, ms)| format!("{} {ms:.1} ms ({:.0}%)", s.name(), ms / total * 100.0))
            .collect();
        format!(
            "first group {:.1} ms (kernels loaded); then {} groups, {} sequences, {} tokens ({} in attention, {:.0}% padding there); GPU {total:.1} ms: {}",
            self.first_call_ms.unwrap_or(0.0),
            self.calls,
            self.sequences,
            self.tokens,
            self.padded_tokens,
            (1.0 - self.tokens as f64 / self.padded_tokens.max(1) as f64) * 100.0,
            stages.join(", ")
        )
    }
}

/// The events of one call: one at its start, then one after each stage run.
#[derive(Debug, Default)]
pub(super) struct Marks {
    events: Vec<(Stage, CudaEvent)>,
    start: Option<CudaEvent>,
}

impl Marks {
    /// Starts a call's marks on `stream`.
    pub(super) fn start(stream: &CudaStream) -> Result<Self, KernelError> {
        Ok(Self {
            events: Vec::new(),
            start: Some(stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?),
        })
    }

    /// Marks the end of `stage` on `stream`.
    pub(super) fn mark(&mut self, stream: &CudaStream, stage: Stage) -> Result<(), KernelError> {
        self.events.push((
            stage,
            stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
        ));
        Ok(())
    }

    /// Adds the call's times to `times` (every event has completed: the call waited for its
    /// result after the last).
    pub(super) fn add_to(
        self,
        times: &mut StageTimes,
        sequences: usize,
        tokens: usize,
        padded: usize,
    ) -> Result<(), KernelError> {
        let Some(mut previous) = self.start else {
            return Ok(());
        };
        let mut ms = [0.0; 7];
        for (stage, event) in self.events {
            ms[stage as usize] += f64::from(previous.elapsed_ms(&event)?);
            previous = event;
        }
        if times.first_call_ms.is_none() {
            times.first_call_ms = Some(ms.iter().sum());
            return Ok(());
        }
        for (total, ms) in times.ms.iter_mut().zip(ms) {
            *total += ms;
        }
        times.calls += 1;
        times.sequences += sequences as u64;
        times.tokens += tokens as u64;
        times.padded_tokens += padded as u64;
        Ok(())
    }
}
