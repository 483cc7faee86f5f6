//! The body of a `/v1/embeddings` answer, written straight into its bytes.
//!
//! The same JSON as a `serde_json::Value` rendered with sorted keys (`data`, `model`,
//! `object`, `usage`; in each item `embedding`, `index`, `object`), without building that
//! value: an FP32 output's little-endian bytes are what base64 carries, so they are encoded
//! from the tensor in place, into the body (no vector per item, no string per vector, no
//! escaping scan of the base64 text); numbers are written as the value would write them (each
//! f32 widened to f64; not finite: `null`). For MiniLM at 2,000 requests of 64 vectors a
//! second, the value tree, its strings and its serializing took most of a core of the server.

use base64::Engine as _;
use modelshare_proto::v1 as pb;
use modelshare_serving::{InferError, InferResponse};

/// The embedding of one item: an FP32 tensor's bytes as they are, or the values of another
/// float type rounded to f32.
enum Vector<'a> {
    Le(&'a [u8]),
    Converted(Vec<f32>),
}

impl Vector<'_> {
    fn len(&self) -> usize {
        match self {
            Vector::Le(b) => b.len() / 4,
            Vector::Converted(v) => v.len(),
        }
    }

    fn for_each(&self, mut f: impl FnMut(f32)) {
        match self {
            Vector::Le(b) => b
                .chunks_exact(4)
                .for_each(|c| f(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
            Vector::Converted(v) => v.iter().copied().for_each(f),
        }
    }
}

/// The answer's body: each output's embedding (base64 of its f32 bytes, or `floats`) and the
/// usage summed over the outputs' `prompt_tokens`. Fails, writing nothing, on an output that
/// holds no embedding.
pub(super) fn render(r: &InferResponse, floats: bool) -> Result<Vec<u8>, InferError> {
    let vectors = r
        .outputs
        .iter()
        .map(|o| embedding(&r.model, o))
        .collect::<Result<Vec<_>, _>>()?;
    let tokens = r
        .outputs
        .iter()
        .fold(0i64, |sum, o| sum.saturating_add(prompt_tokens(o)));
    let values: usize = vectors.iter().map(Vector::len).sum();
    let per_value = if floats { 24 } else { 6 };
    let mut out = Vec::with_capacity(128 + r.model.len() + vectors.len() * 64 + values * per_value);
    out.extend_from_slice(b"{\"data\":[");
    for (index, vector) in vectors.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"embedding\":");
        if floats {
            write_floats(&mut out, vector);
        } else {
            write_base64(&mut out, vector);
        }
        write_text(
            &mut out,
            format_args!(",\"index\":{index},\"object\":\"embedding\"}}"),
        );
    }
    out.extend_from_slice(b"],\"model\":");
    write_json(&mut out, &r.model);
    write_text(
        &mut out,
        format_args!(
            ",\"object\":\"list\",\"usage\":{{\"prompt_tokens\":{tokens},\"total_tokens\":{tokens}}}}}"
        ),
    );
    Ok(out)
}

/// `[x, y, ...]`, each as serde_json writes the f64 it widens to (`null` if not finite).
fn write_floats(out: &mut Vec<u8>, vector: &Vector<'_>) {
    out.push(b'[');
    let mut first = true;
    vector.for_each(|x| {
        if !first {
            out.push(b',');
        }
        first = false;
        write_json(out, &f64::from(x));
    });
    out.push(b']');
}

/// `"<base64 of the little-endian f32 bytes>"`, encoded into `out` in place.
fn write_base64(out: &mut Vec<u8>, vector: &Vector<'_>) {
    let converted: Vec<u8>;
    let bytes = match vector {
        Vector::Le(b) => *b,
        Vector::Converted(v) => {
            converted = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            &converted
        }
    };
    let engine = &base64::engine::general_purpose::STANDARD;
    out.push(b'"');
    let start = out.len();
    let len = base64::encoded_len(bytes.len(), true).expect("a tensor's base64 fits usize");
    out.resize(start + len, 0);
    let written = engine
        .encode_slice(bytes, &mut out[start..])
        .expect("room for the base64 was made");
    out.truncate(start + written);
    out.push(b'"');
}

/// Formatted text, written into `out` without a string of its own.
fn write_text(out: &mut Vec<u8>, text: std::fmt::Arguments<'_>) {
    // Writing into a Vec cannot fail.
    std::io::Write::write_fmt(out, text).expect("text into memory");
}

