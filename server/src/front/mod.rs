//! What the inference front doors share: the gRPC `GRPCInferenceService` (KServe v2 / OIP), the
//! OIP REST routes and the OpenAI routes all turn a caller's request into items and hand them
//! to [`infer`], which checks the model is one the caller may see, applies the tenant's request
//! quota and the deadline, and waits on the [`crate::serving::Engine`].
//!
//! - [`oip`]: the OIP tensors shared by its gRPC and REST doors (datatypes, raw layout, split
//!   into items, stack of outputs).
//! - [`deadline`]: a request's deadline from `grpc-timeout` or an HTTP timeout header, bounded
//!   by the server's longest request time.

pub mod deadline;
pub mod oip;

use std::time::Instant;

use modelshare_proto::v1 as pb;

use crate::app::App;
use crate::serving::{InferError, InferRequest, InferResponse};
use crate::tenants::Caller;

/// Computes `items` on `model` for `caller`, answering by `deadline`. A model the caller may
/// not see is answered as if it did not exist. Dropping the future cancels the request.
pub async fn infer(
    app: &App,
    caller: &Caller,
    model: &str,
    items: Vec<pb::Item>,
    deadline: Instant,
) -> Result<InferResponse, InferError> {
    if !app.registry.visible(caller, model) {
        return Err(InferError::ModelNotFound(model.to_owned()));
    }
    let max_outstanding = match caller {
        Caller::Admin => None,
        Caller::Tenant { quota, .. } => quota
            .requests
            .and_then(|n| usize::try_from(n).ok())
            .or(Some(app.config.serving.max_tenant_requests)),
    };
    let request = InferRequest {
        tenant: caller.tenant().map(str::to_owned),
        model: model.to_owned(),
        items,
        deadline,
        max_outstanding,
    };
    app.engine.infer(request).await
}
