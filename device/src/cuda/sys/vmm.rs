//! The `unsafe` VMM calls: physical allocations made with `cuMemCreate` and exported as POSIX
//! file descriptors (server side, [`DeviceMemory::alloc_vmm`] and
//! [`DeviceMemory::export_fd`]), and their import into another process, mapped **read-only**
//! ([`VmmImport`]).
//!
//! An allocation is rounded up to the device's allocation granularity (2 MiB on Hopper). It
//! lives while any process holds it — a handle, a mapping, or an exported descriptor the driver
//! has not yet closed — so a worker's mapping stays valid after the server exits.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr, CUmemGenericAllocationHandle};
use cudarc::driver::{CudaContext, DriverError};

use super::common::{bind, check, driver};
use crate::error::{DeviceError, Result};

/// The one handle type used: a POSIX file descriptor, passed by `SCM_RIGHTS`.
const FD_HANDLE: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// A physical allocation of `size` bytes and the handle that owns it (server side).
#[derive(Debug)]
pub(crate) struct VmmAlloc {
    handle: CUmemGenericAllocationHandle,
    size: usize,
}

fn prop(ordinal: usize) -> Result<sys::CUmemAllocationProp> {
    let id = i32::try_from(ordinal).map_err(|_| DeviceError::NoSuchDevice {
        device: ordinal.to_string(),
        reason: "ordinal out of range".into(),
    })?;
    // SAFETY: the struct is plain data for which all-zero bytes are valid (null pointer, zero
    // enums are "invalid"/"none" and are all set below where they matter).
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = FD_HANDLE;
    p.location = location(id);
    Ok(p)
}

fn location(id: i32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id,
    }
}

/// Whether the device supports VMM allocations exported as POSIX file descriptors.
pub fn fd_handles_supported(ctx: &CudaContext) -> Result<bool> {
    use sys::CUdevice_attribute as A;
    let get = |a| ctx.attribute(a).map_err(driver("cuDeviceGetAttribute"));
    Ok(
        get(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)? != 0
            && get(A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)? != 0,
    )
}

/// The device's minimum allocation granularity for such allocations.
pub fn granularity(ordinal: usize) -> Result<u64> {
    let p = prop(ordinal)?;
    let mut g: usize = 0;
    // SAFETY: `g` and `p` are valid for the call's duration.
    unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &p,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    }
    .result()
    .map_err(driver("cuMemGetAllocationGranularity"))?;
    Ok(g.max(1) as u64)
}

/// `len` rounded up to the granularity `g` (at least one granule).
pub fn rounded(len: u64, g: u64) -> Option<u64> {
    len.max(1).checked_next_multiple_of(g.max(1))
}

fn oom_or(op: &'static str, bytes: u64) -> impl Fn(DriverError) -> DeviceError {
    move |e| {
        if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
            DeviceError::AllocationFailed {
                bytes,
                reason: "out of device memory".into(),
            }
        } else {
            DeviceError::Cuda { op, source: e }
        }
    }
}

/// Reserves `size` bytes of address space and maps `handle` there with `access` for device
/// `id`. Undoes what it did on failure.
fn reserve_and_map(
    handle: CUmemGenericAllocationHandle,
    size: usize,
    id: i32,
    access: sys::CUmemAccess_flags,
) -> Result<CUdeviceptr> {
    let ptr = reserve(size)?;
    if let Err(e) = map_at(ptr, handle, size, id, access) {
        free_range(ptr, size);
        return Err(e);
    }
    Ok(ptr)
}

/// `size` bytes of address space, aligned to the granularity (the context must be bound).
fn reserve(size: usize) -> Result<CUdeviceptr> {
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: `ptr` is a valid out-parameter; alignment 0 = the granularity, no fixed address.
    unsafe { sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0) }
        .result()
        .map_err(driver("cuMemAddressReserve"))?;
    Ok(ptr)
}

