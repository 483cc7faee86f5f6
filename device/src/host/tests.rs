//! Tests of the host backend: arenas, mappings, seals, replica copies.

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::io::Errno;

use super::memfd::{MEMFD_NAME_MAX, memfd_name};
use super::{HostArena, HostBackend, HostMapping};
use crate::backend::BackendKind;
use crate::error::DeviceError;
use crate::test_util::random_bytes;
use crate::thread::{Arena, Backend};

fn exported_fd(arena: &dyn Arena) -> OwnedFd {
    let export = arena.export().unwrap();
    assert_eq!(export.kind(), BackendKind::Host);
    export.fd.expect("a host export carries a descriptor")
}

/// A descriptor of an unsealed memory file is no longer refused for adoption (its bytes
/// could change under the server), or one of the wrong size is accepted.
#[test]
fn adoption_takes_only_sealed_files_of_the_right_size() {
    let arena = HostArena::new(4096, "adopt").unwrap();
    let unsealed = arena.dup().unwrap();
    assert!(matches!(
        HostArena::adopt(unsealed, 4096),
        Err(DeviceError::BadHandle { .. })
    ));
    arena.seal().unwrap();
    assert!(matches!(
        HostArena::adopt(arena.dup().unwrap(), 8192),
        Err(DeviceError::BadHandle { .. })
    ));
    let adopted = HostArena::adopt(arena.dup().unwrap(), 4096).unwrap();
    assert!(adopted.is_sealed());
    assert!(adopted.export().unwrap().fd.is_some());
}

/// Several MiB written from several threads, sealed, exported and mapped come back intact.
#[test]
fn write_seal_export_map_round_trips() {
    let mut backend: Box<dyn Backend> = Box::new(HostBackend::new());
    let data = random_bytes(5 * 1024 * 1024 + 123, 7);
    let arena = backend.allocate(data.len() as u64, "round-trip@1").unwrap();
    assert_eq!(arena.len(), data.len() as u64);
    let chunk = 1024 * 1024 + 17;
    std::thread::scope(|s| {
        for (i, part) in data.chunks(chunk).enumerate() {
            let arena = &arena;
            s.spawn(move || arena.write_at((i * chunk) as u64, part).unwrap());
        }
    });
    arena.seal().unwrap();
    let mut back = vec![0; data.len()];
    arena.read_at(0, &mut back).unwrap();
    assert!(back == data, "read_at differs from what was written");
    let mapping = HostMapping::map(exported_fd(&*arena), data.len() as u64).unwrap();
    assert_eq!(mapping.len(), data.len() as u64);
    assert!(
        mapping.as_slice() == data,
        "mapping differs from what was written"
    );
}

/// A new arena reads as zeros where nothing was written.
#[test]
fn new_arena_is_zero_filled() {
    let arena = HostArena::new(10_000, "zeros").unwrap();
    arena.write_at(100, &[1, 2, 3]).unwrap();
    let mut buf = vec![0xff; 10_000];
    arena.read_at(0, &mut buf).unwrap();
    assert!(buf[..100].iter().all(|&b| b == 0));
    assert_eq!(&buf[100..103], &[1, 2, 3]);
    assert!(buf[103..].iter().all(|&b| b == 0));
}

/// Writes after seal are refused, and sealing twice is harmless.
#[test]
fn write_after_seal_is_refused() {
    let arena = HostArena::new(4096, "sealed").unwrap();
    arena.write_at(0, b"before").unwrap();
    arena.seal().unwrap();
    arena.seal().unwrap();
    assert!(arena.is_sealed());
    assert!(matches!(
        arena.write_at(0, b"after"),
        Err(DeviceError::Sealed)
    ));
    let mut buf = [0; 6];
    arena.read_at(0, &mut buf).unwrap();
    assert_eq!(&buf, b"before");
}

