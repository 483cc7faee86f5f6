//! `inference.GRPCInferenceService`: the KServe v2 Open Inference Protocol over gRPC, on the
//! gRPC port (TCP and the Unix socket), behind the same authentication as the other services.
//!
//! A request's `model_version` may be empty or a number; requests always go to the newest
//! version a worker serves (during a hot swap, the older one's workers take the overflow), and
//! the response's `model_version` names the version that computed it.

use crate::status::OrStatus;
use std::time::Instant;

use modelshare_proto::inference as oip;
use modelshare_proto::inference::grpc_inference_service_server::GrpcInferenceService;
use tonic::{Request, Response, Status};

use crate::app::App;
use crate::auth::caller_of;
use crate::front::{self, deadline, triton};
use crate::request_id::RequestTrace;
use crate::service::oip_infer::{infer_one, version};
use crate::service::stream_infer;
use crate::service::triton as answers;

/// The OIP gRPC service.
#[derive(Debug, Clone)]
pub struct InferenceApi {
    app: App,
}

impl InferenceApi {
    /// The service over `app`.
    pub fn new(app: App) -> Self {
        Self { app }
    }
}

fn tensor_metadata(
    specs: &[modelshare_proto::v1::TensorSpec],
) -> Vec<oip::model_metadata_response::TensorMetadata> {
    specs
        .iter()
        .map(|s| oip::model_metadata_response::TensorMetadata {
            name: s.name.clone(),
            datatype: s.datatype.clone(),
            shape: s.shape.clone(),
        })
        .collect()
}

#[tonic::async_trait]
impl GrpcInferenceService for InferenceApi {
    async fn server_live(
        &self,
        _: Request<oip::ServerLiveRequest>,
    ) -> Result<Response<oip::ServerLiveResponse>, Status> {
        Ok(Response::new(oip::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<oip::ServerReadyRequest>,
    ) -> Result<Response<oip::ServerReadyResponse>, Status> {
        let ready = self.app.host.takes_requests();
        Ok(Response::new(oip::ServerReadyResponse { ready }))
    }

    /// Ready when a worker that is not draining would take this caller's requests for the
    /// model (of that version, if named); an unknown or invisible model is not ready.
    async fn model_ready(
        &self,
        request: Request<oip::ModelReadyRequest>,
    ) -> Result<Response<oip::ModelReadyResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        let req = request.into_inner();
        let wanted = version(&req.version)?;
        let ready = front::model_ready(&self.app, &caller, &req.name, wanted).await;
        Ok(Response::new(oip::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<oip::ServerMetadataRequest>,
    ) -> Result<Response<oip::ServerMetadataResponse>, Status> {
        Ok(Response::new(oip::ServerMetadataResponse {
            name: "modelshare".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: front::EXTENSIONS.iter().map(|e| (*e).to_owned()).collect(),
        }))
    }

    async fn model_config(
        &self,
        request: Request<oip::ModelConfigRequest>,
    ) -> Result<Response<oip::ModelConfigResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        let req = request.into_inner();
        version(&req.version)?;
        let config = triton::model_config(&self.app, &caller, &req.name)
            .await
            .or_status()?;
        Ok(Response::new(oip::ModelConfigResponse {
            config: Some(answers::config(config)),
        }))
    }

    async fn repository_index(
        &self,
        request: Request<oip::RepositoryIndexRequest>,
    ) -> Result<Response<oip::RepositoryIndexResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        let req = request.into_inner();
        let entries = triton::repository_index(&self.app, &caller, req.ready).await;
        Ok(Response::new(answers::index(entries)))
    }

    async fn model_statistics(
        &self,
        request: Request<oip::ModelStatisticsRequest>,
    ) -> Result<Response<oip::ModelStatisticsResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        let req = request.into_inner();
        let wanted = version(&req.version)?;
        let model = (!req.name.is_empty()).then_some(req.name.as_str());
        let stats = triton::statistics(&self.app, &caller, model, wanted)
            .await
            .or_status()?;
        Ok(Response::new(answers::statistics(stats)))
    }

    async fn model_metadata(
        &self,
        request: Request<oip::ModelMetadataRequest>,
    ) -> Result<Response<oip::ModelMetadataResponse>, Status> {
        let caller = caller_of(&request).or_status()?;
        let req = request.into_inner();
        version(&req.version)?;
        let serving = front::model_serving(&self.app, &caller, &req.name)
            .await
            .or_status()?;
        Ok(Response::new(oip::ModelMetadataResponse {
            versions: serving.versions.iter().map(u32::to_string).collect(),
            platform: "modelshare".into(),
            inputs: tensor_metadata(&serving.inputs),
            outputs: tensor_metadata(&serving.outputs),
            name: req.name,
        }))
    }

    async fn model_infer(
        &self,
        request: Request<oip::ModelInferRequest>,
    ) -> Result<Response<oip::ModelInferResponse>, Status> {
        let arrived = Instant::now();
        let caller = caller_of(&request).or_status()?;
        let longest = self.app.config.serving.max_request_time;
        let deadline = deadline::grpc(request.metadata(), arrived, longest).or_status()?;
        let trace = request.extensions().get::<RequestTrace>().cloned();
        let req = request.into_inner();
        infer_one(&self.app, &caller, req, deadline, trace.as_ref())
            .await
            .map(Response::new)
    }

    type ModelStreamInferStream = stream_infer::Responses;

    /// Triton's decoupled stream: see [`stream_infer`].
    async fn model_stream_infer(
        &self,
        request: Request<tonic::Streaming<oip::ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        let caller = caller_of(&request).or_status()?;
        let trace = request.extensions().get::<RequestTrace>().cloned();
        let inbound = request.into_inner();
        Ok(Response::new(stream_infer::start(
            self.app.clone(),
            caller,
            trace,
            inbound,
        )))
    }
}