/// Maps `handle` (a live allocation of `size` bytes) at the reserved, unmapped range
/// `ptr..ptr+size` with `access` for device `id`. Unmaps again on failure; the range stays
/// reserved.
fn map_at(
    ptr: CUdeviceptr,
    handle: CUmemGenericAllocationHandle,
    size: usize,
    id: i32,
    access: sys::CUmemAccess_flags,
) -> Result<()> {
    // SAFETY: `ptr..ptr+size` is reserved and unmapped (the caller's promise); `handle` is a
    // live allocation of `size` bytes.
    unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) }
        .result()
        .map_err(driver("cuMemMap"))?;
    let desc = sys::CUmemAccessDesc {
        location: location(id),
        flags: access,
    };
    // SAFETY: the range is mapped (above); `desc` is one valid descriptor.
    if let Err(e) = unsafe { sys::cuMemSetAccess(ptr, size, &desc, 1) }.result() {
        unmap_only(ptr, size);
        return Err(DeviceError::Cuda {
            op: "cuMemSetAccess",
            source: e,
        });
    }
    Ok(())
}

/// Grants device `id` `access` to the mapped range `ptr..ptr+size` (the range's own device
/// keeps its access: `cuMemSetAccess` sets the devices named only).
pub(super) fn grant(
    ptr: CUdeviceptr,
    size: usize,
    id: i32,
    access: sys::CUmemAccess_flags,
) -> Result<()> {
    let desc = sys::CUmemAccessDesc {
        location: location(id),
        flags: access,
    };
    // SAFETY: `ptr..ptr+size` is a range this module reserved and mapped, still mapped (the
    // caller owns the allocation); `desc` is one valid descriptor.
    unsafe { sys::cuMemSetAccess(ptr, size, &desc, 1) }
        .result()
        .map_err(driver("cuMemSetAccess (peer read for a replica copy)"))
}

/// Unmaps and frees the address range of a mapping made by [`reserve_and_map`].
fn unmap(ptr: CUdeviceptr, size: usize) {
    unmap_only(ptr, size);
    free_range(ptr, size);
}

/// Unmaps `ptr..ptr+size`, a range this module mapped; the reservation stays.
fn unmap_only(ptr: CUdeviceptr, size: usize) {
    // SAFETY: `ptr..ptr+size` is a range this module reserved and mapped; nothing in this
    // process uses it afterwards (its owner is being dropped).
    if let Err(e) = unsafe { sys::cuMemUnmap(ptr, size) }.result() {
        tracing::warn!(error = %e, "cuMemUnmap failed");
    }
}

/// Frees the reservation `ptr..ptr+size`, unmapped by now.
fn free_range(ptr: CUdeviceptr, size: usize) {
    // SAFETY: a reservation this module made, released once, with nothing mapped in it.
    if let Err(e) = unsafe { sys::cuMemAddressFree(ptr, size) }.result() {
        tracing::warn!(error = %e, "cuMemAddressFree failed");
    }
}

fn release(handle: CUmemGenericAllocationHandle) {
    // SAFETY: the handle came from cuMemCreate or cuMemImportFromShareableHandle and is
    // released once; the allocation itself lives on while mapped or held elsewhere.
    if let Err(e) = unsafe { sys::cuMemRelease(handle) }.result() {
        tracing::warn!(error = %e, "cuMemRelease failed");
    }
}

impl VmmAlloc {
    /// Allocates `len` bytes (rounded up to the granularity) with `cuMemCreate`, exportable as
    /// a file descriptor, mapped read-write in `ctx`: the allocation and its address.
    pub(super) fn create(ctx: &Arc<CudaContext>, len: u64) -> Result<(Self, CUdeviceptr)> {
        let ordinal = ctx.ordinal();
        let size = rounded(len, granularity(ordinal)?).ok_or(DeviceError::AllocationFailed {
            bytes: len,
            reason: "larger than the address space".into(),
        })?;
        let size = usize::try_from(size).map_err(|_| DeviceError::AllocationFailed {
            bytes: len,
            reason: "larger than the address space".into(),
        })?;
        bind(ctx)?;
        let p = prop(ordinal)?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid out-parameter, `p` a valid property struct.
        unsafe { sys::cuMemCreate(&mut handle, size, &p, 0) }
            .result()
            .map_err(oom_or("cuMemCreate", len))?;
        match reserve_and_map(
            handle,
            size,
            p.location.id,
            sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        ) {
            Ok(ptr) => Ok((VmmAlloc { handle, size }, ptr)),
            Err(e) => {
                release(handle);
                Err(e)
            }
        }
    }

