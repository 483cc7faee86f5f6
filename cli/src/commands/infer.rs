//! `modelshare embed` and `modelshare infer`: a request through the server's KServe v2 (OIP)
//! gRPC front door, `GRPCInferenceService.ModelInfer`, the same way any OIP client sends one.

use modelshare_proto::inference as oip;
use modelshare_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use modelshare_worker::AuthChannel;
use serde_json::{Value, json};

use super::error::{CliError, rpc};
use super::output::{OutputFormat, print_json, say, table};

/// One `--input NAME:DATATYPE:SHAPE=VALUES` of `modelshare infer`.
#[derive(Debug, Clone, PartialEq)]
pub struct InputArg {
    name: String,
    datatype: String,
    shape: Vec<i64>,
    values: Vec<String>,
}

impl std::str::FromStr for InputArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = "expected NAME:DATATYPE:SHAPE=VALUES, e.g. x:FP32:2x3=1,2,3,4,5,6";
        let (head, values) = s.split_once('=').ok_or(usage)?;
        let mut parts = head.splitn(3, ':');
        let (Some(name), Some(datatype), Some(shape)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(usage.into());
        };
        let shape = shape
            .split('x')
            .map(|d| {
                d.trim()
                    .parse::<i64>()
                    .map_err(|_| format!("bad dimension '{d}': {usage}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            name: name.to_owned(),
            datatype: datatype.to_uppercase(),
            shape,
            values: values.split(',').map(str::to_owned).collect(),
        })
    }
}

fn parse_all<T: std::str::FromStr>(input: &InputArg) -> Result<Vec<T>, CliError> {
    input
        .values
        .iter()
        .map(|v| {
            v.trim().parse::<T>().map_err(|_| {
                CliError::Usage(format!(
                    "input '{}': '{v}' is not a {} value",
                    input.name, input.datatype
                ))
            })
        })
        .collect()
}

/// The OIP tensor of an `--input`, its values in the typed contents.
fn tensor(input: &InputArg) -> Result<oip::model_infer_request::InferInputTensor, CliError> {
    let mut c = oip::InferTensorContents::default();
    match input.datatype.as_str() {
        "BOOL" => c.bool_contents = parse_all(input)?,
        "INT8" | "INT16" | "INT32" => c.int_contents = parse_all(input)?,
        "INT64" => c.int64_contents = parse_all(input)?,
        "UINT8" | "UINT16" | "UINT32" => c.uint_contents = parse_all(input)?,
        "UINT64" => c.uint64_contents = parse_all(input)?,
        "FP32" => c.fp32_contents = parse_all(input)?,
        "FP64" => c.fp64_contents = parse_all(input)?,
        "BYTES" => {
            c.bytes_contents = input
                .values
                .iter()
                .map(|v| v.clone().into_bytes())
                .collect()
        }
        other => {
            return Err(CliError::Usage(format!(
                "input '{}': datatype {other} cannot be given on the command line (BOOL, INT8..INT64, UINT8..UINT64, FP32, FP64, BYTES)",
                input.name
            )));
        }
    }
    Ok(oip::model_infer_request::InferInputTensor {
        name: input.name.clone(),
        datatype: input.datatype.clone(),
        shape: input.shape.clone(),
        parameters: Default::default(),
        contents: Some(c),
    })
}

/// The values of one raw output, as JSON numbers (or strings for BYTES).
fn values(datatype: &str, raw: &[u8]) -> Vec<Value> {
    match modelshare_server::front::oip::dtype(datatype) {
        Ok(dtype) => modelshare_server::front::oip::raw_to_json(dtype, raw),
        Err(_) => vec![json!(format!("{} raw bytes", raw.len()))],
    }
}

async fn model_infer(
    channel: AuthChannel,
    request: oip::ModelInferRequest,
) -> Result<oip::ModelInferResponse, CliError> {
    let mut client = GrpcInferenceServiceClient::new(channel)
        .max_decoding_message_size(128 << 20)
        .max_encoding_message_size(128 << 20);
    Ok(client
        .model_infer(request)
        .await
        .map_err(rpc("ModelInfer"))?
        .into_inner())
}

/// Each output of a response, with its values.
fn outputs(r: &oip::ModelInferResponse) -> Vec<(String, String, Vec<i64>, Vec<Value>)> {
    r.outputs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let raw = r.raw_output_contents.get(i).map_or(&[][..], |b| &b[..]);
            (
                o.name.clone(),
                o.datatype.clone(),
                o.shape.clone(),
                values(&o.datatype, raw),
            )
        })
        .collect()
}