/// Reads and writes past the end (or whose end overflows u64) are refused with the numbers.
#[test]
fn out_of_range_access_is_refused() {
    let arena = HostArena::new(2048, "range").unwrap();
    let err = arena.write_at(100, &[0; 4096]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "write of 4096 bytes at offset 100 runs past the arena's 2048 bytes"
    );
    assert!(matches!(
        arena.write_at(u64::MAX, &[1]),
        Err(DeviceError::OutOfRange { .. })
    ));
    assert!(matches!(
        arena.write_at(2049, &[]),
        Err(DeviceError::OutOfRange { .. })
    ));
    arena.write_at(2048, &[]).unwrap();
    arena.write_at(2047, &[9]).unwrap();
    let mut buf = [0; 2];
    assert!(matches!(
        arena.read_at(2047, &mut buf),
        Err(DeviceError::OutOfRange { op: "read", .. })
    ));
}

/// A zero-length arena allocates, seals, exports and maps to an empty slice.
#[test]
fn zero_length_arena_works_end_to_end() {
    let arena = HostBackend::new().allocate(0, "empty").unwrap();
    assert!(arena.is_empty());
    arena.write_at(0, &[]).unwrap();
    arena.read_at(0, &mut []).unwrap();
    arena.seal().unwrap();
    let mapping = HostMapping::map(exported_fd(&*arena), 0).unwrap();
    assert!(mapping.is_empty());
    assert_eq!(mapping.as_slice(), &[] as &[u8]);
}

/// Exporting a still-writable arena is refused, so no worker gets a writable descriptor.
#[test]
fn export_before_seal_is_refused() {
    let arena = HostArena::new(64, "unsealed").unwrap();
    assert!(matches!(arena.export(), Err(DeviceError::NotSealed)));
}

/// Mapping a descriptor whose bytes could change or whose size is wrong is refused.
#[test]
fn map_refuses_unsealed_or_wrong_size() {
    let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    // Sealable but no seals yet.
    let fd = rustix::fs::memfd_create("unsealed", flags).unwrap();
    rustix::fs::ftruncate(&fd, 4096).unwrap();
    let err = HostMapping::map(fd, 4096).unwrap_err();
    assert!(
        matches!(&err, DeviceError::BadHandle { reason } if reason.contains("seal")),
        "{err}"
    );
    // Size sealed, writes not.
    let fd = rustix::fs::memfd_create("half-sealed", flags).unwrap();
    rustix::fs::ftruncate(&fd, 4096).unwrap();
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    assert!(matches!(
        HostMapping::map(fd, 4096),
        Err(DeviceError::BadHandle { .. })
    ));
    // Not sealable at all.
    let fd = rustix::fs::memfd_create("no-sealing", MemfdFlags::CLOEXEC).unwrap();
    assert!(matches!(
        HostMapping::map(fd, 0),
        Err(DeviceError::BadHandle { .. })
    ));
    // Not a memory file.
    let (pipe, _w) = std::io::pipe().unwrap();
    assert!(matches!(
        HostMapping::map(pipe.into(), 0),
        Err(DeviceError::BadHandle { .. })
    ));
    // Fully sealed, wrong size.
    let arena = HostArena::new(4096, "size").unwrap();
    arena.seal().unwrap();
    let err = HostMapping::map(exported_fd(&arena), 8192).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad memory handle: the memory file has 4096 bytes, expected 8192"
    );
}

/// After seal, the exported descriptor can neither write, resize nor map writable.
#[test]
fn exported_fd_cannot_modify_after_seal() {
    let arena = HostArena::new(4096, "readonly").unwrap();
    arena.write_at(0, &[7; 4096]).unwrap();
    arena.seal().unwrap();
    let fd = exported_fd(&arena);
    assert_eq!(rustix::io::pwrite(&fd, b"x", 0), Err(Errno::PERM));
    assert_eq!(rustix::fs::ftruncate(&fd, 0), Err(Errno::PERM));
    assert_eq!(rustix::fs::ftruncate(&fd, 8192), Err(Errno::PERM));
    assert_eq!(
        rustix::fs::fcntl_add_seals(&fd, SealFlags::FUTURE_WRITE),
        Err(Errno::PERM)
    );
    let mut buf = [0; 1];
    arena.read_at(0, &mut buf).unwrap();
    assert_eq!(buf, [7]);
}