    /// Another process's allocation of `size` bytes, imported from `fd` and mapped read-write
    /// in `ctx` (a restarted server taking over an arena a worker kept alive).
    pub(super) fn import(
        ctx: &Arc<CudaContext>,
        fd: BorrowedFd<'_>,
        size: u64,
    ) -> Result<(Self, CUdeviceptr)> {
        let size = checked_size(ctx.ordinal(), size)?;
        bind(ctx)?;
        let handle = import_handle(fd)?;
        match reserve_and_map(
            handle,
            size,
            i32::try_from(ctx.ordinal()).unwrap_or(0),
            sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        ) {
            Ok(ptr) => Ok((VmmAlloc { handle, size }, ptr)),
            Err(e) => {
                release(handle);
                Err(e)
            }
        }
    }

    /// The allocation's size.
    pub(super) fn size(&self) -> u64 {
        self.size as u64
    }

    /// A new file descriptor for the allocation (the context must be bound).
    pub(super) fn export_fd(&self) -> Result<OwnedFd> {
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: for the POSIX descriptor type the out-parameter is an `int`; the handle is
        // live (owned by `self`).
        unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast(),
                self.handle,
                FD_HANDLE,
                0,
            )
        }
        .result()
        .map_err(driver("cuMemExportToShareableHandle"))?;
        if fd < 0 {
            return Err(DeviceError::Protocol {
                reason: "cuMemExportToShareableHandle returned no descriptor".into(),
            });
        }
        // SAFETY: the driver returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Unmaps `ptr` (where this allocation is mapped), frees its address range and releases
    /// the handle (the context must be bound).
    pub(super) fn free(&self, ptr: CUdeviceptr) {
        unmap(ptr, self.size);
        release(self.handle);
    }
}

/// Address space reserved in this process, `size` bytes on one device, freed when dropped:
/// where an allocation not yet received will be mapped ([`VmmImport::open_in`]), so that its
/// address is known before the import. Each mapping in it holds it.
#[derive(Debug)]
pub struct AddressRange {
    ctx: Arc<CudaContext>,
    ptr: CUdeviceptr,
    size: usize,
}

// SAFETY: a device address range, plain numbers used with the context bound; the driver
// serialises access.
unsafe impl Send for AddressRange {}
// SAFETY: as above; no method mutates `self`.
unsafe impl Sync for AddressRange {}

impl AddressRange {
    /// Reserves room for an allocation of `size` bytes (a multiple of the granularity) in `ctx`.
    pub fn reserve(ctx: &Arc<CudaContext>, size: u64) -> Result<Self> {
        let size = checked_size(ctx.ordinal(), size)?;
        bind(ctx)?;
        let ptr = reserve(size)?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr,
            size,
        })
    }

    /// The range's first address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The context (and so the device) it is reserved in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl Drop for AddressRange {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            free_range(self.ptr, self.size);
        }
    }
}

/// Another process's VMM allocation, imported from its file descriptor and mapped read-only
/// in an [`AddressRange`] on one device; unmapped and released on drop (the range is freed when
/// its last holder goes).
#[derive(Debug)]
pub struct VmmImport {
    handle: CUmemGenericAllocationHandle,
    range: Arc<AddressRange>,
}

// SAFETY: an allocation handle, a plain number used with the context bound (every method
// binds it); the driver serialises access.
unsafe impl Send for VmmImport {}
// SAFETY: as above; no method mutates `self`.
unsafe impl Sync for VmmImport {}

