//! The registry's own rules, checked without a server.
//!
//! Here: the probe device (a backend that records whether the registry's lock was free when
//! an arena dropped) and the load helpers; the tests by subject in the submodules.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use modelshare_device::{Arena, Backend, BackendKind, DeviceInfo, DeviceThread, Export};

use super::*;
use crate::model::Manifest;
use crate::weights::layout::ALIGNMENT;

mod quotas;
mod replication;
mod sessions;
mod unload;

/// Shared between the test, the backend and its arenas.
#[derive(Debug, Default)]
struct Probe {
    registry: OnceLock<Weak<Registry>>,
    /// Whether the registry's lock was free when an arena was dropped.
    unlocked_at_drop: Mutex<Vec<bool>>,
    /// What the arenas say of attaching while loading (a device backend with a ready event).
    attach_while_loading: bool,
}

#[derive(Debug)]
struct ProbeArena(Arc<Probe>);

impl Arena for ProbeArena {
    fn len(&self) -> u64 {
        0
    }
    fn write_at(&self, _: u64, _: &[u8]) -> modelshare_device::Result<()> {
        Ok(())
    }
    fn seal(&self) -> modelshare_device::Result<()> {
        Ok(())
    }
    fn export(&self) -> modelshare_device::Result<Export> {
        Err(modelshare_device::DeviceError::Unsupported {
            what: "export".into(),
        })
    }
    fn read_at(&self, _: u64, _: &mut [u8]) -> modelshare_device::Result<()> {
        Ok(())
    }
    fn attach_while_loading(&self) -> bool {
        self.0.attach_while_loading
    }
}

impl Drop for ProbeArena {
    fn drop(&mut self) {
        if let Some(r) = self.0.registry.get().and_then(Weak::upgrade) {
            let free = r.state.try_lock().is_ok();
            self.0.unlocked_at_drop.lock().expect("probe").push(free);
        }
    }
}

#[derive(Debug)]
struct ProbeBackend(Arc<Probe>);

impl Backend for ProbeBackend {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            backend: BackendKind::Host,
            uuid: "probe".into(),
            name: "probe".into(),
            total_bytes: 0,
            numa_node: None,
        }
    }
    fn allocate(&mut self, _: u64, _: &str) -> modelshare_device::Result<Box<dyn Arena>> {
        Ok(Box::new(ProbeArena(self.0.clone())))
    }
    fn used_bytes(&mut self) -> Option<u64> {
        None
    }
}

fn probe_device(probe: &Arc<Probe>) -> DeviceThread {
    let probe = probe.clone();
    DeviceThread::start("probe", move || {
        Ok(Box::new(ProbeBackend(probe)) as Box<dyn Backend>)
    })
    .expect("probe device")
}

/// A model of no tensors (the registry does not look inside).
fn empty_manifest(model: &str) -> Manifest {
    Manifest {
        model: model.into(),
        version: 0,
        arena_bytes: 0,
        alignment: ALIGNMENT,
        tensors: Vec::new(),
        header_metadata: BTreeMap::new(),
        files: Vec::new(),
    }
}

fn begin(
    registry: &Registry,
    device: &DeviceThread,
    caller: &Caller,
    load_for: &LoadFor,
    quota: Quota,
    model: &str,
) -> Result<Reservation, CoreError> {
    let r = registry.reserve(
        caller,
        load_for,
        &|_| quota,
        empty_manifest(model),
        "m",
        0,
        &[device.uuid().to_owned()],
        false,
        LoadClaim::default(),
        false,
    )?;
    let arena = device.allocate(0, model).wait().expect("allocate");
    registry.set_arena(&r.model, r.version, arena);
    Ok(r)
}

fn loaded(registry: &Registry, device: &DeviceThread, model: &str) {
    let job = begin(
        registry,
        device,
        &Caller::Admin,
        &LoadFor::default(),
        Quota::default(),
        model,
    )
    .expect("begin");
    registry.finish_load(&job.model, job.version, Ok(job.manifest.clone()));
}

/// Reserves a load of `model` (1000 bytes) on `devices`, the first named first.
fn reserve_on(
    registry: &Registry,
    model: &str,
    devices: &[&str],
) -> Result<Reservation, CoreError> {
    let mut manifest = empty_manifest(model);
    manifest.arena_bytes = 1000;
    let devices: Vec<String> = devices.iter().map(|d| (*d).to_owned()).collect();
    registry.reserve(
        &Caller::Admin,
        &LoadFor::default(),
        &|_| Quota::default(),
        manifest,
        "m",
        0,
        &devices,
        false,
        LoadClaim::default(),
        false,
    )
}

/// Reserves `model` (1000 bytes) on `devices`, gives its first arena and ends its load.
fn loaded_on(
    registry: &Registry,
    device: &DeviceThread,
    model: &str,
    devices: &[&str],
) -> Reservation {
    let r = reserve_on(registry, model, devices).expect("reserve");
    let arena = device.allocate(0, model).wait().expect("arena");
    registry.set_arena(model, r.version, arena);
    registry.finish_load(model, r.version, Ok(r.manifest.clone()));
    r
}
