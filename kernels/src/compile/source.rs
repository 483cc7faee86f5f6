//! The kernel sources: the `.cu` files this crate compiles, each as one [`KernelSource`].

/// One `.cu` file of this crate, compiled as a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSource {
    /// File name, for errors and NVRTC's log, e.g. `gemv.cu`.
    pub name: &'static str,
    /// The CUDA C source.
    pub code: &'static str,
}

/// `cuda/gemv.cu`: the gemv kernels, see [`crate::gemv`].
pub const GEMV_SOURCE: KernelSource = KernelSource {
    name: "gemv.cu",
    code: include_str!("../../cuda/gemv.cu"),
};

/// `cuda/encoder.cu`: the encoder's element-wise and row-wise kernels, see [`crate::encoder`].
pub const ENCODER_SOURCE: KernelSource = KernelSource {
    name: "encoder.cu",
    code: include_str!("../../cuda/encoder.cu"),
};

/// `device/cuda/checksum.cu` (defined with ms64 in `modelshare_device::checksum`): the ms64
/// kernel, see [`crate::checksum`].
pub const CHECKSUM_SOURCE: KernelSource = KernelSource {
    name: "checksum.cu",
    code: modelshare_device::checksum::CUDA_SOURCE,
};
