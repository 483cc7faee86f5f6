//! Wire-level checks of the gRPC contract: the KServe v2 Open Inference Protocol messages keep
//! the specification's field numbers and types (so that unmodified OIP clients work), and the
//! descriptor set served by reflection holds both packages with the expected services.

use std::collections::{BTreeSet, HashMap};

use modelshare_proto::FILE_DESCRIPTOR_SET;
use modelshare_proto::inference::{
    InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse,
    infer_parameter::ParameterChoice,
    model_infer_request::{InferInputTensor, InferRequestedOutputTensor},
};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};
use prost_types::field_descriptor_proto::Label::{self, Optional as One, Repeated as Many};
use prost_types::field_descriptor_proto::Type;
use prost_types::{DescriptorProto, FileDescriptorSet, ServiceDescriptorProto};

/// Appends field `tag` as a length-delimited value (string, bytes, message, packed scalars).
fn ld(tag: u32, bytes: &[u8], buf: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.extend_from_slice(bytes);
}

/// Appends field `tag` as a varint.
fn varint(tag: u32, value: u64, buf: &mut Vec<u8>) {
    encode_key(tag, WireType::Varint, buf);
    encode_varint(value, buf);
}

/// Packed varints, the proto3 encoding of a repeated scalar integer field.
fn packed(values: &[u64]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        encode_varint(*v, &mut out);
    }
    out
}

/// One entry of a `map<string, InferParameter>`: key = 1, value = 2.
fn map_entry(key: &str, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    ld(1, key.as_bytes(), &mut out);
    ld(2, value, &mut out);
    out
}

/// A ModelInferRequest encoded by hand from the specification's field numbers decodes into
/// the right fields and encodes back to the same bytes; if this fails, OIP clients such as
/// tritonclient would send requests that modelshare misreads.
#[test]
fn model_infer_request_uses_the_spec_field_numbers() {
    // InferParameter { uint64_param (5) = 7 }
    let mut param_u64 = Vec::new();
    varint(5, 7, &mut param_u64);
    // InferParameter { bool_param (1) = true }
    let mut param_bool = Vec::new();
    varint(1, 1, &mut param_bool);
    // InferTensorContents { int_contents (2) = [1, 2, 3, 4] }
    let mut contents = Vec::new();
    ld(2, &packed(&[1, 2, 3, 4]), &mut contents);
    // InferInputTensor { name 1, datatype 2, shape 3, parameters 4, contents 5 }
    let mut input = Vec::new();
    ld(1, b"INPUT0", &mut input);
    ld(2, b"INT32", &mut input);
    ld(3, &packed(&[1, 4]), &mut input);
    ld(4, &map_entry("layout", &param_u64), &mut input);
    ld(5, &contents, &mut input);
    // InferRequestedOutputTensor { name 1, parameters 2 }
    let mut output = Vec::new();
    ld(1, b"OUTPUT0", &mut output);
    ld(2, &map_entry("binary_data", &param_bool), &mut output);
    // ModelInferRequest { model_name 1, model_version 2, id 3, parameters 4, inputs 5,
    // outputs 6, raw_input_contents 7 }
    let mut wire = Vec::new();
    ld(1, b"simple", &mut wire);
    ld(2, b"3", &mut wire);
    ld(3, b"req-1", &mut wire);
    ld(4, &map_entry("priority", &param_u64), &mut wire);
    ld(5, &input, &mut wire);
    ld(6, &output, &mut wire);
    ld(7, &[1, 0, 0, 0], &mut wire);
    ld(7, &[2, 0, 0, 0], &mut wire);

    let u64_param = InferParameter {
        parameter_choice: Some(ParameterChoice::Uint64Param(7)),
    };
    let expected = ModelInferRequest {
        model_name: "simple".into(),
        model_version: "3".into(),
        id: "req-1".into(),
        parameters: HashMap::from([("priority".to_owned(), u64_param.clone())]),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "INT32".into(),
            shape: vec![1, 4],
            parameters: HashMap::from([("layout".to_owned(), u64_param)]),
            contents: Some(InferTensorContents {
                int_contents: vec![1, 2, 3, 4],
                ..Default::default()
            }),
        }],
        outputs: vec![InferRequestedOutputTensor {
            name: "OUTPUT0".into(),
            parameters: HashMap::from([(
                "binary_data".to_owned(),
                InferParameter {
                    parameter_choice: Some(ParameterChoice::BoolParam(true)),
                },
            )]),
        }],
        raw_input_contents: vec![vec![1, 0, 0, 0].into(), vec![2, 0, 0, 0].into()],
    };

    let decoded = ModelInferRequest::decode(wire.as_slice()).expect("hand-built bytes decode");
    assert_eq!(decoded, expected);
    // One entry per map, so the encoding is deterministic: it must be the same bytes.
    assert_eq!(expected.encode_to_vec(), wire);
}

