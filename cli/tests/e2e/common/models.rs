//! Model files: tensors of random contents, written with the official `safetensors` crate.

use std::collections::HashMap;
use std::path::Path;

use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// Deterministic pseudo-random bytes (xorshift64*), never all zeros.
pub fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        out.extend_from_slice(&s.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// One tensor to write.
#[derive(Debug, Clone)]
pub struct T {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// A tensor of random contents.
pub fn t(name: &str, dtype: Dtype, shape: &[usize], seed: u64) -> T {
    let n: usize = shape.iter().product::<usize>() * dtype.size();
    T {
        name: name.to_owned(),
        dtype,
        shape: shape.to_vec(),
        data: random_bytes(seed, n),
    }
}

/// Writes `tensors` as a safetensors file with the official crate.
pub fn write_safetensors(path: &Path, tensors: &[T]) {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                TensorView::new(t.dtype, t.shape.clone(), &t.data).expect("view"),
            )
        })
        .collect();
    let meta: Option<HashMap<String, String>> =
        Some([("format".to_string(), "pt".to_string())].into());
    safetensors::serialize_to_file(views, &meta, path).expect("serialize");
}

/// Writes a sharded model: `shards[i]` goes to `model-0000{i+1}-of-0000{n}.safetensors`, with
/// the index beside them.
pub fn write_sharded(dir: &Path, shards: &[Vec<T>]) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    for (i, tensors) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, n);
        write_safetensors(&dir.join(&file), tensors);
        for t in tensors {
            weight_map.insert(t.name.clone(), serde_json::Value::String(file.clone()));
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
}
