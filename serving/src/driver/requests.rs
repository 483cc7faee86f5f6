//! The driver's side of callers: a request submitted, cancelled, finished; its answer
//! counted.

use std::collections::HashMap;
use std::time::Instant;

use modelshare_proto::v1 as pb;
use tracing::debug;

use super::*;

impl Driver {
    pub(super) fn answer_now(&self, request: &InferRequest, reply: Reply, error: InferError) {
        self.metrics
            .inference_requests
            .with_label_values(&[
                request.model.as_str(),
                tenant_label(&request.tenant),
                error.kind().label(),
            ])
            .inc();
        let _ = reply.send(Err(error));
    }

    pub(super) fn submit(
        &mut self,
        ticket: u64,
        request: InferRequest,
        arrival: Instant,
        reply: Reply,
        parts: Option<mpsc::Sender<Part>>,
    ) {
        if self.shutting_down {
            return self.answer_now(&request, reply, InferError::ShuttingDown);
        }
        if request.items.len() >= MAX_ITEMS_PER_REQUEST {
            let error = InferError::InvalidInput(format!(
                "a request has at most {} inputs",
                MAX_ITEMS_PER_REQUEST - 1
            ));
            return self.answer_now(&request, reply, error);
        }
        if parts.is_some() && request.items.len() != 1 {
            let error = InferError::InvalidInput("a streamed request has one input".into());
            return self.answer_now(&request, reply, error);
        }
        if let Some(index) = request.items.iter().position(|i| i.input.is_none()) {
            let error = InferError::InvalidInput(format!("input {index} is empty"));
            return self.answer_now(&request, reply, error);
        }
        if Instant::now() >= request.deadline {
            let error = InferError::DeadlineExceeded {
                model: request.model.clone(),
            };
            return self.answer_now(&request, reply, error);
        }
        let cost = match (&parts, request.items.first()) {
            (Some(_), Some(item)) => generation_cost(item),
            _ => 1,
        };
        let new = NewRequest {
            tenant: request.tenant.clone(),
            model: request.model.clone(),
            item_bytes: request.items.iter().map(item_bytes).collect(),
            deadline: request.deadline,
            arrival,
            quota: request.max_outstanding,
            cost,
        };
        let id = match self.sched.submit(new) {
            Ok(id) => id,
            Err(refusal) => {
                if let Some(tenant) = request.tenant.as_deref() {
                    self.metrics.quota_denied(tenant, "requests");
                }
                return self.answer_now(&request, reply, InferError::Refused(refusal));
            }
        };
        let deadline_unix_ms = unix_ms(request.deadline);
        let items = request.items.len();
        for (index, mut item) in request.items.into_iter().enumerate() {
            let id = ItemId { request: id, index };
            item.item_id = wire_id(id);
            item.deadline_unix_ms = deadline_unix_ms;
            item.stream = parts.is_some();
            self.payloads.insert(id, item);
        }
        self.dirty.insert(request.model.clone());
        self.dirty_tenants.insert(request.tenant.clone());
        self.tickets.insert(ticket, id);
        self.waiters.insert(
            id,
            Waiter {
                ticket,
                reply,
                model: request.model,
                tenant: request.tenant,
                items,
                arrival,
                text_input: request.text_input,
                parts,
                streaming: None,
                last_part: None,
                cost,
                parts_sent: 0,
            },
        );
    }

    /// Drops a request whose caller stopped waiting (`why`: CANCELLED, or DEADLINE_EXCEEDED
    /// when its deadline passed while its items were in flight), and tells its workers.
    pub(super) fn cancel(&mut self, ticket: u64, why: Kind) {
        let Some(id) = self.tickets.remove(&ticket) else {
            return;
        };
        let Some(waiter) = self.waiters.remove(&id) else {
            return;
        };
        self.drop_payloads(id, waiter.items);
        self.dirty.insert(waiter.model.clone());
        self.dirty_tenants.insert(waiter.tenant.clone());
        self.count(&waiter, why);
        let in_flight = self.sched.cancel(id, Instant::now()).unwrap_or_default();
        if !in_flight.is_empty() {
            // A generation cut short charged its max_tokens: what it did not send comes back.
            self.refund(&waiter, waiter.parts_sent);
        }
        let mut by_worker: HashMap<WorkerId, Vec<u64>> = HashMap::new();
        for item in in_flight {
            by_worker
                .entry(item.worker)
                .or_default()
                .push(wire_id(item.item));
        }
        for (worker, item_ids) in by_worker {
            if let Some(conn) = self.conns.get(&worker) {
                let cancel = pb::serve_event::Kind::Cancel(pb::Cancel { item_ids });
                let _ = conn.events.send(Ok(pb::ServeEvent { kind: Some(cancel) }));
            }
        }
        debug!(request = id.0, model = %waiter.model, ?why, "request given up by its caller");
    }