/// `modelshare embed --model NAME TEXT...`: one BYTES input of the texts; prints the
/// `embedding` output, a row per text.
pub async fn embed(
    channel: AuthChannel,
    model: String,
    texts: Vec<String>,
    out: OutputFormat,
) -> Result<(), CliError> {
    if texts.is_empty() {
        return Err(CliError::Usage("give at least one text to embed".into()));
    }
    let input = InputArg {
        name: "text".into(),
        datatype: "BYTES".into(),
        shape: vec![i64::try_from(texts.len()).unwrap_or(i64::MAX)],
        values: texts.clone(),
    };
    let request = oip::ModelInferRequest {
        model_name: model.clone(),
        inputs: vec![tensor(&input)?],
        ..Default::default()
    };
    let r = model_infer(channel, request).await?;
    let outs = outputs(&r);
    let (_, _, shape, values) = outs
        .iter()
        .find(|(name, ..)| name == "embedding")
        .or_else(|| outs.first())
        .ok_or_else(|| CliError::Usage(format!("model '{model}' returned no output")))?;
    let dim = shape
        .last()
        .and_then(|d| usize::try_from(*d).ok())
        .unwrap_or(0)
        .max(1);
    let rows: Vec<&[Value]> = values.chunks(dim).collect();
    match out {
        OutputFormat::Json => print_json(&json!({
            "model": r.model_name,
            "version": r.model_version,
            "embeddings": rows,
        })),
        OutputFormat::Table => {
            let mut t = table(&["TEXT", "DIM", "EMBEDDING"]);
            for (text, row) in texts.iter().zip(&rows) {
                let head: Vec<String> = row.iter().take(6).map(Value::to_string).collect();
                let more = if row.len() > 6 { ", ..." } else { "" };
                t.add_row(vec![
                    text.chars().take(40).collect::<String>(),
                    row.len().to_string(),
                    format!("[{}{more}]", head.join(", ")),
                ]);
            }
            say!("{t}");
            say!("model {} version {}", r.model_name, r.model_version);
        }
    }
    Ok(())
}

/// `modelshare infer --model NAME --input NAME:DATATYPE:SHAPE=VALUES...`: prints every output.
pub async fn infer(
    channel: AuthChannel,
    model: String,
    inputs: Vec<InputArg>,
    out: OutputFormat,
) -> Result<(), CliError> {
    if inputs.is_empty() {
        return Err(CliError::Usage("give at least one --input".into()));
    }
    let request = oip::ModelInferRequest {
        model_name: model,
        inputs: inputs.iter().map(tensor).collect::<Result<_, _>>()?,
        ..Default::default()
    };
    let r = model_infer(channel, request).await?;
    let outs = outputs(&r);
    match out {
        OutputFormat::Json => print_json(&json!({
            "model": r.model_name,
            "version": r.model_version,
            "outputs": outs.iter().map(|(name, datatype, shape, data)| json!({
                "name": name, "datatype": datatype, "shape": shape, "data": data,
            })).collect::<Vec<_>>(),
        })),
        OutputFormat::Table => {
            let mut t = table(&["OUTPUT", "DATATYPE", "SHAPE", "DATA"]);
            for (name, datatype, shape, data) in &outs {
                let shape: Vec<String> = shape.iter().map(i64::to_string).collect();
                let head: Vec<String> = data.iter().take(12).map(Value::to_string).collect();
                let more = if data.len() > 12 { ", ..." } else { "" };
                t.add_row(vec![
                    name.clone(),
                    datatype.clone(),
                    format!("[{}]", shape.join(", ")),
                    format!("[{}{more}]", head.join(", ")),
                ]);
            }
            say!("{t}");
            say!("model {} version {}", r.model_name, r.model_version);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_parse_and_bad_ones_say_why() {
        let a: InputArg = "x:fp32:2x3=1,2,3,4,5,6".parse().expect("parses");
        assert_eq!(a.datatype, "FP32");
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(
            tensor(&a)
                .expect("tensor")
                .contents
                .expect("c")
                .fp32_contents
                .len(),
            6
        );
        assert!("x:FP32=1".parse::<InputArg>().is_err());
        assert!("x:FP32:2xq=1".parse::<InputArg>().is_err());
        let bad: InputArg = "x:INT32:1=one".parse().expect("parses");
        assert!(tensor(&bad).is_err());
    }

    #[test]
    fn raw_outputs_decode_by_datatype() {
        let raw: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(values("FP32", &raw), vec![json!(1.5), json!(-2.0)]);
        let mut bytes = 2u32.to_le_bytes().to_vec();
        bytes.extend(b"hi");
        assert_eq!(values("BYTES", &bytes), vec![json!("hi")]);
    }
}
