//! Read-only views of tensors inside a mapped arena, as bytes or typed slices.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DeviceSlice, SyncOnDrop};
use modelshare_device::{DeviceError, Mapping};
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
    view: Mapping,
}

impl Tensor {
    /// The tensor `info` describes, inside the arena `view` maps (the attach checked that it
    /// lies within).
    pub(crate) fn new(info: pb::TensorInfo, view: Mapping) -> Self {
        Self { info, view }
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

    /// Length in bytes.
    pub fn byte_length(&self) -> u64 {
        self.info.byte_length
    }

    /// Offset inside the arena.
    pub fn offset(&self) -> u64 {
        self.info.offset
    }

    /// ms64 the server computed on the device after a CUDA load (0 on the host backend, and
    /// for a model attached while loading). See `modelshare_kernels::checksum`.
    pub fn expected_ms64(&self) -> u64 {
        self.info.ms64
    }

    /// XXH3-64 the server computed while loading.
    pub fn expected_xxh3(&self) -> u64 {
        self.info.xxh3
    }

    /// The tensor's bytes, read-only, straight from the shared arena, for arenas in host
    /// memory; empty for arenas in device memory (use [`Tensor::device_ptr`] or
    /// [`Tensor::to_host`]). The attach checked that every tensor lies inside the mapping.
    pub fn bytes(&self) -> &[u8] {
        self.view
            .host_range(self.info.offset, self.info.byte_length)
            .unwrap_or(&[])
    }

    /// The elements as `&[T]`, without copying (host backend). Fails if `T` is not the
    /// tensor's dtype, or if the tensor is in device memory.
    ///
    /// ```no_run
    /// # fn f(t: &modelshare_worker::Tensor) -> Result<(), modelshare_worker::WorkerError> {
    /// let w: &[half::bf16] = t.as_slice()?;
    /// let sum: f32 = w.iter().map(|x| x.to_f32()).sum();
    /// # Ok(()) }
    /// ```
    pub fn as_slice<T: Element>(&self) -> Result<&[T], WorkerError> {
        self.check_dtype::<T>()?;
        bytemuck::try_cast_slice(self.bytes())
            .map_err(|e| WorkerError::Protocol(format!("tensor '{}': {e}", self.info.name)))
    }

    fn check_dtype<T: Element>(&self) -> Result<(), WorkerError> {
        if self.dtype() == T::DTYPE {
            return Ok(());
        }
        let name = |d: pb::DType| d.as_str_name().trim_start_matches("DTYPE_").to_owned();
        Err(WorkerError::WrongDtype {
            tensor: self.info.name.clone(),
            actual: name(self.dtype()),
            requested: name(T::DTYPE),
        })
    }

    /// Whether the tensor lives in device memory.
    pub fn is_on_device(&self) -> bool {
        self.view.is_on_device()
    }

    /// The tensor's device address in this process (CUDA backend), valid while the tensor (or
    /// its model) lives. Enqueue [`crate::Model::wait_ready`] on your stream before the first
    /// kernel that reads it.
    pub fn device_ptr(&self) -> Option<u64> {
        self.view.device_ptr().map(|base| base + self.info.offset)
    }

    /// A typed view of the tensor in device memory (CUDA backend), usable wherever cudarc
    /// takes a `DevicePtr<T>` (kernel arguments, `stream.clone_dtoh(&view)`, ...). Enqueues on
    /// `stream` a wait for the version's ready event, so nothing enqueued after it can read the
    /// tensor before the load has landed. Fails if `T` is not the tensor's dtype or the tensor
    /// is in host memory.
    ///
    /// ```no_run
    /// # fn f(t: &modelshare_worker::Tensor, stream: &std::sync::Arc<cudarc::driver::CudaStream>)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// let w = t.device_view::<half::bf16>(stream)?;
    /// let host: Vec<half::bf16> = stream.clone_dtoh(&w)?;
    /// # Ok(()) }
    /// ```
    pub fn device_view<T: Element>(
        &self,
        stream: &Arc<CudaStream>,
    ) -> Result<DeviceView<T>, WorkerError> {
        self.check_dtype::<T>()?;
        let Some(ptr) = self.device_ptr() else {
            return Err(WorkerError::Protocol(format!(
                "tensor '{}' is in host memory: use as_slice()",
                self.info.name
            )));
        };
        self.view.wait_ready(stream).map_err(device_error)?;
        let len = usize::try_from(self.len()).map_err(|_| self.too_large())?;
        Ok(DeviceView {
            ptr,
            len,
            stream: stream.clone(),
            mapping: self.view.clone(),
            _elem: PhantomData,
        })
    }

    /// A copy of the bytes in host memory (on CUDA: after the ready event).
    pub fn to_host(&self) -> Result<Vec<u8>, WorkerError> {
        let len = usize::try_from(self.info.byte_length).map_err(|_| self.too_large())?;
        let mut buf = vec![0u8; len];
        self.view
            .read(self.info.offset, &mut buf)
            .map_err(device_error)?;
        Ok(buf)
    }

    /// Whether the bytes hash to the checksum in the manifest: its XXH3 when the server
    /// hashed on the CPU (host memory), else its ms64 (a CUDA load checksums on the device).
    /// Bytes mapped into this process are hashed in place; others (device memory) are copied
    /// to the host first. False when the manifest has neither (a version still loading).
    pub fn verify(&self) -> bool {
        let (xxh3, ms64) = (self.info.xxh3, self.info.ms64);
        if self.info.byte_length == 0 {
            return true;
        }
        if xxh3 == 0 && ms64 == 0 {
            return false;
        }
        let digest = |bytes: &[u8]| {
            if xxh3 != 0 {
                xxhash_rust::xxh3::xxh3_64(bytes) == xxh3
            } else {
                modelshare_device::checksum::ms64(bytes) == ms64
            }
        };
        match self
            .view
            .host_range(self.info.offset, self.info.byte_length)
        {
            Some(bytes) => digest(bytes),
            None => self.to_host().is_ok_and(|bytes| digest(&bytes)),
        }
    }

    fn too_large(&self) -> WorkerError {
        WorkerError::Protocol(format!("tensor '{}' is too large", self.info.name))
    }
}

/// A device error about a tensor's arena (the tensor does not know its model's name).
fn device_error(source: DeviceError) -> WorkerError {
    WorkerError::Device {
        model: String::new(),
        version: 0,
        source,
    }
}

/// A tensor in device memory, typed, read-only, bound to a stream: it implements cudarc's
/// `DeviceSlice<T>` and `DevicePtr<T>`. It keeps the arena mapped while it lives.
#[derive(Debug, Clone)]
pub struct DeviceView<T> {
    ptr: u64,
    len: usize,
    stream: Arc<CudaStream>,
    mapping: Mapping,
    _elem: PhantomData<T>,
}

impl<T> DeviceView<T> {
    /// The device address in this process.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl<T> DeviceSlice<T> for DeviceView<T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for DeviceView<T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        // The tensor is never written after the load, so the only ordering needed is after the
        // load itself: already enqueued on the view's own stream; on another stream, enqueue it.
        if stream.cu_stream() != self.stream.cu_stream()
            && let Err(e) = self.mapping.wait_ready(stream)
        {
            tracing::warn!(error = %e, "cannot order a read after the ready event");
        }
        (self.ptr, SyncOnDrop::Record(None))
    }
}