/// A ModelInferResponse with raw outputs (field 6) and typed contents survives a round trip
/// and puts raw_output_contents at field 6; if this fails, OIP clients cannot read results.
#[test]
fn model_infer_response_round_trips() {
    let response = ModelInferResponse {
        model_name: "simple".into(),
        model_version: "1".into(),
        id: "req-1".into(),
        parameters: HashMap::new(),
        outputs: vec![
            modelshare_proto::inference::model_infer_response::InferOutputTensor {
                name: "OUTPUT0".into(),
                datatype: "FP32".into(),
                shape: vec![2],
                parameters: HashMap::new(),
                contents: Some(InferTensorContents {
                    fp32_contents: vec![0.5, -1.0],
                    ..Default::default()
                }),
            },
        ],
        raw_output_contents: vec![vec![9, 9].into()],
    };
    let wire = response.encode_to_vec();
    assert_eq!(
        ModelInferResponse::decode(wire.as_slice()).unwrap(),
        response
    );
    // The last field written is raw_output_contents: key (6 << 3 | 2), length 2, bytes.
    assert!(wire.ends_with(&[(6 << 3) | 2, 2, 9, 9]));
}

fn descriptor_set() -> FileDescriptorSet {
    FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("the descriptor set decodes")
}

fn service<'a>(
    fds: &'a FileDescriptorSet,
    package: &str,
    name: &str,
) -> &'a ServiceDescriptorProto {
    fds.file
        .iter()
        .filter(|f| f.package() == package)
        .flat_map(|f| &f.service)
        .find(|s| s.name() == name)
        .unwrap_or_else(|| panic!("service {package}.{name} is in the descriptor set"))
}

/// Finds a message by its dotted path inside `package`, e.g. `ModelInferRequest.InferInputTensor`.
fn message<'a>(fds: &'a FileDescriptorSet, package: &str, path: &str) -> &'a DescriptorProto {
    let mut parts = path.split('.');
    let top = parts.next().unwrap();
    let mut msg = fds
        .file
        .iter()
        .filter(|f| f.package() == package)
        .flat_map(|f| &f.message_type)
        .find(|m| m.name() == top)
        .unwrap_or_else(|| panic!("message {package}.{top} exists"));
    for part in parts {
        msg = msg
            .nested_type
            .iter()
            .find(|m| m.name() == part)
            .unwrap_or_else(|| panic!("message {package}.{path} exists"));
    }
    msg
}

