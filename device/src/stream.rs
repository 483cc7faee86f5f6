//! [`ForeignStream`]: a CUDA stream another library made and owns (torch's current stream, as
//! a DLPack consumer hands it over), that this crate only makes wait on an event.

use cudarc::driver::sys::CUstream;

/// A raw `CUstream` owned by someone else, or one of the driver's special handles
/// (`CU_STREAM_LEGACY` 1, `CU_STREAM_PER_THREAD` 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForeignStream(CUstream);

impl ForeignStream {
    /// The stream whose handle is `raw`.
    ///
    /// # Safety
    /// `raw` is a live stream of the CUDA context the waiting mapping lives in (the device's
    /// primary context, as torch's are), or 1 / 2, for as long as the value is used.
    pub unsafe fn from_raw(raw: usize) -> Self {
        Self(raw as CUstream)
    }

    /// The raw handle (for the CUDA backend's driver calls).
    pub(crate) fn handle(self) -> CUstream {
        self.0
    }
}