/// `value` as JSON (a string escaped, a float as serde_json writes it).
fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing a string or a number into a Vec cannot fail.
    serde_json::to_writer(out, value).expect("JSON into memory");
}

/// Bytes per element of a float output the answer takes; `None` for any other dtype.
fn float_size(dtype: i32) -> Option<usize> {
    match pb::DType::try_from(dtype) {
        Ok(pb::DType::DtypeF32) => Some(4),
        Ok(pb::DType::DtypeF16 | pb::DType::DtypeBf16) => Some(2),
        Ok(pb::DType::DtypeF64) => Some(8),
        _ => None,
    }
}

/// Each `N`-byte element of `data` widened or rounded to f32 by `f`.
fn to_f32<const N: usize>(data: &[u8], f: impl Fn([u8; N]) -> f32) -> Vec<f32> {
    data.chunks_exact(N)
        .map(|c| f(c.try_into().unwrap_or([0; N])))
        .collect()
}

/// The embedding of one output: the tensor `embedding`, else its first float tensor, of rank
/// 1 (or `[1, d]`), its bytes whole elements, as many as its shape says (checked before any
/// value is read).
fn embedding<'a>(model: &str, output: &'a pb::ItemOutput) -> Result<Vector<'a>, InferError> {
    let bad = |reason: String| InferError::BadOutput {
        model: model.to_owned(),
        reason,
    };
    let t = output
        .tensors
        .iter()
        .find(|t| t.name == "embedding")
        .or_else(|| {
            output
                .tensors
                .iter()
                .find(|t| float_size(t.dtype).is_some())
        })
        .ok_or_else(|| bad("no 'embedding' output and no float output".into()))?;
    let vector = t.shape.len() == 1 || (t.shape.len() == 2 && t.shape[0] == 1);
    if !vector {
        return Err(bad(format!(
            "output '{}' has shape {:?}; an embedding is one vector",
            t.name, t.shape
        )));
    }
    let Some(size) = float_size(t.dtype) else {
        return Err(bad(format!("output '{}' is not a float tensor", t.name)));
    };
    let want = t.shape.iter().product::<i64>();
    if t.data.len() % size != 0 || (t.data.len() / size) as i64 != want {
        return Err(bad(format!(
            "output '{}' has {} bytes of {}-byte values for shape {:?}",
            t.name,
            t.data.len(),
            size,
            t.shape
        )));
    }
    let data = &t.data[..];
    Ok(match pb::DType::try_from(t.dtype) {
        Ok(pb::DType::DtypeF16) => {
            Vector::Converted(to_f32(data, |b| half::f16::from_le_bytes(b).to_f32()))
        }
        Ok(pb::DType::DtypeBf16) => {
            Vector::Converted(to_f32(data, |b| half::bf16::from_le_bytes(b).to_f32()))
        }
        // A Python worker's numpy arrays are float64 unless told otherwise: rounded to the
        // f32 the answer carries (base64 is f32 by OpenAI's definition).
        Ok(pb::DType::DtypeF64) => {
            Vector::Converted(to_f32(data, |b| f64::from_le_bytes(b) as f32))
        }
        // FP32 (float_size let no other type through): the bytes as they are.
        _ => Vector::Le(data),
    })
}