    pub(super) fn drop_payloads(&mut self, request: RequestId, items: usize) {
        for index in 0..items {
            self.payloads.remove(&ItemId { request, index });
        }
    }

    pub(super) fn finish_all(&mut self, completed: Vec<Completed<pb::ItemOutput>>) {
        for c in completed {
            self.finish(c);
        }
    }

    pub(super) fn count(&self, waiter: &Waiter, code: Kind) {
        let model = waiter.model.as_str();
        self.metrics
            .inference_requests
            .with_label_values(&[model, tenant_label(&waiter.tenant), code.label()])
            .inc();
        self.metrics
            .inference_seconds
            .with_label_values(&[model])
            .observe(waiter.arrival.elapsed().as_secs_f64());
    }

    pub(super) fn finish(&mut self, completed: Completed<pb::ItemOutput>) {
        let Some(waiter) = self.waiters.remove(&completed.id) else {
            return;
        };
        self.tickets.remove(&waiter.ticket);
        self.drop_payloads(completed.id, waiter.items);
        self.dirty.insert(waiter.model.clone());
        self.dirty_tenants.insert(waiter.tenant.clone());
        let model = completed.model;
        // The version that computed the first item (none: no worker took one).
        let version = completed.outcomes.first().and_then(|o| o.version);
        let mut outputs = Vec::with_capacity(completed.outcomes.len());
        let mut versions = Vec::with_capacity(completed.outcomes.len());
        let mut failure = None;
        for (index, outcome) in completed.outcomes.into_iter().enumerate() {
            match outcome.result {
                Ok(output) => {
                    outputs.push(output);
                    versions.push(outcome.version.unwrap_or(0));
                }
                Err(error) => {
                    failure = Some(self.infer_error(&model, index, error, waiter.arrival));
                    break;
                }
            }
        }
        let result = match failure {
            Some(error) => Err(error),
            None => Ok(InferResponse {
                model,
                versions,
                outputs,
            }),
        };
        let code = result.as_ref().map_or_else(InferError::kind, |_| Kind::Ok);
        self.count(&waiter, code);
        // A generation charged its max_tokens: what it did not generate (its own count, or
        // the parts sent when it failed) goes back.
        let used = match &result {
            Ok(r) => r.outputs.first().map_or(0, completion_tokens),
            Err(_) => waiter.parts_sent,
        };
        self.refund(&waiter, used);
        if let Some(version) = version {
            let items = result.as_ref().ok().map(|r| r.outputs.len());
            let model = &waiter.model;
            let took = waiter.arrival.elapsed();
            self.stats
                .answered(model, version, items, took, super::now_unix_ms());
        }
        let _ = waiter.reply.send(result);
    }

    /// Gives back to `waiter`'s tenant what its generation was charged and did not `use`.
    fn refund(&mut self, waiter: &Waiter, used: u64) {
        if waiter.cost > 1 {
            let unused = waiter.cost.saturating_sub(used);
            self.sched.refund(&waiter.model, &waiter.tenant, unused);
        }
    }

    pub(super) fn infer_error(
        &self,
        model: &str,
        index: usize,
        error: ItemError,
        arrival: Instant,
    ) -> InferError {
        let model = model.to_owned();
        match error {
            ItemError::DeadlineExceeded => InferError::DeadlineExceeded { model },
            ItemError::Unavailable => InferError::WorkersLost { model },
            ItemError::Interrupted => InferError::StreamInterrupted { model },
            ItemError::NoWorker => InferError::NoWorker {
                model,
                waited: arrival.elapsed(),
            },
            ItemError::ShuttingDown => InferError::ShuttingDown,
            ItemError::Failed(message) => InferError::Item {
                index,
                code: Kind::Internal,
                message,
            },
            ItemError::Worker { code, message } => InferError::Item {
                index,
                code: Kind::from_number(code),
                message,
            },
        }
    }
}

/// The tokens a generation's final output says it generated (`completion_tokens`, int64).
fn completion_tokens(output: &pb::ItemOutput) -> u64 {
    match output
        .parameters
        .get("completion_tokens")
        .and_then(|p| p.value.as_ref())
    {
        Some(pb::parameter::Value::Int64Value(n)) => u64::try_from(*n).unwrap_or(0),
        Some(pb::parameter::Value::Uint64Value(n)) => *n,
        _ => 0,
    }
}
