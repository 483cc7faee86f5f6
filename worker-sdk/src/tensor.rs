//! Read-only views of tensors inside a mapped arena.

use std::sync::Arc;

use modelshare_device::HostMapping;
use modelshare_proto::v1 as pb;

/// One tensor of an attached model: metadata plus its bytes in the shared mapping.
#[derive(Debug, Clone)]
pub struct Tensor {
    info: pb::TensorInfo,
    mapping: Arc<HostMapping>,
}

impl Tensor {
    pub(crate) fn new(info: pb::TensorInfo, mapping: Arc<HostMapping>) -> Self {
        Self { info, mapping }
    }

    /// Name as in the weight file.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// Element type.
    pub fn dtype(&self) -> pb::DType {
        self.info.dtype()
    }

    /// Dimensions, outermost first.
    pub fn shape(&self) -> &[u64] {
        &self.info.shape
    }

    /// Offset inside the arena.
    pub fn offset(&self) -> u64 {
        self.info.offset
    }

    /// XXH3-64 the server computed while loading.
    pub fn expected_xxh3(&self) -> u64 {
        self.info.xxh3
    }

    /// The tensor's bytes, read-only, straight from the shared arena. The model checked at
    /// attach that every tensor lies inside the mapping, so this cannot go out of bounds.
    pub fn bytes(&self) -> &[u8] {
        let all = self.mapping.as_slice();
        let start = usize::try_from(self.info.offset).unwrap_or(usize::MAX);
        let len = usize::try_from(self.info.byte_length).unwrap_or(usize::MAX);
        start
            .checked_add(len)
            .and_then(|end| all.get(start..end))
            .unwrap_or(&[])
    }

    /// Whether the bytes hash to the checksum in the manifest.
    pub fn verify(&self) -> bool {
        xxhash_rust::xxh3::xxh3_64(self.bytes()) == self.info.xxh3
    }
}
