//! The attach reply's arena handle, turned into a [`Mapping`]: the one place in the SDK that
//! knows handle kinds.
//!
//! Each arm of the protocol's `oneof attach_response::Handle` becomes a backend-neutral
//! [`Import`] (host: the ticket redeemed on the handle socket for a descriptor, no handle
//! bytes; CUDA IPC: the memory and event handles, no descriptor; CUDA VMM: the ticket redeemed
//! for the allocation's descriptor, and the event handle), which
//! [`Mapping::import`] maps on a blocking thread.

use modelshare_device::{BackendKind, DeviceError, Handles, Import, Mapping, Reservation, handoff};
use modelshare_proto::v1 as pb;
use pb::attach_response::Handle;

use crate::WorkerError;

/// Maps the arena that `handle` names, for the version `manifest` describes: at `reserved` when
/// address space was set aside for it ([`reserve`]).
pub(crate) async fn map(
    handle: Option<Handle>,
    manifest: &pb::Manifest,
    reserved: Option<Reservation>,
) -> Result<Mapping, WorkerError> {
    let device_err = |source: DeviceError| WorkerError::Device {
        model: manifest.model.clone(),
        version: manifest.version,
        source,
    };
    let len = manifest.arena_bytes;
    let started = std::time::Instant::now();
    let import = match handle {
        Some(Handle::Host(h)) => {
            let fd = handoff::redeem(std::path::Path::new(&h.handle_socket), &h.ticket)
                .await
                .map_err(device_err)?;
            Import {
                device_uuid: "host".to_owned(),
                handles: Handles::Host,
                fd: Some(fd),
                len,
                alloc_len: 0,
            }
        }
        Some(Handle::CudaIpc(h)) => Import {
            device_uuid: h.device_uuid,
            handles: Handles::CudaIpc {
                memory: h.mem_handle,
                event: h.event_handle,
            },
            fd: None,
            len,
            alloc_len: 0,
        },
        Some(Handle::CudaVmm(h)) => {
            let fd = handoff::redeem(std::path::Path::new(&h.handle_socket), &h.ticket)
                .await
                .map_err(device_err)?;
            Import {
                device_uuid: h.device_uuid,
                handles: Handles::CudaVmm {
                    event: h.event_handle,
                },
                fd: Some(fd),
                len,
                alloc_len: h.allocation_bytes,
            }
        }
        None => {
            return Err(WorkerError::Protocol(
                "attach reply without an arena handle".into(),
            ));
        }
    };
    let redeemed = started.elapsed();
    // Mapping blocks (a CUDA import may create the device's context the first time).
    let mapping = tokio::task::spawn_blocking(move || {
        let t = std::time::Instant::now();
        (Mapping::import_reserved(import, reserved), t.elapsed())
    })
    .await
    .map_err(|e| WorkerError::Protocol(format!("arena import task failed: {e}")))?;
    tracing::trace!(
        redeem_us = redeemed.as_micros() as u64,
        import_us = mapping.1.as_micros() as u64,
        mapped_us = started.elapsed().as_micros() as u64,
        "attach: mapped"
    );
    mapping.0.map_err(device_err)
}

/// Address space for the arena `handle` names, reserved before the handle is redeemed, where
/// its kind allows (CUDA VMM): `None` otherwise, or when the reservation failed (the import
/// then maps wherever the driver puts it, and reports any real error itself).
pub(crate) async fn reserve(handle: Option<&Handle>) -> Option<Reservation> {
    let Some(Handle::CudaVmm(h)) = handle else {
        return None;
    };
    let (uuid, bytes) = (h.device_uuid.clone(), h.allocation_bytes);
    // A driver call (the first one may make the device's context): off the runtime's threads.
    let reserved =
        tokio::task::spawn_blocking(move || Mapping::reserve(BackendKind::CudaVmm, &uuid, bytes))
            .await;
    match reserved {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "attach: no address space reserved before the import");
            None
        }
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use modelshare_device::{Arena, HostArena};
    use tokio::net::UnixListener;

    use super::*;

    fn manifest(arena_bytes: u64) -> pb::Manifest {
        pb::Manifest {
            model: "tiny".into(),
            version: 3,
            arena_bytes,
            ..Default::default()
        }
    }

    /// A host handle no longer becomes a read-only mapping of the arena's bytes (the ticket is
    /// not redeemed on the handle socket, or the descriptor is not mapped).
    #[tokio::test]
    async fn host_handle_redeems_the_ticket_and_maps_read_only() {
        let bytes: Vec<u8> = (0..4099u32).map(|i| (i * 7 + 1) as u8).collect();
        let arena = HostArena::new(bytes.len() as u64, "tiny@3").unwrap();
        arena.write_at(0, &bytes).unwrap();
        arena.seal().unwrap();
        let fd = arena
            .export()
            .unwrap()
            .fd
            .expect("a host export carries a descriptor");

        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("handles.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let ticket = handoff::read_ticket(&mut stream).await.unwrap();
            handoff::send_fd(&stream, std::os::fd::AsFd::as_fd(&fd))
                .await
                .unwrap();
            ticket
        });

        let handle = Handle::Host(pb::HostArenaHandle {
            ticket: "t-123".into(),
            handle_socket: socket.display().to_string(),
            ticket_ttl_ms: 1000,
        });
        let mapping = map(Some(handle), &manifest(bytes.len() as u64), None)
            .await
            .unwrap();
        assert_eq!(server.await.unwrap(), "t-123");
        assert_eq!(mapping.kind(), modelshare_device::BackendKind::Host);
        assert!(mapping.read_only());
        assert_eq!(mapping.len(), bytes.len() as u64);
        assert_eq!(mapping.host_bytes(), Some(&bytes[..]));
        assert_eq!(mapping.device_ptr(), None);
    }

    /// A reply without a handle is no longer refused as a protocol error.
    #[tokio::test]
    async fn missing_handle_is_a_protocol_error() {
        let err = map(None, &manifest(16), None).await.unwrap_err();
        assert!(matches!(err, WorkerError::Protocol(_)), "{err}");
    }

    /// A malformed CUDA IPC handle is no longer refused before the driver is touched, or the
    /// error no longer names the model and version.
    #[tokio::test]
    async fn short_cuda_handle_is_a_device_error_naming_the_model() {
        let handle = Handle::CudaIpc(pb::CudaIpcArenaHandle {
            mem_handle: vec![0; 10],
            event_handle: vec![0; 64],
            device_uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
        });
        let err = map(Some(handle), &manifest(16), None).await.unwrap_err();
        match err {
            WorkerError::Device {
                model,
                version,
                source: DeviceError::BadHandle { .. },
            } => assert_eq!((model.as_str(), version), ("tiny", 3)),
            other => panic!("expected a bad-handle device error, got {other}"),
        }
    }
}