/// `size` as a mapping size: positive, a multiple of the device's granularity.
fn checked_size(ordinal: usize, size: u64) -> Result<usize> {
    let g = granularity(ordinal)?;
    if size == 0 || !size.is_multiple_of(g) {
        return Err(DeviceError::BadHandle {
            reason: format!(
                "allocation size {size} is not a positive multiple of the device's granularity {g}"
            ),
        });
    }
    usize::try_from(size).map_err(|_| DeviceError::BadHandle {
        reason: format!("allocation size {size} is larger than the address space"),
    })
}

/// The allocation handle of a received descriptor (the context must be bound).
fn import_handle(fd: BorrowedFd<'_>) -> Result<CUmemGenericAllocationHandle> {
    let mut handle: CUmemGenericAllocationHandle = 0;
    // SAFETY: for the POSIX descriptor type the OS handle is the descriptor's value passed as a
    // pointer-sized integer; the driver does not take ownership of it; `handle` is a valid
    // out-parameter.
    unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut handle,
            fd.as_raw_fd() as isize as *mut std::ffi::c_void,
            FD_HANDLE,
        )
    }
    .result()
    .map_err(driver("cuMemImportFromShareableHandle"))?;
    Ok(handle)
}

impl VmmImport {
    /// Imports the allocation `fd` names (`size` bytes, as the exporter said) and maps it
    /// read-only in `ctx`, at a range of its own. The descriptor stays the caller's.
    pub fn open(ctx: &Arc<CudaContext>, fd: BorrowedFd<'_>, size: u64) -> Result<Self> {
        Self::open_in(Arc::new(AddressRange::reserve(ctx, size)?), fd, size)
    }

    /// As [`VmmImport::open`], mapped at `range` (reserved for `size` bytes, nothing mapped
    /// in it yet).
    pub fn open_in(range: Arc<AddressRange>, fd: BorrowedFd<'_>, size: u64) -> Result<Self> {
        let ctx = range.ctx.clone();
        let ordinal = ctx.ordinal();
        let size = checked_size(ordinal, size)?;
        if size != range.size {
            return Err(DeviceError::BadHandle {
                reason: format!(
                    "the allocation ({size} bytes) is not the {} bytes reserved for it",
                    range.size
                ),
            });
        }
        bind(&ctx)?;
        let handle = import_handle(fd)?;
        let id = i32::try_from(ordinal).unwrap_or(0);
        let read = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ;
        if let Err(e) = map_at(range.ptr, handle, size, id, read) {
            release(handle);
            return Err(e);
        }
        Ok(Self { handle, range })
    }

    /// The address in this process.
    pub fn ptr(&self) -> CUdeviceptr {
        self.range.ptr
    }

    /// The allocation's size.
    pub fn size(&self) -> u64 {
        self.range.size as u64
    }

    /// Synchronous copy from `offset` into `dst`; `total` is the arena's length (at most the
    /// allocation's size).
    pub fn read(&self, offset: u64, dst: &mut [u8], total: u64) -> Result<()> {
        check("read", offset, dst.len(), total.min(self.size()))?;
        bind(&self.range.ctx)?;
        // SAFETY: the range lies inside the mapped allocation (checked above); reading is
        // allowed by the mapping's access flags.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(dst, self.ptr() + offset) }
            .map_err(driver("cuMemcpyDtoH"))
    }
}

impl Drop for VmmImport {
    fn drop(&mut self) {
        if bind(&self.range.ctx).is_err() {
            return;
        }
        unmap_only(self.range.ptr, self.range.size);
        release(self.handle);
    }
}

#[cfg(test)]
mod tests {
    use super::rounded;

    /// Sizes no longer round up to whole granules (or an empty arena gets no allocation).
    #[test]
    fn sizes_round_up_to_whole_granules() {
        let g = 2 << 20;
        assert_eq!(rounded(0, g), Some(g));
        assert_eq!(rounded(1, g), Some(g));
        assert_eq!(rounded(g, g), Some(g));
        assert_eq!(rounded(g + 1, g), Some(2 * g));
        assert_eq!(rounded(u64::MAX - 3, g), None);
    }
}