/// The descriptor set served by reflection holds `inference.GRPCInferenceService` with the
/// six OIP RPCs and `modelshare.v1.WorkerService` with `Serve` as a bidirectional stream; if
/// this fails, reflection clients (grpcurl) cannot see one of the two packages.
#[test]
fn descriptor_set_holds_both_packages() {
    let fds = descriptor_set();

    let oip = service(&fds, "inference", "GRPCInferenceService");
    let rpcs: Vec<(String, String, String, bool, bool)> = oip
        .method
        .iter()
        .map(|m| {
            (
                m.name().to_owned(),
                m.input_type().to_owned(),
                m.output_type().to_owned(),
                m.client_streaming(),
                m.server_streaming(),
            )
        })
        .collect();
    let expected: Vec<(String, String, String, bool, bool)> = [
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "ModelConfig",
        "ModelStatistics",
        "RepositoryIndex",
    ]
    .iter()
    .map(|n| {
        let input = format!(".inference.{n}Request");
        let output = format!(".inference.{n}Response");
        (n.to_string(), input, output, false, false)
    })
    // Triton's decoupled stream: requests and responses both stream.
    .chain([(
        "ModelStreamInfer".to_owned(),
        ".inference.ModelInferRequest".to_owned(),
        ".inference.ModelStreamInferResponse".to_owned(),
        true,
        true,
    )])
    .collect();
    assert_eq!(rpcs, expected);

    let worker = service(&fds, "modelshare.v1", "WorkerService");
    let names: Vec<&str> = worker.method.iter().map(|m| m.name()).collect();
    assert_eq!(
        names,
        ["Session", "Attach", "Release", "Serve", "OfferHeld"]
    );
    let serve = worker.method.iter().find(|m| m.name() == "Serve").unwrap();
    assert_eq!(serve.input_type(), ".modelshare.v1.ServeRequest");
    assert_eq!(serve.output_type(), ".modelshare.v1.ServeEvent");
    assert!(serve.client_streaming() && serve.server_streaming());

    // The admin service is still there too.
    service(&fds, "modelshare.v1", "AdminService");
}

