//! What the driver reports: the request path's gauges, and its snapshot for the admin API.

use super::*;

impl Driver {
    pub(super) fn refresh_gauges(&mut self) {
        for model in std::mem::take(&mut self.dirty) {
            let depth = i64::try_from(self.sched.queue_depth(&model)).unwrap_or(i64::MAX);
            let workers = i64::try_from(self.sched.serving_workers(&model)).unwrap_or(i64::MAX);
            let m = &self.metrics;
            m.inference_queue_items
                .with_label_values(&[model.as_str()])
                .set(depth);
            m.serving_workers
                .with_label_values(&[model.as_str()])
                .set(workers);
        }
        self.dirty_tenants.extend(self.sched.take_settled_tenants());
        for tenant in std::mem::take(&mut self.dirty_tenants) {
            let n = self.sched.outstanding_for_tenant(&tenant);
            self.metrics
                .inference_outstanding
                .with_label_values(&[tenant_label(&tenant)])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub(super) fn snapshot(&self) -> ServingSnapshot {
        let mut workers: Vec<WorkerInfo> = self
            .conns
            .iter()
            .map(|(id, c)| WorkerInfo {
                serve_id: c.offer.serve_id.clone(),
                session_id: c.offer.session_id.clone(),
                tenant: c.offer.tenant.clone(),
                model: c.offer.spec.model.clone(),
                version: c.offer.spec.version,
                credits: c.offer.spec.credits,
                batches_in_flight: c.batches.len(),
                items_in_flight: self.sched.in_flight(*id).unwrap_or(0),
                batches_done: c.batches_done,
                draining: c.draining,
                serves: c.offer.spec.serves.clone(),
            })
            .collect();
        workers.sort_by(|a, b| a.serve_id.cmp(&b.serve_id));
        let mut names: BTreeSet<String> = self.waiters.values().map(|w| w.model.clone()).collect();
        names.extend(self.conns.values().map(|c| c.offer.spec.model.clone()));
        let models = names
            .into_iter()
            .map(|model| {
                let mut conns: Vec<&Conn> = self
                    .conns
                    .values()
                    .filter(|c| c.offer.spec.model == model)
                    .collect();
                conns.sort_by_key(|c| std::cmp::Reverse(c.offer.spec.version));
                let mut versions: Vec<u32> = conns.iter().map(|c| c.offer.spec.version).collect();
                versions.dedup();
                let newest = conns.first();
                ModelServing {
                    queued_items: self.sched.queue_depth(&model),
                    workers: conns.len(),
                    versions,
                    inputs: newest.map(|c| c.offer.inputs.clone()).unwrap_or_default(),
                    outputs: newest.map(|c| c.offer.outputs.clone()).unwrap_or_default(),
                    model,
                }
            })
            .collect();
        // Cancelled requests whose items a worker still holds count too (no waiter is left).
        let tenants: BTreeSet<Tenant> = self.sched.counted_tenants().into_iter().collect();
        ServingSnapshot {
            workers,
            models,
            tenants: tenants
                .into_iter()
                .map(|t| {
                    let n = self.sched.outstanding_for_tenant(&t);
                    (t, n)
                })
                .collect(),
            outstanding: self.sched.outstanding(),
            drained: self.sched.is_drained() && self.payloads.is_empty() && self.waiters.is_empty(),
        }
    }
}
