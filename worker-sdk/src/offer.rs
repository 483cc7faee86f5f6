//! Offering memory back to a restarted server: after the server was restarted, the arenas this
//! worker still maps (VMM or host memory, whose descriptors the mappings keep) are offered
//! before the session is opened again, so that the server adopts them instead of loading a
//! second copy of the weights (the server side: `OfferHeld` in the protocol).
//!
//! An offer the server does not want (nothing remembered under that version, already adopted
//! from another worker) is not an error; neither is a failed one: the session re-attaches
//! whatever the server then has.

use std::path::Path;
use std::sync::Arc;

use modelshare_device::handoff;
use modelshare_proto::v1 as pb;
use modelshare_proto::v1::worker_service_client::WorkerServiceClient;
use tracing::{debug, info};

use crate::connect::AuthChannel;
use crate::model::ModelInner;

/// Offers the mapping of every model in `held` that has a descriptor; returns how many the
/// server adopted.
pub(crate) async fn offer_held(
    client: &mut WorkerServiceClient<AuthChannel>,
    held: &[Arc<ModelInner>],
) -> usize {
    let mut adopted = 0;
    for model in held {
        let (version, mapping) = model.attached();
        let Some(fd) = mapping.descriptor() else {
            continue;
        };
        let req = pb::OfferHeldRequest {
            model: model.name().to_owned(),
            version,
            device_uuid: mapping.device_uuid().to_owned(),
            allocation_bytes: mapping.allocation_len(),
        };
        let reply = match client.offer_held(req).await {
            Ok(r) => r.into_inner(),
            Err(status) => {
                debug!(model = %model.name(), %status, "offer of held memory not taken");
                continue;
            }
        };
        if !reply.wanted {
            debug!(model = %model.name(), version, reason = %reply.reason, "the server does not want the held memory");
            continue;
        }
        match handoff::offer(Path::new(&reply.handle_socket), &reply.ticket, fd).await {
            Ok(()) => {
                info!(model = %model.name(), version, "the restarted server adopted the memory this worker kept");
                adopted += 1;
            }
            Err(e) => {
                info!(model = %model.name(), version, error = %e, "the restarted server refused the memory this worker kept");
            }
        }
    }
    adopted
}
