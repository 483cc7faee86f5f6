//! The services over an in-process [`App`] whose device can be held busy at will.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use modelshare_device::{Arena, Backend, DeviceInfo, DeviceThread, HostBackend};
use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_server::AdminService;

use super::admin::AdminApi;
use crate::app::App;
use crate::config::{Config, ServeArgs};
use modelshare_core::devices::Devices;
use modelshare_core::metrics::Metrics;
use modelshare_core::registry::LoadFor;
use modelshare_core::tenants::{Caller, TenantStore};

/// A latch the test opens.
#[derive(Debug, Default)]
struct Latch {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Latch {
    fn open(&self) {
        *self.open.lock().expect("latch") = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut open = self.open.lock().expect("latch");
        while !*open {
            open = self.cv.wait(open).expect("latch");
        }
    }
}

/// Host memory whose allocations hold the device thread until the latch opens: a device busy
/// with a long allocation (or any long device call).
#[derive(Debug)]
struct HeldDevice {
    host: HostBackend,
    latch: Arc<Latch>,
}

impl Backend for HeldDevice {
    fn info(&self) -> DeviceInfo {
        self.host.info()
    }
    fn allocate(&mut self, len: u64, label: &str) -> modelshare_device::Result<Box<dyn Arena>> {
        self.latch.wait();
        self.host.allocate(len, label)
    }
    fn used_bytes(&mut self) -> Option<u64> {
        self.host.used_bytes()
    }
}

/// A model file of one f32 tensor of 4 values, under a fresh model root.
fn model_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let header = br#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header);
    for x in [1.0f32, 2.0, 3.0, 4.0] {
        file.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(dir.path().join("m.safetensors"), file).expect("write model");
    dir
}

fn app(root: &std::path::Path, latch: &Arc<Latch>) -> App {
    let config = Config::from_args(ServeArgs {
        model_root: Some(root.to_owned()),
        // Beside the model, not the shared default: its held-memory records go there too.
        handle_socket: Some(root.join("handles.sock")),
        ..ServeArgs::default()
    })
    .expect("config");
    let latch = latch.clone();
    let device = DeviceThread::start("held", move || {
        Ok(Box::new(HeldDevice {
            host: HostBackend::new(),
            latch,
        }) as Box<dyn Backend>)
    })
    .expect("device");
    App::new(
        Arc::new(Devices::single(device)),
        Arc::new(config),
        Arc::new(Metrics::new().expect("metrics")),
        Arc::new(TenantStore::open(None).expect("tenants")),
    )
}

async fn stats(api: &AdminApi) -> pb::GetStatsResponse {
    let mut request = tonic::Request::new(pb::GetStatsRequest {});
    request.extensions_mut().insert(Caller::Admin);
    tokio::time::timeout(Duration::from_secs(5), api.get_stats(request))
        .await
        .expect("GetStats must answer while the device is busy")
        .expect("GetStats")
        .into_inner()
}

fn count(s: &pb::GetStatsResponse, state: pb::VersionState) -> u32 {
    s.versions_by_state
        .iter()
        .find(|c| c.state == state as i32)
        .map_or(0, |c| c.count)
}

/// GetStats must not wait for the device: while a load holds the device thread (its
/// allocation does not return), stats still answer from the registry, with the device's
/// description and its last memory figure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_stats_answers_while_a_load_holds_the_device() {
    let root = model_root();
    let latch = Arc::new(Latch::default());
    // However the test ends, the device is let go (or dropping the app would wait for it).
    struct Release(Arc<Latch>);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.open();
        }
    }
    let _release = Release(latch.clone());
    let app = app(root.path(), &latch);
    let api = AdminApi::new(app.clone());
    let load = {
        let app = app.clone();
        tokio::spawn(async move {
            app.host
                .start_load(
                    &Caller::Admin,
                    LoadFor::default(),
                    "m",
                    "m.safetensors",
                    false,
                )
                .await
        })
    };
    // The version is reserved, its allocation held on the device thread.
    let mut reserved = false;
    for _ in 0..200 {
        if count(&stats(&api).await, pb::VersionState::Loading) == 1 {
            reserved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reserved, "the load never reached its allocation");
    for _ in 0..3 {
        let s = stats(&api).await;
        assert_eq!(count(&s, pb::VersionState::Loading), 1);
        assert_eq!(s.arena_bytes, 256, "the reservation is counted");
        assert_eq!(s.device.as_ref().map(|d| d.uuid.as_str()), Some("host"));
    }
    assert!(!load.is_finished(), "the device was still held");
    latch.open();
    let running = load.await.expect("join").expect("load");
    let version = running.done.await.expect("done").expect("loaded");
    assert_eq!(version.version, 1);
    assert_eq!(count(&stats(&api).await, pb::VersionState::Ready), 1);
}