/// A worker's mapping stays readable after the server drops the arena and the descriptor.
#[test]
fn mapping_outlives_arena() {
    let data = random_bytes(3 * 4096 + 5, 11);
    let arena = HostArena::new(data.len() as u64, "outlive").unwrap();
    arena.write_at(0, &data).unwrap();
    arena.seal().unwrap();
    let fd = exported_fd(&arena);
    drop(arena);
    let mapping = HostMapping::map(fd, data.len() as u64).unwrap();
    let mapping = std::thread::spawn(move || mapping).join().unwrap();
    assert!(mapping.as_slice() == data);
}

/// An impossible size is a resource error the server can answer RESOURCE_EXHAUSTED with.
#[test]
fn impossible_size_is_allocation_failed() {
    let err = HostArena::new(u64::MAX, "huge").unwrap_err();
    assert!(
        matches!(
            err,
            DeviceError::AllocationFailed {
                bytes: u64::MAX,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_resource_exhausted());
    assert!(!DeviceError::Sealed.is_resource_exhausted());
}

/// The memfd's name carries the label, within the kernel's limit, whatever the label.
#[test]
fn memfd_names_are_bounded() {
    assert_eq!(memfd_name("llama-7b@3"), "modelshare:llama-7b@3");
    let long = "é".repeat(300);
    let name = memfd_name(&long);
    assert!(name.len() <= MEMFD_NAME_MAX && name.len() >= MEMFD_NAME_MAX - 1);
    assert_eq!(memfd_name("a\0b"), "modelshare:a_b");
    let arena = HostArena::new(1, &format!("{long}\0")).unwrap();
    assert!(arena.fd.as_fd().try_clone_to_owned().is_ok());
}

/// The host backend describes itself as host memory with the machine's total.
#[test]
fn host_info() {
    let mut backend = HostBackend::new();
    let info = backend.info();
    assert_eq!(info.backend, BackendKind::Host);
    assert_eq!(info.uuid, "host");
    assert_eq!(info.name, "host memory");
    assert!(info.total_bytes > 0, "MemTotal not read from /proc/meminfo");
    assert_eq!(backend.used_bytes(), None);
}

/// Mappings and arenas can be shared between threads.
#[test]
fn types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<HostMapping>();
    check::<HostArena>();
    check::<HostBackend>();
    check::<Box<dyn Arena>>();
}

/// A replica copy between two host "devices" moves every byte, only out of a sealed
/// arena, only into an unsealed one of the same length.
#[test]
fn replica_copies_between_devices() {
    let a = HostBackend::thread_named("host").unwrap();
    let b = HostBackend::thread_named("host-1").unwrap();
    assert_eq!(b.uuid(), "host-1");
    let data = random_bytes(9 * 1024 * 1024 + 77, 11);
    let src = a.allocate(data.len() as u64, "m@1").wait().unwrap();
    src.write_at(0, data.clone()).wait().unwrap();
    // Not sealed yet: no source.
    assert!(matches!(
        src.peer_source(None).wait(),
        Err(DeviceError::NotSealed)
    ));
    src.seal().wait().unwrap();
    let dst = b.allocate(data.len() as u64, "m@1").wait().unwrap();
    dst.copy_from(src.peer_source(None).wait().unwrap())
        .wait()
        .unwrap();
    dst.seal().wait().unwrap();
    assert_eq!(dst.read_at(0, data.len()).wait().unwrap(), data);
    assert_eq!(dst.export().wait().unwrap().device_uuid, "host-1");
    // Into a sealed arena, or of another length: refused.
    assert!(matches!(
        dst.copy_from(src.peer_source(None).wait().unwrap()).wait(),
        Err(DeviceError::Sealed)
    ));
    let short = b.allocate(100, "short").wait().unwrap();
    assert!(matches!(
        short
            .copy_from(src.peer_source(None).wait().unwrap())
            .wait(),
        Err(DeviceError::Protocol { .. })
    ));
}
