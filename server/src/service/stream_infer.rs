//! `ModelStreamInfer`: Triton's decoupled stream, as tritonclient's `start_stream` /
//! `async_stream_infer` use it. Requests come on one bidirectional stream and are answered on
//! it, each response naming its request's `id`, in any order.
//!
//! - A generation request (an input `text_input`, BYTES, one element: the prompt, as Triton's
//!   LLM backends name it; parameters `max_tokens`, `temperature`, `top_p`, `seed`, `stop`, see
//!   [`front::generation::kserve`]) streams: one response per part of the answer, its text in the
//!   output `text_output` (BYTES `[1]`), each with the parameter `triton_final_response` false;
//!   then a last response with the rest of the text (often empty), `triton_final_response` true,
//!   and `finish_reason`, `prompt_tokens` and `completion_tokens`.
//! - Any other request runs as `ModelInfer` and is answered by one response, marked final.
//! - A failed request is answered by a response with its `error_message` (and its id); the
//!   stream goes on.
//! - At most [`IN_FLIGHT`] requests of one stream run at once: past that, the stream is read no
//!   further until one ends. Responses wait for the client to read them (a channel of
//!   [`RESPONSES`]): a slow reader slows its own generations, through their windows; one that
//!   reads nothing for [`READER_IDLE`] has its generations given up. A client that goes away
//!   (the call cancelled) drops the stream's requests, which cancels their items at their
//!   workers. A request message refused on the way in ends the stream with its status.
//! - Each request's deadline is the server's longest request time from its arrival, for the
//!   first part of a generation; then the stream limits apply.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use modelshare_proto::inference as oip;
use modelshare_proto::v1 as pb;
use modelshare_serving::{InferError, PartStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::app::App;
use crate::front::generation::{self, Tokens, part_text};
use crate::front::oip::{self as tensors, bytes_elements, element_count, encode_bytes};
use crate::request_id::RequestTrace;
use crate::status::OrStatus;
use modelshare_core::tenants::Caller;

/// Requests of one stream running at once.
pub const IN_FLIGHT: usize = 64;
/// Responses waiting for the client to read them, per stream.
pub const RESPONSES: usize = 16;
/// How long the client may read nothing while a response waits for it: past it, the
/// generation is given up (its item cancelled, its worker's slot freed).
pub const READER_IDLE: std::time::Duration = std::time::Duration::from_secs(60);
/// The input that makes a request a generation.
pub const TEXT_INPUT: &str = "text_input";
/// The output a generation's text is in.
pub const TEXT_OUTPUT: &str = "text_output";

/// The responses of one stream.
pub type Responses =
    Pin<Box<dyn Stream<Item = Result<oip::ModelStreamInferResponse, Status>> + Send>>;

type Sender = mpsc::Sender<Result<oip::ModelStreamInferResponse, Status>>;

/// Reads `inbound` on a task of its own and answers each request (see the module's docs).
pub fn start(
    app: App,
    caller: Caller,
    trace: Option<RequestTrace>,
    mut inbound: tonic::Streaming<oip::ModelInferRequest>,
) -> Responses {
    let (tx, rx) = mpsc::channel(RESPONSES);
    tokio::spawn(async move {
        let running = Arc::new(Semaphore::new(IN_FLIGHT));
        loop {
            let permit = tokio::select! {
                p = running.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
                () = tx.closed() => return,
            };
            let request = tokio::select! {
                r = inbound.message() => r,
                () = tx.closed() => return,
            };
            let req = match request {
                Ok(Some(req)) => req,
                // The client closed its side: the requests running finish.
                Ok(None) => return,
                // A message refused (too large, malformed): the stream ends with its status.
                Err(status) => {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            };
            let (app, caller, trace, tx) = (app.clone(), caller.clone(), trace.clone(), tx.clone());
            tokio::spawn(async move {
                answer(&app, &caller, trace.as_ref(), req, &tx).await;
                drop(permit);
            });
        }
    });
    Box::pin(ReceiverStream::new(rx))
}

/// Answers one request of the stream; its failure is an error response.
async fn answer(
    app: &App,
    caller: &Caller,
    trace: Option<&RequestTrace>,
    mut req: oip::ModelInferRequest,
    tx: &Sender,
) {
    let arrived = Instant::now();
    let deadline = arrived + app.config.serving.max_request_time;
    let (id, model) = (req.id.clone(), req.model_name.clone());
    let done = match generation_input(&mut req) {
        Ok(Some(text)) => generate(app, caller, trace, req, text, deadline, tx).await,
        Ok(None) => match super::oip_infer::infer_one(app, caller, req, deadline, trace).await {
            Ok(mut response) => {
                final_flag(&mut response.parameters, true);
                send(tx, response).await;
                Ok(())
            }
            Err(status) => Err(status),
        },
        Err(e) => Err(e).or_status(),
    };
    if let Err(status) = done {
        let response = oip::ModelStreamInferResponse {
            error_message: status.message().to_owned(),
            infer_response: Some(oip::ModelInferResponse {
                model_name: model,
                id,
                ..Default::default()
            }),
        };
        let _ = tx.send(Ok(response)).await;
    }
}

/// The prompt of a generation request (its input `text_input`), or `None` for another request.
fn generation_input(req: &mut oip::ModelInferRequest) -> Result<Option<String>, InferError> {
    if !req.inputs.iter().any(|i| i.name == TEXT_INPUT) {
        return Ok(None);
    }
    let inputs = tensors::grpc_inputs(req)?;
    let bad = || {
        InferError::InvalidInput(format!(
            "a generation request has one input, '{TEXT_INPUT}': BYTES, one element (the prompt, UTF-8)"
        ))
    };
    let [input] = inputs.as_slice() else {
        return Err(bad());
    };
    if input.dtype != pb::DType::DtypeBytes {
        return Err(bad());
    }
    let count = element_count(&input.name, &input.shape)?;
    let ranges = bytes_elements(&input.name, &input.data, count)?;
    let [range] = ranges.as_slice() else {
        return Err(bad());
    };
    String::from_utf8(input.data[range.clone()].to_vec())
        .map(Some)
        .map_err(|_| bad())
}

/// Streams a generation's parts as responses, then its final one.
async fn generate(
    app: &App,
    caller: &Caller,
    trace: Option<&RequestTrace>,
    req: oip::ModelInferRequest,
    text: String,
    deadline: Instant,
    tx: &Sender,
) -> Result<(), Status> {
    super::oip_infer::version(&req.model_version)?;
    let parameters = tensors::parameters(&req.parameters);
    let asked = generation::kserve(text, &parameters).or_status()?;
    let mut parts: PartStream =
        generation::stream(app, caller, &req.model_name, asked, trace, deadline).or_status()?;
    let response = |text: &str, last: bool| {
        let mut r = oip::ModelInferResponse {
            model_name: req.model_name.clone(),
            id: req.id.clone(),
            outputs: vec![oip::model_infer_response::InferOutputTensor {
                name: TEXT_OUTPUT.into(),
                datatype: "BYTES".into(),
                shape: vec![1],
                ..Default::default()
            }],
            raw_output_contents: vec![encode_bytes([text.as_bytes()])],
            ..Default::default()
        };
        final_flag(&mut r.parameters, last);
        r
    };
    // The client gone (the call cancelled), also while the worker is slow: dropping `parts`
    // cancels the item at its worker.
    loop {
        let next = tokio::select! {
            next = parts.next() => next.or_status()?,
            () = tx.closed() => return Ok(()),
        };
        let Some(part) = next else { break };
        if !send(tx, response(part_text(&part.output), false)).await {
            return Ok(());
        }
    }
    let answer = tokio::select! {
        answer = parts.finish() => answer.or_status()?,
        () = tx.closed() => return Ok(()),
    };
    let finish = Tokens::of(app, caller).finish(&answer).or_status()?;
    let mut last = response(&finish.text, true);
    last.model_version = answer.version().to_string();
    let p = &mut last.parameters;
    p.insert("finish_reason".into(), string(finish.reason.clone()));
    p.insert("prompt_tokens".into(), int(finish.prompt_tokens));
    p.insert("completion_tokens".into(), int(finish.completion_tokens));
    send(tx, last).await;
    Ok(())
}

/// Sends a response; false when the client is gone or read nothing for [`READER_IDLE`].
async fn send(tx: &Sender, response: oip::ModelInferResponse) -> bool {
    let response = oip::ModelStreamInferResponse {
        error_message: String::new(),
        infer_response: Some(response),
    };
    matches!(
        tokio::time::timeout(READER_IDLE, tx.send(Ok(response))).await,
        Ok(Ok(()))
    )
}

fn final_flag(parameters: &mut HashMap<String, oip::InferParameter>, last: bool) {
    use oip::infer_parameter::ParameterChoice;
    parameters.insert(
        "triton_final_response".into(),
        oip::InferParameter {
            parameter_choice: Some(ParameterChoice::BoolParam(last)),
        },
    );
}

fn string(s: String) -> oip::InferParameter {
    use oip::infer_parameter::ParameterChoice;
    oip::InferParameter {
        parameter_choice: Some(ParameterChoice::StringParam(s)),
    }
}

fn int(n: i64) -> oip::InferParameter {
    use oip::infer_parameter::ParameterChoice;
    oip::InferParameter {
        parameter_choice: Some(ParameterChoice::Int64Param(n)),
    }
}
