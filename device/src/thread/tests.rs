//! Tests of the device thread: round trips, device objects kept on their thread, order of
//! replies, fixed exports, a stopped thread.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::*;
use crate::HostBackend;
use crate::backend::DeviceInfo;
use crate::error::{DeviceError, Result};
use crate::export::Export;
use crate::test_util::random_bytes;

/// Host arenas go through the same seam: allocate, write through writers from several
/// threads, seal, export, read back — all on the device thread.
#[test]
fn a_host_arena_round_trips_through_the_thread() {
    let device = HostBackend::thread().unwrap();
    assert_eq!(device.uuid(), "host");
    let data = random_bytes(3 * 1024 * 1024 + 5, 3);
    let arena = device.allocate(data.len() as u64, "t@1").wait().unwrap();
    let chunk = 1024 * 1024;
    std::thread::scope(|s| {
        for (i, part) in data.chunks(chunk).enumerate() {
            let arena = arena.clone();
            s.spawn(move || {
                let mut w = arena.writer().wait().unwrap();
                let buf = w.buffer((i * chunk) as u64).unwrap();
                buf[..part.len()].copy_from_slice(part);
                w.submit(0, part.len()).unwrap();
                w.finish().unwrap();
            });
        }
    });
    assert_eq!(arena.checksums(vec![(0, 8)]).wait().unwrap(), None);
    assert!(matches!(arena.export().wait(), Err(DeviceError::NotSealed)));
    arena.seal().wait().unwrap();
    let export = arena.export().wait().unwrap();
    assert!(export.fd.is_some());
    assert_eq!(arena.read_at(0, data.len()).wait().unwrap(), data);
    assert_eq!(device.used_bytes().wait().unwrap(), None);
}

/// An arena's last handle may go on any thread: it is freed on its device thread, and a
/// device object cannot be touched elsewhere.
#[test]
fn device_objects_stay_on_their_thread() {
    let device = HostBackend::thread().unwrap();
    let arena = device.allocate(16, "t@2").wait().unwrap();
    assert!(matches!(arena.inner.get(), Err(DeviceError::WrongThread)));
    let other = std::thread::spawn(move || drop(arena));
    other.join().unwrap();
    // The free was queued behind nothing else and the thread still answers.
    assert_eq!(device.used_bytes().wait().unwrap(), None);
}

/// A caller awaiting the device thread is answered in order; a long job delays, but does
/// not lose, what comes after it.
#[tokio::test]
async fn replies_come_in_order_behind_a_busy_device() {
    let device = HostBackend::thread().unwrap();
    let started = Instant::now();
    let busy = device.run(|_| {
        std::thread::sleep(Duration::from_millis(100));
        Ok(1)
    });
    let after = device.used_bytes();
    assert_eq!(busy.await.unwrap(), 1);
    assert_eq!(after.await.unwrap(), None);
    assert!(started.elapsed() >= Duration::from_millis(100));
}

/// An arena whose export never changes.
#[derive(Debug)]
struct Fixed;

impl Arena for Fixed {
    fn len(&self) -> u64 {
        0
    }
    fn write_at(&self, _: u64, _: &[u8]) -> Result<()> {
        Ok(())
    }
    fn seal(&self) -> Result<()> {
        Ok(())
    }
    fn export(&self) -> Result<Export> {
        self.fixed_export().ok_or(DeviceError::ThreadGone)
    }
    fn fixed_export(&self) -> Option<Export> {
        Some(Export {
            device_uuid: "GPU-test".into(),
            handles: crate::Handles::CudaIpc {
                memory: vec![1; 64],
                event: vec![2; 64],
            },
            fd: None,
            alloc_len: 0,
        })
    }
    fn read_at(&self, _: u64, _: &mut [u8]) -> Result<()> {
        Ok(())
    }
}

#[derive(Debug)]
struct FixedBackend;

impl Backend for FixedBackend {
    fn info(&self) -> DeviceInfo {
        HostBackend::new().info()
    }
    fn allocate(&mut self, _: u64, _: &str) -> Result<Box<dyn Arena>> {
        Ok(Box::new(Fixed))
    }
    fn used_bytes(&mut self) -> Option<u64> {
        None
    }
}

/// An export that never changes is answered without the device thread: an attach does not
/// wait behind device work.
#[test]
fn a_fixed_export_needs_no_round_trip() {
    let device =
        DeviceThread::start("fixed", || Ok(Box::new(FixedBackend) as Box<dyn Backend>)).unwrap();
    let arena = device.allocate(0, "f@1").wait().unwrap();
    let (release, held) = mpsc::channel::<()>();
    let busy = device.run(move |_| Ok(held.recv_timeout(Duration::from_secs(5)).is_ok()));
    let export = arena.export().wait().unwrap();
    assert_eq!(
        export.handles,
        crate::Handles::CudaIpc {
            memory: vec![1; 64],
            event: vec![2; 64]
        }
    );
    release.send(()).unwrap();
    assert!(
        busy.wait().unwrap(),
        "the export waited for the busy device thread"
    );
}

/// Once the thread has stopped, calls fail with ThreadGone instead of hanging.
#[test]
fn a_stopped_thread_answers_thread_gone() {
    let device = HostBackend::thread().unwrap();
    let exec = device.shared.exec.clone();
    drop(device);
    let r: Reply<()> = exec.call(|_| Ok(()));
    assert!(matches!(r.wait(), Err(DeviceError::ThreadGone)));
}