/// Every OIP message, field by field: (message path, field, number, type, label, type name).
/// Taken from the specification's open_inference_grpc.proto.
#[rustfmt::skip]
const OIP_FIELDS: &[(&str, &str, i32, Type, Label, &str)] = &[
    ("ServerLiveResponse", "live", 1, Type::Bool, One, ""),
    ("ServerReadyResponse", "ready", 1, Type::Bool, One, ""),
    ("ModelReadyRequest", "name", 1, Type::String, One, ""),
    ("ModelReadyRequest", "version", 2, Type::String, One, ""),
    ("ModelReadyResponse", "ready", 1, Type::Bool, One, ""),
    ("ServerMetadataResponse", "name", 1, Type::String, One, ""),
    ("ServerMetadataResponse", "version", 2, Type::String, One, ""),
    ("ServerMetadataResponse", "extensions", 3, Type::String, Many, ""),
    ("ModelMetadataRequest", "name", 1, Type::String, One, ""),
    ("ModelMetadataRequest", "version", 2, Type::String, One, ""),
    ("ModelMetadataResponse", "name", 1, Type::String, One, ""),
    ("ModelMetadataResponse", "versions", 2, Type::String, Many, ""),
    ("ModelMetadataResponse", "platform", 3, Type::String, One, ""),
    ("ModelMetadataResponse", "inputs", 4, Type::Message, Many, ".inference.ModelMetadataResponse.TensorMetadata"),
    ("ModelMetadataResponse", "outputs", 5, Type::Message, Many, ".inference.ModelMetadataResponse.TensorMetadata"),
    ("ModelMetadataResponse.TensorMetadata", "name", 1, Type::String, One, ""),
    ("ModelMetadataResponse.TensorMetadata", "datatype", 2, Type::String, One, ""),
    ("ModelMetadataResponse.TensorMetadata", "shape", 3, Type::Int64, Many, ""),
    ("ModelInferRequest", "model_name", 1, Type::String, One, ""),
    ("ModelInferRequest", "model_version", 2, Type::String, One, ""),
    ("ModelInferRequest", "id", 3, Type::String, One, ""),
    ("ModelInferRequest", "parameters", 4, Type::Message, Many, ".inference.ModelInferRequest.ParametersEntry"),
    ("ModelInferRequest", "inputs", 5, Type::Message, Many, ".inference.ModelInferRequest.InferInputTensor"),
    ("ModelInferRequest", "outputs", 6, Type::Message, Many, ".inference.ModelInferRequest.InferRequestedOutputTensor"),
    ("ModelInferRequest", "raw_input_contents", 7, Type::Bytes, Many, ""),
    ("ModelInferRequest.InferInputTensor", "name", 1, Type::String, One, ""),
    ("ModelInferRequest.InferInputTensor", "datatype", 2, Type::String, One, ""),
    ("ModelInferRequest.InferInputTensor", "shape", 3, Type::Int64, Many, ""),
    ("ModelInferRequest.InferInputTensor", "parameters", 4, Type::Message, Many, ".inference.ModelInferRequest.InferInputTensor.ParametersEntry"),
    ("ModelInferRequest.InferInputTensor", "contents", 5, Type::Message, One, ".inference.InferTensorContents"),
    ("ModelInferRequest.InferRequestedOutputTensor", "name", 1, Type::String, One, ""),
    ("ModelInferRequest.InferRequestedOutputTensor", "parameters", 2, Type::Message, Many, ".inference.ModelInferRequest.InferRequestedOutputTensor.ParametersEntry"),
    ("ModelInferResponse", "model_name", 1, Type::String, One, ""),
    ("ModelInferResponse", "model_version", 2, Type::String, One, ""),
    ("ModelInferResponse", "id", 3, Type::String, One, ""),
    ("ModelInferResponse", "parameters", 4, Type::Message, Many, ".inference.ModelInferResponse.ParametersEntry"),
    ("ModelInferResponse", "outputs", 5, Type::Message, Many, ".inference.ModelInferResponse.InferOutputTensor"),
    ("ModelInferResponse", "raw_output_contents", 6, Type::Bytes, Many, ""),
    ("ModelInferResponse.InferOutputTensor", "name", 1, Type::String, One, ""),
    ("ModelInferResponse.InferOutputTensor", "datatype", 2, Type::String, One, ""),
    ("ModelInferResponse.InferOutputTensor", "shape", 3, Type::Int64, Many, ""),
    ("ModelInferResponse.InferOutputTensor", "parameters", 4, Type::Message, Many, ".inference.ModelInferResponse.InferOutputTensor.ParametersEntry"),
    ("ModelInferResponse.InferOutputTensor", "contents", 5, Type::Message, One, ".inference.InferTensorContents"),
    ("InferParameter", "bool_param", 1, Type::Bool, One, ""),
    ("InferParameter", "int64_param", 2, Type::Int64, One, ""),
    ("InferParameter", "string_param", 3, Type::String, One, ""),
    ("InferParameter", "double_param", 4, Type::Double, One, ""),
    ("InferParameter", "uint64_param", 5, Type::Uint64, One, ""),
    ("InferTensorContents", "bool_contents", 1, Type::Bool, Many, ""),
    ("InferTensorContents", "int_contents", 2, Type::Int32, Many, ""),
    ("InferTensorContents", "int64_contents", 3, Type::Int64, Many, ""),
    ("InferTensorContents", "uint_contents", 4, Type::Uint32, Many, ""),
    ("InferTensorContents", "uint64_contents", 5, Type::Uint64, Many, ""),
    ("InferTensorContents", "fp32_contents", 6, Type::Float, Many, ""),
    ("InferTensorContents", "fp64_contents", 7, Type::Double, Many, ""),
    ("InferTensorContents", "bytes_contents", 8, Type::Bytes, Many, ""),
    // Triton's extensions (grpc_service.proto, model_config.proto), the fields modelshare fills.
    ("ModelConfigRequest", "name", 1, Type::String, One, ""),
    ("ModelConfigRequest", "version", 2, Type::String, One, ""),
    ("ModelConfigResponse", "config", 1, Type::Message, One, ".inference.ModelConfig"),
    ("ModelConfig", "name", 1, Type::String, One, ""),
    ("ModelConfig", "platform", 2, Type::String, One, ""),
    ("ModelConfig", "max_batch_size", 4, Type::Int32, One, ""),
    ("ModelConfig", "input", 5, Type::Message, Many, ".inference.ModelInput"),
    ("ModelConfig", "output", 6, Type::Message, Many, ".inference.ModelOutput"),
    ("ModelConfig", "dynamic_batching", 11, Type::Message, One, ".inference.ModelDynamicBatching"),
    ("ModelConfig", "backend", 17, Type::String, One, ""),
    ("ModelInput", "name", 1, Type::String, One, ""),
    ("ModelInput", "data_type", 2, Type::Enum, One, ".inference.DataType"),
    ("ModelInput", "dims", 4, Type::Int64, Many, ""),
    ("ModelOutput", "name", 1, Type::String, One, ""),
    ("ModelOutput", "data_type", 2, Type::Enum, One, ".inference.DataType"),
    ("ModelOutput", "dims", 3, Type::Int64, Many, ""),
    ("ModelDynamicBatching", "preferred_batch_size", 1, Type::Int32, Many, ""),
    ("ModelDynamicBatching", "max_queue_delay_microseconds", 2, Type::Uint64, One, ""),
    ("RepositoryIndexRequest", "repository_name", 1, Type::String, One, ""),
    ("RepositoryIndexRequest", "ready", 2, Type::Bool, One, ""),
    ("RepositoryIndexResponse", "models", 1, Type::Message, Many, ".inference.RepositoryIndexResponse.ModelIndex"),
    ("RepositoryIndexResponse.ModelIndex", "name", 1, Type::String, One, ""),
    ("RepositoryIndexResponse.ModelIndex", "version", 2, Type::String, One, ""),
    ("RepositoryIndexResponse.ModelIndex", "state", 3, Type::String, One, ""),
    ("RepositoryIndexResponse.ModelIndex", "reason", 4, Type::String, One, ""),
    ("ModelStatisticsRequest", "name", 1, Type::String, One, ""),
    ("ModelStatisticsRequest", "version", 2, Type::String, One, ""),
    ("ModelStatisticsResponse", "model_stats", 1, Type::Message, Many, ".inference.ModelStatistics"),
    ("ModelStatistics", "name", 1, Type::String, One, ""),
    ("ModelStatistics", "version", 2, Type::String, One, ""),
    ("ModelStatistics", "last_inference", 3, Type::Uint64, One, ""),
    ("ModelStatistics", "inference_count", 4, Type::Uint64, One, ""),
    ("ModelStatistics", "execution_count", 5, Type::Uint64, One, ""),
    ("ModelStatistics", "inference_stats", 6, Type::Message, One, ".inference.InferStatistics"),
    ("ModelStatistics", "batch_stats", 7, Type::Message, Many, ".inference.InferBatchStatistics"),
    ("StatisticDuration", "count", 1, Type::Uint64, One, ""),
    ("StatisticDuration", "ns", 2, Type::Uint64, One, ""),
    ("InferStatistics", "success", 1, Type::Message, One, ".inference.StatisticDuration"),
    ("InferStatistics", "fail", 2, Type::Message, One, ".inference.StatisticDuration"),
    ("InferStatistics", "queue", 3, Type::Message, One, ".inference.StatisticDuration"),
    ("InferStatistics", "compute_input", 4, Type::Message, One, ".inference.StatisticDuration"),
    ("InferStatistics", "compute_infer", 5, Type::Message, One, ".inference.StatisticDuration"),
    ("InferStatistics", "compute_output", 6, Type::Message, One, ".inference.StatisticDuration"),
    ("InferBatchStatistics", "batch_size", 1, Type::Uint64, One, ""),
    ("InferBatchStatistics", "compute_input", 2, Type::Message, One, ".inference.StatisticDuration"),
    ("InferBatchStatistics", "compute_infer", 3, Type::Message, One, ".inference.StatisticDuration"),
    ("InferBatchStatistics", "compute_output", 4, Type::Message, One, ".inference.StatisticDuration"),
    ("ModelStreamInferResponse", "error_message", 1, Type::String, One, ""),
    ("ModelStreamInferResponse", "infer_response", 2, Type::Message, One, ".inference.ModelInferResponse"),
];

