//! `modelshare describe`: a model, its version's manifest (tensors, metadata files) and the
//! device that holds it.

use comfy_table::Cell;
use modelshare_proto::v1 as pb;
use serde_json::{Value, json};

use super::models::{model_json, models};
use super::{OutputFormat, backend_name, dtype_name, human_bytes, print_json, right, say, table};

/// `modelshare describe`.
pub fn describe(r: &pb::DescribeModelResponse, out: OutputFormat) {
    match out {
        OutputFormat::Json => print_json(&json!({
            "model": r.model.as_ref().map(model_json),
            "manifest": r.manifest.as_ref().map(manifest_json),
            "device": r.device.as_ref().map(|d| json!({
                "uuid": d.uuid, "name": d.name, "backend": backend_name(d.backend),
            })),
        })),
        OutputFormat::Table => {
            if let Some(m) = &r.model {
                models(std::slice::from_ref(m), OutputFormat::Table);
            }
            if let Some(m) = &r.manifest {
                manifest_table(m, r.device.as_ref());
            }
        }
    }
}

/// JSON of a version's manifest: its tensors, header metadata and metadata files.
fn manifest_json(m: &pb::Manifest) -> Value {
    json!({
        "model": m.model,
        "version": m.version,
        "arena_bytes": m.arena_bytes,
        "alignment": m.alignment,
        "tensors": m.tensors.iter().map(|t| json!({
            "name": t.name,
            "dtype": dtype_name(t.dtype),
            "shape": t.shape,
            "offset": t.offset,
            "byte_length": t.byte_length,
            "xxh3": format!("{:016x}", t.xxh3),
        })).collect::<Vec<_>>(),
        "header_metadata": m.header_metadata,
        "files": m.files.iter().map(|f| json!({"name": f.name, "bytes": f.content.len()})).collect::<Vec<_>>(),
    })
}

/// A version's manifest as a line (where its arena is and how workers map it), a table of its
/// tensors, and its metadata files.
fn manifest_table(m: &pb::Manifest, device: Option<&pb::DeviceInfo>) {
    say!(
        "version {}: {} tensors in a {} arena, aligned to {} bytes{}",
        m.version,
        m.tensors.len(),
        human_bytes(m.arena_bytes),
        m.alignment,
        device.map_or(String::new(), |d| format!(
            ", on {} ({}: workers map it {})",
            d.uuid,
            backend_name(d.backend),
            if d.backend == pb::BackendKind::CudaIpc as i32 {
                "WRITABLE"
            } else {
                "read-only"
            }
        ))
    );
    let mut t = table(&["TENSOR", "DTYPE", "SHAPE", "OFFSET", "BYTES", "XXH3"]);
    for x in &m.tensors {
        t.add_row(vec![
            Cell::new(&x.name),
            Cell::new(dtype_name(x.dtype)),
            Cell::new(format!("{:?}", x.shape)),
            right(x.offset),
            right(x.byte_length),
            Cell::new(format!("{:016x}", x.xxh3)),
        ]);
    }
    say!("{t}");
    if !m.files.is_empty() {
        let names: Vec<&str> = m.files.iter().map(|f| f.name.as_str()).collect();
        say!("metadata files: {}", names.join(", "));
    }
}
