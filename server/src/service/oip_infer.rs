//! One OIP inference request run to its answer, as `ModelInfer` and `ModelStreamInfer` (for a
//! request that is not a generation) both run it: the version asked for checked, the tensors
//! converted into items on the request pool, the answer's outputs stacked back.

use std::collections::HashMap;
use std::time::Instant;

use modelshare_proto::inference as oip;
use tonic::Status;

use crate::app::App;
use crate::cpu::PoolError;
use crate::front::{self, oip as tensors};
use crate::request_id::RequestTrace;
use crate::status::OrStatus;
use modelshare_core::tenants::Caller;

/// A version asked for: `None` for any (empty), else its number.
pub fn version(text: &str) -> Result<Option<u32>, Status> {
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| {
        Status::invalid_argument(format!(
            "model_version '{}' is not a version number",
            text.escape_debug()
        ))
    })
}

/// The status of a request whose conversion did not run.
fn pool_status(e: PoolError) -> Status {
    match e {
        PoolError::DeadlineExceeded => Status::deadline_exceeded(e.to_string()),
        PoolError::Panicked => Status::internal(e.to_string()),
    }
}

/// Runs one `ModelInferRequest` to its answer (`ModelInfer`, and a non-generation request of
/// `ModelStreamInfer`).
pub async fn infer_one(
    app: &App,
    caller: &Caller,
    mut req: oip::ModelInferRequest,
    deadline: Instant,
    trace: Option<&RequestTrace>,
) -> Result<oip::ModelInferResponse, Status> {
    version(&req.model_version)?;
    front::check_visible(app, caller, &req.model_name).or_status()?;
    // Converting the tensors is work proportional to the request: on the request pool,
    // off the runtime.
    let max_items = front::max_items(app);
    let size = prost::Message::encoded_len(&req);
    let trace = trace.cloned();
    let (req, items) = app
        .cpu
        .run_sized(size, deadline, move || {
            let inputs = tensors::grpc_inputs(&mut req)?;
            let parameters = tensors::parameters(&req.parameters);
            let mut items = tensors::to_items(inputs, &parameters, max_items)?;
            if let Some(trace) = &trace {
                trace.stamp(&mut items.items);
            }
            Ok::<_, modelshare_serving::InferError>((req, items))
        })
        .await
        .map_err(pool_status)?
        .or_status()?;
    let answer = front::infer(
        app,
        caller,
        &req.model_name,
        items.items,
        items.text_input,
        deadline,
    )
    .await
    .or_status()?;
    let requested: Vec<String> = req.outputs.iter().map(|o| o.name.clone()).collect();
    let stacked = tensors::stack(&req.model_name, &answer.outputs, &requested).or_status()?;
    let mut outputs = Vec::with_capacity(stacked.len());
    let mut raw = Vec::with_capacity(stacked.len());
    for t in stacked {
        outputs.push(oip::model_infer_response::InferOutputTensor {
            datatype: t.datatype().to_owned(),
            name: t.name,
            shape: t.shape,
            ..Default::default()
        });
        raw.push(t.data);
    }
    Ok(oip::ModelInferResponse {
        model_version: answer.version().to_string(),
        model_name: answer.model,
        id: req.id,
        parameters: HashMap::new(),
        outputs,
        raw_output_contents: raw,
    })
}