/// The messages of the OIP that have no fields.
const OIP_EMPTY: &[&str] = &[
    "ServerLiveRequest",
    "ServerReadyRequest",
    "ServerMetadataRequest",
];

/// Every field of every OIP message has the specification's name, number, type and label, and
/// no message has a field the specification lacks; if this fails, the file has drifted from
/// the specification and some OIP client would misread it.
#[test]
fn oip_messages_match_the_specification() {
    let fds = descriptor_set();
    let mut paths: BTreeSet<&str> = OIP_FIELDS.iter().map(|f| f.0).collect();
    for &(path, name, number, ty, label, type_name) in OIP_FIELDS {
        let msg = message(&fds, "inference", path);
        let field = msg
            .field
            .iter()
            .find(|f| f.name() == name)
            .unwrap_or_else(|| panic!("inference.{path} has field {name}"));
        assert_eq!(field.number(), number, "inference.{path}.{name} number");
        assert_eq!(field.r#type(), ty, "inference.{path}.{name} type");
        assert_eq!(field.label(), label, "inference.{path}.{name} label");
        assert_eq!(
            field.type_name(),
            type_name,
            "inference.{path}.{name} type name"
        );
    }
    // No extra fields: each message has exactly the fields listed.
    for path in &paths {
        let listed = OIP_FIELDS.iter().filter(|f| f.0 == *path).count();
        assert_eq!(
            message(&fds, "inference", path).field.len(),
            listed,
            "fields of inference.{path}"
        );
    }
    // The five InferParameter fields form the `parameter_choice` oneof.
    let param = message(&fds, "inference", "InferParameter");
    assert_eq!(param.oneof_decl.len(), 1);
    assert_eq!(param.oneof_decl[0].name(), "parameter_choice");
    assert!(param.field.iter().all(|f| f.oneof_index == Some(0)));
    // The map fields map string to InferParameter.
    for path in [
        "ModelInferRequest",
        "ModelInferRequest.InferInputTensor",
        "ModelInferRequest.InferRequestedOutputTensor",
        "ModelInferResponse",
        "ModelInferResponse.InferOutputTensor",
    ] {
        let entry = message(&fds, "inference", &format!("{path}.ParametersEntry"));
        assert!(
            entry.options.as_ref().is_some_and(|o| o.map_entry()),
            "{path}.parameters is a map"
        );
        let value = entry.field.iter().find(|f| f.name() == "value").unwrap();
        assert_eq!(value.type_name(), ".inference.InferParameter");
        let key = entry.field.iter().find(|f| f.name() == "key").unwrap();
        assert_eq!(key.r#type(), Type::String);
    }
    // The whole package: the listed messages, the empty ones, and nothing else at top level.
    for empty in OIP_EMPTY {
        assert!(
            message(&fds, "inference", empty).field.is_empty(),
            "inference.{empty} is empty"
        );
    }
    paths.retain(|p| !p.contains('.'));
    paths.extend(OIP_EMPTY);
    let top: BTreeSet<&str> = fds
        .file
        .iter()
        .filter(|f| f.package() == "inference")
        .flat_map(|f| &f.message_type)
        .map(|m| m.name())
        .collect();
    assert_eq!(top, paths);
}

/// A Serve batch and its result survive encoding; if this fails, the generated types of the
/// request path are unusable.
#[test]
fn serve_messages_round_trip() {
    use modelshare_proto::v1::{
        Batch, BatchResult, DType, Item, ItemError, ItemResult, Parameter, ServeEvent,
        ServeRequest, TensorInput, Tensors, item, item_result, parameter, serve_event,
        serve_request,
    };
    let event = ServeEvent {
        kind: Some(serve_event::Kind::Batch(Batch {
            batch_id: 7,
            version: 2,
            items: vec![Item {
                item_id: 41,
                input: Some(item::Input::Tensors(Tensors {
                    tensors: vec![TensorInput {
                        name: "input_ids".into(),
                        dtype: DType::DtypeI64 as i32,
                        shape: vec![1, 3],
                        data: vec![0; 24].into(),
                    }],
                })),
                parameters: HashMap::from([(
                    "max_tokens".to_owned(),
                    Parameter {
                        value: Some(parameter::Value::Int64Value(16)),
                    },
                )]),
                deadline_unix_ms: 1_700_000_000_000,
                request_id: "req-1".into(),
                traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
                stream: false,
            }],
        })),
    };
    let wire = event.encode_to_vec();
    assert_eq!(ServeEvent::decode(wire.as_slice()).unwrap(), event);

    let answer = ServeRequest {
        kind: Some(serve_request::Kind::Result(BatchResult {
            batch_id: 7,
            results: vec![ItemResult {
                item_id: 41,
                outcome: Some(item_result::Outcome::Error(ItemError {
                    code: 3,
                    message: "input_ids has 3 tokens, the model takes at most 2".into(),
                })),
            }],
        })),
    };
    let wire = answer.encode_to_vec();
    assert_eq!(ServeRequest::decode(wire.as_slice()).unwrap(), answer);
}
