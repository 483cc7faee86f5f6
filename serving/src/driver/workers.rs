//! The driver's side of workers: Serve streams opened, ended, drained; their results; and
//! the batches handed to every worker with a credit.

use std::collections::HashMap;
use std::time::Instant;

use modelshare_proto::v1 as pb;
use tracing::{info, warn};

use super::*;
use crate::ids::Serves;

impl Driver {
    pub(super) fn open_worker(&mut self, id: WorkerId, offer: WorkerOffer, events: Events) {
        if self.shutting_down {
            let _ = events.send(Err(StreamError::new(
                Kind::Unavailable,
                "the server is shutting down",
            )));
            return;
        }
        if !self.sched.register_worker(id, offer.spec.clone()) {
            let _ = events.send(Err(StreamError::new(Kind::Internal, "worker id taken")));
            return;
        }
        info!(serve = %offer.serve_id, session = %offer.session_id, model = %offer.spec.model,
              version = offer.spec.version, credits = offer.spec.credits, "worker serving");
        self.dirty.insert(offer.spec.model.clone());
        self.conns.insert(
            id,
            Conn {
                offer,
                events,
                batches: HashMap::new(),
                batches_done: 0,
                draining: false,
            },
        );
    }

    pub(super) fn ended(&mut self, id: WorkerId, end: StreamEnd) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        let held: usize = conn.batches.values().map(|b| b.items.len()).sum();
        if held > 0 || end == StreamEnd::Lost {
            warn!(serve = %conn.offer.serve_id, model = %conn.offer.spec.model, items_in_flight = held,
                  ?end, "worker stream ended; its items in flight go back to the queue once");
        } else {
            info!(serve = %conn.offer.serve_id, model = %conn.offer.spec.model, "worker stopped serving");
        }
        self.dirty.insert(conn.offer.spec.model.clone());
        let completed = self.sched.unregister_worker(id);
        self.finish_all(completed);
    }

    pub(super) fn drain(&mut self, id: WorkerId, reason: &str) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.draining {
            return;
        }
        conn.draining = true;
        self.sched.set_credits(id, 0);
        let drain = pb::serve_event::Kind::Drain(pb::Drain {
            reason: reason.to_owned(),
        });
        let _ = conn.events.send(Ok(pb::ServeEvent { kind: Some(drain) }));
        info!(serve = %conn.offer.serve_id, %reason, "worker told to drain");
    }

    pub(super) fn begin_shutdown(&mut self) {
        self.shutting_down = true;
        let ids: Vec<WorkerId> = self.conns.keys().copied().collect();
        for id in ids {
            self.drain(id, "the server is shutting down");
        }
        let completed = self.sched.fail_all_queued(&ItemError::ShuttingDown);
        self.finish_all(completed);
    }

    /// Ends the stream of a worker that held cancelled items past their request's deadline
    /// plus the grace without answering them: the tenant's share they held is given back, and
    /// the metric counts it. Its other items go back to the queue once.
    pub(super) fn overran(&mut self, id: WorkerId) {
        if let Some(conn) = self.conns.get(&id) {
            let model = conn.offer.spec.model.clone();
            warn!(serve = %conn.offer.serve_id, %model,
                  "worker held cancelled items past their deadline and the grace; its stream is ended");
            self.metrics
                .cancel_overruns
                .with_label_values(&[model.as_str()])
                .inc();
            let _ = conn.events.send(Err(StreamError::new(
                Kind::DeadlineExceeded,
                "cancelled items were neither answered nor acknowledged within their deadline and the grace; this Serve stream is ended",
            )));
        }
        self.ended(id, StreamEnd::Lost);
    }

    /// Ends a worker's stream for breaking the protocol; its items go back to the queue.
    pub(super) fn protocol_error(&mut self, id: WorkerId, message: String) {
        if let Some(conn) = self.conns.get(&id) {
            warn!(serve = %conn.offer.serve_id, %message, "worker broke the Serve protocol");
            let _ = conn
                .events
                .send(Err(StreamError::new(Kind::InvalidArgument, message)));
        }
        self.ended(id, StreamEnd::Lost);
    }

    pub(super) fn result(&mut self, id: WorkerId, result: pb::BatchResult) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let batch_id = BatchId(result.batch_id);
        let Some(sent) = conn.batches.remove(&batch_id) else {
            let message = format!(
                "a result for batch {}, which this stream does not hold (unknown, or answered already)",
                result.batch_id
            );
            return self.protocol_error(id, message);
        };
        conn.batches_done += 1;
        let computed = sent.items.len() - sent.local.len();
        if let Some(turns) = gpu_of(&conn.offer).and_then(|g| self.gpus.get_mut(g)) {
            turns.completed(computed);
        }
        if computed > 0 {
            let (model, version) = (&conn.offer.spec.model, conn.offer.spec.version);
            self.stats
                .computed(model, version, computed, sent.sent_at.elapsed());
        }
        let mut given: HashMap<u64, pb::item_result::Outcome> = HashMap::new();
        for r in result.results {
            if let Some(outcome) = r.outcome {
                given.insert(r.item_id, outcome);
            }
        }
        let results: Vec<Result<pb::ItemOutput, ItemError>> =
            sent.items
                .iter()
                .map(|item| {
                    if let Some(error) = sent.local.get(item) {
                        return Err(error.clone());
                    }
                    match given.remove(&wire_id(*item)) {
                        Some(pb::item_result::Outcome::Output(output)) => Ok(output),
                        Some(pb::item_result::Outcome::Error(e)) if e.code != 0 => {
                            Err(ItemError::Worker {
                                code: e.code,
                                message: e.message,
                            })
                        }
                        Some(pb::item_result::Outcome::Error(e)) => Err(ItemError::Failed(
                            format!("the worker failed the item with code OK: {}", e.message),
                        )),
                        None => Err(ItemError::Failed(
                            "the worker's result for the batch did not include this item".into(),
                        )),
                    }
                })
                .collect();
        let completed = self.sched.complete(id, batch_id, results);
        self.finish_all(completed);
    }

    /// Hands every worker with a credit the batches that close now, and expires what is due.
    pub(super) fn pump(&mut self, now: Instant) {
        let expired = self.sched.expire_deadlines(now);
        self.finish_all(expired);
        for id in self.sched.overdue_workers(now) {
            self.overran(id);
        }
        let no_worker = self
            .sched
            .expire_without_workers(now, self.config.no_worker_wait);
        self.finish_all(no_worker);
        self.retry_at = None;
        let mut turns = turns_loads(&self.conns, &mut self.gpus, self.config.gpu_sharing, now);
        // Newest versions first, so that a worker of an older one takes only the overflow;
        // then, among the workers of a GPU taking turns, the one holding the most first, and
        // of those the longest serving (the warmest: its turn goes on while it has work).
        let mut ids: Vec<(u32, usize, WorkerId, Option<TurnKey>)> = self
            .conns
            .iter()
            .map(|(id, c)| {
                let gpu = gpu_of(&c.offer).filter(|g| turns.contains_key(*g));
                let held = if gpu.is_some() { c.batches.len() } else { 0 };
                let key = gpu.map(|g| TurnKey {
                    gpu: g.to_owned(),
                    model: c.offer.spec.model.clone(),
                    serves: c.offer.spec.serves.clone(),
                });
                (c.offer.spec.version, held, *id, key)
            })
            .collect();
        ids.sort_by(|a, b| (b.0, b.1).cmp(&(a.0, a.1)).then(a.2.cmp(&b.2)));
        // Taking turns, the workers of a GPU serving the same requests are offered batches one
        // at a time: the first in that order that can take one has the turn, and the others
        // get none while it can (else an idle one would take at once what the worker with the
        // turn waits to batch, and the GPU would switch contexts for a small batch).
        let mut turn_taken: Vec<TurnKey> = Vec::new();
        for (_, _, id, key) in ids {
            if key.as_ref().is_some_and(|k| turn_taken.contains(k)) {
                continue;
            }
            let gpu = key.as_ref().map(|k| k.gpu.as_str());
            loop {
                // Taking turns, the workers of a GPU together hold what the largest of them
                // would (driver::gpus).
                if let Some(load) = gpu.and_then(|g| turns.get(g))
                    && load.in_flight >= load.most
                {
                    break;
                }
                let dispatch = self.sched.next_batch(id, now);
                self.finish_all(dispatch.expired);
                if let Some(at) = dispatch.retry_at {
                    self.retry_at = Some(self.retry_at.map_or(at, |r| r.min(at)));
                }
                match dispatch.batch {
                    Some(batch) => {
                        self.send_batch(batch, now);
                        if let Some(load) = gpu.and_then(|g| turns.get_mut(g)) {
                            load.in_flight += 1;
                        }
                    }
                    None => break,
                }
            }
            if let Some(key) = key
                && self.sched.can_take(id)
            {
                turn_taken.push(key);
            }
        }
    }

    pub(super) fn send_batch(&mut self, batch: Batch, now: Instant) {
        let Some(conn) = self.conns.get_mut(&batch.worker) else {
            return;
        };
        let metrics = &self.metrics;
        metrics
            .inference_batch_items
            .with_label_values(&[batch.model.as_str()])
            .observe(batch.items.len() as f64);
        self.dirty.insert(batch.model.clone());
        let max_bytes = conn.offer.spec.max_bytes;
        let mut local = HashMap::new();
        let mut items = Vec::with_capacity(batch.items.len());
        for item in &batch.items {
            let Some(payload) = self.payloads.get(&item.id) else {
                local.insert(
                    item.id,
                    ItemError::Failed("the item's input is gone".into()),
                );
                continue;
            };
            let waiter = self.waiters.get(&item.id.request);
            if let Some(waiter) = waiter {
                let waited = now.saturating_duration_since(waiter.arrival);
                metrics
                    .inference_queue_seconds
                    .with_label_values(&[batch.model.as_str()])
                    .observe(waited.as_secs_f64());
                self.stats
                    .queued(&batch.model, conn.offer.spec.version, waited);
            }
            let text_input = waiter.and_then(|w| w.text_input.as_deref());
            let text = matches!(payload.input, Some(pb::item::Input::Text(_)));
            let refusal = if text && !conn.offer.accepts_text {
                Some(format!(
                    "the workers of model '{}' take tensor inputs, not text",
                    batch.model
                ))
            } else if !text && !conn.offer.accepts_tensors {
                Some(format!(
                    "the workers of model '{}' take text inputs, not tensors",
                    batch.model
                ))
            } else if item.bytes > max_bytes {
                Some(format!(
                    "an input of {} bytes is larger than the {} bytes a worker of model '{}' takes at once",
                    item.bytes, max_bytes, batch.model
                ))
            } else {
                super::inputs::refusal(&batch.model, &conn.offer.inputs, payload, text_input)
            };
            match refusal {
                Some(message) => {
                    local.insert(
                        item.id,
                        ItemError::Worker {
                            code: Kind::InvalidArgument.number(),
                            message,
                        },
                    );
                }
                None => items.push(payload.clone()),
            }
        }
        let sent = SentBatch {
            items: batch.items.iter().map(|i| i.id).collect(),
            local,
            sent_at: now,
        };
        if items.is_empty() {
            // Nothing to send: answer the batch here, which returns its credit.
            let results: Vec<Result<pb::ItemOutput, ItemError>> = sent
                .items
                .iter()
                .map(|id| {
                    Err(sent
                        .local
                        .get(id)
                        .cloned()
                        .unwrap_or(ItemError::Failed("not sent".into())))
                })
                .collect();
            let completed = self.sched.complete(batch.worker, batch.id, results);
            self.finish_all(completed);
            return;
        }
        let event = pb::ServeEvent {
            kind: Some(pb::serve_event::Kind::Batch(pb::Batch {
                batch_id: batch.id.0,
                version: batch.version,
                items,
            })),
        };
        conn.batches.insert(batch.id, sent);
        if conn.events.send(Ok(event)).is_err() {
            // The stream is gone; its handler will say so too.
            self.ended(batch.worker, StreamEnd::Lost);
        }
    }
}

