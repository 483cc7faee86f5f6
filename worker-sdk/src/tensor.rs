//! Read-only views of tensors inside a mapped arena, as bytes or typed slices.

use std::sync::Arc;

use modelshare_device::HostMapping;
use modelshare_proto::v1 as pb;

use crate::WorkerError;

/// A Rust type that a tensor's elements can be read as.
pub trait Element: bytemuck::Pod + sealed::Sealed {
    /// The dtype whose bytes are this type.
    const DTYPE: pb::DType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: pb::DType = pb::DType::$d;
        }
    )*};
}

element! {
    u8 => DtypeU8, i8 => DtypeI8, i16 => DtypeI16, u16 => DtypeU16, i32 => DtypeI32,
    u32 => DtypeU32, i64 => DtypeI64, u64 => DtypeU64, f32 => DtypeF32, f64 => DtypeF64,
    half::f16 => DtypeF16, half::bf16 => DtypeBf16,
}

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

    /// Number of elements.
    pub fn len(&self) -> u64 {
        self.info.shape.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Offset inside the arena.
    pub fn offset(&self) -> u64 {
        self.info.offset
    }

    /// XXH3-64 the server computed while loading.
    pub fn expected_xxh3(&self) -> u64 {
        self.info.xxh3
    }

    /// The tensor's bytes, read-only, straight from the shared arena. The attach checked that
    /// every tensor lies inside the mapping.
    pub fn bytes(&self) -> &[u8] {
        let all = self.mapping.as_slice();
        let start = usize::try_from(self.info.offset).unwrap_or(usize::MAX);
        let len = usize::try_from(self.info.byte_length).unwrap_or(usize::MAX);
        start
            .checked_add(len)
            .and_then(|end| all.get(start..end))
            .unwrap_or(&[])
    }

    /// The elements as `&[T]`, without copying. Fails if `T` is not the tensor's dtype.
    ///
    /// ```no_run
    /// # fn f(t: &modelshare_worker::Tensor) -> Result<(), modelshare_worker::WorkerError> {
    /// let w: &[half::bf16] = t.as_slice()?;
    /// let sum: f32 = w.iter().map(|x| x.to_f32()).sum();
    /// # Ok(()) }
    /// ```
    pub fn as_slice<T: Element>(&self) -> Result<&[T], WorkerError> {
        if self.dtype() != T::DTYPE {
            return Err(WorkerError::WrongDtype {
                tensor: self.info.name.clone(),
                actual: self
                    .dtype()
                    .as_str_name()
                    .trim_start_matches("DTYPE_")
                    .to_owned(),
                requested: T::DTYPE
                    .as_str_name()
                    .trim_start_matches("DTYPE_")
                    .to_owned(),
            });
        }
        bytemuck::try_cast_slice(self.bytes())
            .map_err(|e| WorkerError::Protocol(format!("tensor '{}': {e}", self.info.name)))
    }

    /// Whether the bytes hash to the checksum in the manifest.
    pub fn verify(&self) -> bool {
        xxhash_rust::xxh3::xxh3_64(self.bytes()) == self.info.xxh3
    }
}