fn prompt_tokens(output: &pb::ItemOutput) -> i64 {
    match output
        .parameters
        .get("prompt_tokens")
        .and_then(|p| p.value.as_ref())
    {
        Some(pb::parameter::Value::Int64Value(n)) => *n,
        Some(pb::parameter::Value::Uint64Value(n)) => i64::try_from(*n).unwrap_or(i64::MAX),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn tensor(dtype: pb::DType, shape: Vec<i64>, data: Vec<u8>) -> pb::TensorOutput {
        pb::TensorOutput {
            name: "embedding".into(),
            dtype: dtype as i32,
            shape,
            data: data.into(),
        }
    }

    fn output(t: pb::TensorOutput, tokens: i64) -> pb::ItemOutput {
        pb::ItemOutput {
            tensors: vec![t],
            parameters: [(
                "prompt_tokens".to_owned(),
                pb::Parameter {
                    value: Some(pb::parameter::Value::Int64Value(tokens)),
                },
            )]
            .into(),
        }
    }

    fn f32s(v: &[f32]) -> pb::TensorOutput {
        tensor(
            pb::DType::DtypeF32,
            vec![v.len() as i64],
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }

    /// What the body was before it was written by hand: a `json!` value (sorted keys, each
    /// f32 a number as serde_json writes it), rendered.
    fn as_value_would(model: &str, vectors: &[Vec<f32>], tokens: i64, floats: bool) -> Vec<u8> {
        let data: Vec<Value> = vectors
            .iter()
            .enumerate()
            .map(|(index, v)| {
                let embedding = if floats {
                    json!(v)
                } else {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                };
                json!({ "object": "embedding", "index": index, "embedding": embedding })
            })
            .collect();
        serde_json::to_vec(&json!({
            "object": "list",
            "data": data,
            "model": model,
            "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
        }))
        .expect("renders")
    }

    /// The hand-written body would differ from the JSON value it replaced by a byte: a key, the
    /// order, a number's digits (odd floats included), the base64, the usage, the model's
    /// escaping.
    #[test]
    fn the_body_is_byte_for_byte_the_json_value_it_replaced() {
        let vectors = vec![
            vec![1.0, -2.5, 0.1, 1e-40, f32::MAX, -0.0, 3.4028e-38],
            vec![f32::NAN, f32::INFINITY, 0.333_333_34],
            vec![],
        ];
        let model = "m\"odel\\ \u{1F600}";
        let r = InferResponse {
            model: model.into(),
            versions: vec![1; 3],
            outputs: vectors
                .iter()
                .zip([2, 3, 4])
                .map(|(v, t)| output(f32s(v), t))
                .collect(),
        };
        for floats in [true, false] {
            let got = render(&r, floats).expect("renders");
            let want = as_value_would(model, &vectors, 9, floats);
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want),
                "floats: {floats}"
            );
        }
    }

    /// Other float types would be refused, or sent as their own bytes instead of f32.
    #[test]
    fn f16_bf16_and_f64_embeddings_are_answered_as_f32() {
        let values = [0.5f32, -0.125, 3.0];
        let cases = [
            tensor(
                pb::DType::DtypeF16,
                vec![3],
                values
                    .iter()
                    .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                    .collect(),
            ),
            tensor(
                pb::DType::DtypeBf16,
                vec![1, 3],
                values
                    .iter()
                    .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                    .collect(),
            ),
            tensor(
                pb::DType::DtypeF64,
                vec![3],
                values
                    .iter()
                    .flat_map(|&x| f64::from(x).to_le_bytes())
                    .collect(),
            ),
        ];
        for t in cases {
            let dtype = t.dtype;
            let r = InferResponse {
                model: "m".into(),
                versions: vec![1],
                outputs: vec![output(t, 1)],
            };
            for floats in [true, false] {
                let got = render(&r, floats).expect("renders");
                let want = as_value_would("m", &[values.to_vec()], 1, floats);
                assert_eq!(got, want, "dtype {dtype}, floats {floats}");
            }
        }
    }

    /// A worker's malformed output would be answered (garbage, or a panic) instead of a clear
    /// error naming the model.
    #[test]
    fn outputs_that_hold_no_embedding_are_errors() {
        let bad = [
            tensor(pb::DType::DtypeF32, vec![2, 2], vec![0; 16]),
            tensor(pb::DType::DtypeF32, vec![3], vec![0; 8]),
            tensor(pb::DType::DtypeF32, vec![2], vec![0; 9]),
            tensor(pb::DType::DtypeF16, vec![2], vec![0; 5]),
            tensor(pb::DType::DtypeI32, vec![2], vec![0; 8]),
        ];
        for t in bad {
            let shape = t.shape.clone();
            let r = InferResponse {
                model: "m".into(),
                versions: vec![1, 1],
                outputs: vec![output(f32s(&[1.0]), 1), output(t, 1)],
            };
            for floats in [true, false] {
                let e = render(&r, floats).expect_err("refused");
                assert!(
                    matches!(&e, InferError::BadOutput { model, .. } if model == "m"),
                    "{shape:?}: {e}"
                );
            }
        }
        let none = InferResponse {
            model: "m".into(),
            versions: vec![1],
            outputs: vec![pb::ItemOutput::default()],
        };
        assert!(render(&none, false).is_err());
    }
}