/// The GPU a worker's weights are on, if it is on one (not the host backend).
fn gpu_of(offer: &WorkerOffer) -> Option<&str> {
    offer.device.as_deref().filter(|d| *d != "host")
}

/// Workers of one GPU taking turns that serve the same requests: one of them has the turn.
#[derive(Debug, PartialEq)]
struct TurnKey {
    gpu: String,
    model: String,
    serves: Serves,
}

/// The workers of one GPU taking turns now (see [`turns_loads`]).
#[derive(Debug, Default)]
struct GpuLoad {
    in_flight: usize,
    most: usize,
}

/// For every GPU whose workers take turns now: the batches they hold, and the most they may
/// hold together (the largest of their credits). Each GPU with two workers or more has its
/// [`super::gpus::Turns`] in `gpus` (ticked here: its epoch ends when it is over); a GPU back
/// to one worker loses it, and measures afresh when a second comes.
fn turns_loads(
    conns: &HashMap<WorkerId, Conn>,
    gpus: &mut HashMap<String, super::gpus::Turns>,
    policy: crate::types::GpuSharing,
    now: Instant,
) -> HashMap<String, GpuLoad> {
    if conns.len() < 2 {
        gpus.clear();
        return HashMap::new();
    }
    // Per GPU: its workers, how many of them are warm, and its load.
    let mut loads: HashMap<&str, (usize, usize, GpuLoad)> = HashMap::new();
    for c in conns.values() {
        if let Some(gpu) = gpu_of(&c.offer) {
            let (workers, warm, load) = loads.entry(gpu).or_default();
            *workers += 1;
            *warm += usize::from(c.batches_done >= super::gpus::WARM_BATCHES);
            load.in_flight += c.batches.len();
            load.most = load.most.max(c.offer.spec.credits as usize);
        }
    }
    loads.retain(|_, (workers, _, _)| *workers >= 2);
    gpus.retain(|gpu, _| loads.contains_key(gpu.as_str()));
    let mut taking_turns = HashMap::new();
    for (gpu, (workers, warm, load)) in loads {
        if !gpus.contains_key(gpu) {
            gpus.insert(gpu.to_owned(), super::gpus::Turns::new(policy, now));
        }
        let Some(turns) = gpus.get_mut(gpu) else {
            continue;
        };
        turns.tick(gpu, now, workers, warm == workers);
        if turns.taking_turns() {
            taking_turns.insert(gpu.to_owned(), load);
        }
    }
    taking_turns
}