#[cfg(test)]
mod tests {
    use modelshare_device::{Arena, HostArena, Import};

    use super::*;

    /// A host mapping of `bytes`, as a worker gets one (sealed memfd, imported read-only).
    fn mapping_of(bytes: &[u8]) -> Mapping {
        let arena = HostArena::new(bytes.len() as u64, "test").expect("arena");
        arena.write_at(0, bytes).expect("write");
        arena.seal().expect("seal");
        let export = arena.export().expect("export");
        Mapping::import(Import {
            device_uuid: "host".into(),
            handles: export.handles,
            fd: export.fd,
            len: bytes.len() as u64,
            alloc_len: 0,
        })
        .expect("import")
    }

    fn info(len: usize, xxh3: u64, ms64: u64) -> pb::TensorInfo {
        pb::TensorInfo {
            name: "t".into(),
            byte_length: len as u64,
            xxh3,
            ms64,
            ..Default::default()
        }
    }

    /// A CUDA load checksums on the device only (no XXH3): verify() checks the ms64 then, and
    /// still catches a changed byte; with neither checksum it does not claim the bytes are good.
    #[test]
    fn verify_uses_ms64_when_the_manifest_has_no_xxh3() {
        let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        let ms64 = modelshare_device::checksum::ms64(&bytes);
        let good = mapping_of(&bytes);
        assert!(Tensor::new(info(bytes.len(), 0, ms64), good.clone()).verify());
        let mut changed = bytes.clone();
        changed[1234] ^= 1;
        let bad = mapping_of(&changed);
        assert!(!Tensor::new(info(bytes.len(), 0, ms64), bad.clone()).verify());
        let xxh3 = xxhash_rust::xxh3::xxh3_64(&bytes);
        assert!(Tensor::new(info(bytes.len(), xxh3, 0), good.clone()).verify());
        assert!(!Tensor::new(info(bytes.len(), xxh3, 0), bad).verify());
        assert!(
            !Tensor::new(info(bytes.len(), 0, 0), good).verify(),
            "no checksum"
        );
    }
}
