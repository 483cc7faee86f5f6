//! The registry's own rules, checked without a server.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use modelshare_device::{Arena, Backend, BackendKind, DeviceInfo, DeviceThread, Export};

use super::*;
use crate::model::Manifest;
use crate::weights::layout::ALIGNMENT;

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

/// Freeing device memory can take milliseconds: arenas must be released after the registry's
/// lock is, or every other call would wait on it.
#[test]
fn arenas_are_dropped_outside_the_lock() {
    let probe = Arc::new(Probe::default());
    let device = probe_device(&probe);
    let registry = Arc::new(Registry::new(RegistryLimits::default()));
    probe
        .registry
        .set(Arc::downgrade(&registry))
        .expect("set once");
    loaded(&registry, &device, "m");
    assert_eq!(registry.stats(&Caller::Admin).arenas, 1);
    registry
        .unload(&Caller::Admin, "m", None, false)
        .expect("unload");
    // The free runs on the device thread: wait for it behind a round trip, before this test
    // takes the lock again itself (a free racing the test's own `stats` would see it held).
    device.used_bytes().wait().expect("device answers");
    assert_eq!(registry.stats(&Caller::Admin).arenas, 0);
    assert_eq!(*probe.unlocked_at_drop.lock().expect("probe"), vec![true]);
}

/// A drain deadline set for one incarnation of a name must not end the sessions of the next
/// one (the name unloaded, then loaded again — maybe by another tenant — from v1).
#[test]
fn a_drain_deadline_does_not_outlive_its_model() {
    let probe = Arc::new(Probe::default());
    let device = probe_device(&probe);
    let registry = Registry::new(RegistryLimits::default());
    let admin = Caller::Admin;
    loaded(&registry, &device, "m");
    let s1 = registry
        .open_session(&admin, WorkerHello::default())
        .expect("s1");
    registry.attach(&admin, &s1.id, "m", 0).expect("attach");
    let (_, old_generation) = registry.unload(&admin, "m", None, false).expect("drain");
    registry.end_session(&s1.id);
    // The drained model went with its last lease: the name is free.
    assert!(registry.list(&admin).is_empty());

    loaded(&registry, &device, "m");
    let s2 = registry
        .open_session(&admin, WorkerHello::default())
        .expect("s2");
    registry
        .attach(&admin, &s2.id, "m", 1)
        .expect("attach new v1");
    let (_, new_generation) = registry.unload(&admin, "m", None, false).expect("drain");
    assert_ne!(old_generation, new_generation);
    assert_eq!(registry.force_drained("m", old_generation, &[1]), 0);
    assert_eq!(
        registry.sessions(&admin).len(),
        1,
        "the new holder keeps its session"
    );
    assert_eq!(registry.force_drained("m", new_generation, &[1]), 1);
}

/// Tenant `t` with a `loads` quota of 1, and a load on its behalf.
fn one_load_tenant() -> (Quota, Caller, LoadFor) {
    let quota = Quota {
        loads: Some(1),
        ..Quota::default()
    };
    let tenant = Caller::Tenant {
        name: Arc::from("t"),
        quota,
    };
    let load_for = LoadFor {
        default_owner: Some("t".into()),
        ..LoadFor::default()
    };
    (quota, tenant, load_for)
}

/// The loads quota counts the tenant's versions still loading.
#[test]
fn the_loads_quota_counts_running_loads() {
    let device = probe_device(&Arc::new(Probe::default()));
    let registry = Registry::new(RegistryLimits::default());
    let (quota, tenant, load_for) = one_load_tenant();
    let first = begin(&registry, &device, &tenant, &load_for, quota, "a").expect("first load");
    match begin(&registry, &device, &tenant, &load_for, quota, "b") {
        Err(CoreError::QuotaExceeded {
            quota: "loads",
            limit: 1,
            used: 1,
            ..
        }) => {}
        other => panic!("expected the loads quota, got {other:?}"),
    }
    assert_eq!(registry.usage("t").loads, 1);
    // Refused before the load would take a server-wide load slot, too.
    match registry.authorize_load(&tenant, &load_for, &|_| quota, "c") {
        Err(CoreError::QuotaExceeded { quota: "loads", .. }) => {}
        other => panic!("expected the loads quota before a slot is taken, got {other:?}"),
    }
    registry.finish_load(&first.model, first.version, Ok(first.manifest.clone()));
    registry
        .authorize_load(&tenant, &load_for, &|_| quota, "c")
        .expect("under the quota again");
    assert_eq!(registry.usage("t").loads, 0);
    begin(&registry, &device, &tenant, &load_for, quota, "b").expect("a slot is free again");
}

/// A load admitted under the `loads` quota counts against it from then on, while its files
/// are read and before its version is reserved: a tenant whose quota is 1 that sends three
/// loads at once gets one admitted (and one of the server's load slots) and two refused, not
/// three slots held until validation ends. Giving the admission up frees its place.
#[test]
fn a_load_counts_against_the_loads_quota_from_its_admission() {
    let registry = Registry::new(RegistryLimits::default());
    let (quota, tenant, load_for) = one_load_tenant();
    let first = registry
        .authorize_load(&tenant, &load_for, &|_| quota, "a")
        .expect("the first load");
    for model in ["b", "c"] {
        match registry.authorize_load(&tenant, &load_for, &|_| quota, model) {
            Err(CoreError::QuotaExceeded { quota: "loads", .. }) => {}
            other => panic!("expected the loads quota while 'a' is validated, got {other:?}"),
        }
    }
    assert!(
        registry
            .authorize_load(&Caller::Admin, &LoadFor::default(), &|_| quota, "d")
            .is_ok(),
        "the admin's own load is not the tenant's"
    );
    drop(first);
    let second = registry
        .authorize_load(&tenant, &load_for, &|_| quota, "b")
        .expect("the place is free once the first admission is given up");
    // Reserved, the load counts as its loading version, and its claim no more.
    let device = probe_device(&Arc::new(Probe::default()));
    let b = registry
        .reserve(
            &tenant,
            &load_for,
            &|_| quota,
            empty_manifest("b"),
            "m",
            0,
            &[device.uuid().to_owned()],
            false,
            second,
        )
        .expect("b reserved under its own admission");
    assert_eq!(registry.usage("t").loads, 1);
    registry
        .authorize_load(&tenant, &load_for, &|_| quota, "c")
        .expect_err("b is loading");
    registry.finish_load(&b.model, b.version, Ok(b.manifest.clone()));
    registry
        .authorize_load(&tenant, &load_for, &|_| quota, "c")
        .expect("b's claim went with its reservation");
}

/// Ending a lease ends its ticket in the same step: a session's end closes the descriptors
/// of its unredeemed tickets at once.
#[test]
fn ending_a_session_closes_its_tickets() {
    let device = probe_device(&Arc::new(Probe::default()));
    let registry = Registry::new(RegistryLimits::default());
    let admin = Caller::Admin;
    loaded(&registry, &device, "m");
    let s = registry
        .open_session(&admin, WorkerHello::default())
        .expect("session");
    let lease = registry.attach(&admin, &s.id, "m", 0).expect("attach");
    let fd: std::os::fd::OwnedFd = std::fs::File::open("/dev/null").expect("fd").into();
    let expires = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let ticket = registry
        .issue_ticket(&lease.lease_id, fd, None, expires)
        .expect("ticket");
    assert_eq!(registry.tickets(), 1);
    registry.end_session(&s.id);
    assert_eq!(registry.tickets(), 0);
    assert_eq!(
        registry.redeem_ticket(&ticket, None).unwrap_err(),
        TicketError::Unknown
    );
}

/// Attaching "latest" (version 0) while a model's first version is loading no longer takes
/// that version where the backend orders reads after the load (a device's ready event), or
/// takes it where the backend cannot (host memory), or prefers it to a ready version.
#[test]
fn attach_latest_takes_a_first_version_still_loading() {
    let admin = Caller::Admin;
    for device_orders_reads in [true, false] {
        let probe = Arc::new(Probe {
            attach_while_loading: device_orders_reads,
            ..Probe::default()
        });
        let device = probe_device(&probe);
        let registry = Registry::new(RegistryLimits::default());
        let first = begin(
            &registry,
            &device,
            &admin,
            &LoadFor::default(),
            Quota::default(),
            "m",
        )
        .expect("begin");
        let s = registry
            .open_session(&admin, WorkerHello::default())
            .expect("session");
        let got = registry.attach(&admin, &s.id, "m", 0);
        if device_orders_reads {
            let att = got.expect("attach latest during the first load");
            assert_eq!(att.manifest.version, first.version);
            assert!(att.loading);
        } else {
            assert!(matches!(got, Err(CoreError::NoReadyVersion(_))), "{got:?}");
        }
        // Once a version is ready, a newer one still loading is not what "latest" attaches.
        registry.finish_load(&first.model, first.version, Ok(first.manifest.clone()));
        let second = begin(
            &registry,
            &device,
            &admin,
            &LoadFor::default(),
            Quota::default(),
            "m",
        )
        .expect("begin the second version");
        let att = registry
            .attach(&admin, &s.id, "m", 0)
            .expect("attach latest");
        assert_eq!(att.manifest.version, first.version);
        assert!(!att.loading);
        assert_ne!(second.version, first.version);
    }
}

/// A session opened after a version became ready no longer skips that version's (late)
/// VersionReady event, or one opened before it no longer hears of it.
#[test]
fn sessions_hear_only_of_versions_ready_after_they_opened() {
    let probe = Arc::new(Probe::default());
    let device = probe_device(&probe);
    let registry = Registry::new(RegistryLimits::default());
    let admin = Caller::Admin;
    let early = registry
        .open_session(&admin, WorkerHello::default())
        .expect("session");
    loaded(&registry, &device, "m");
    let late = registry
        .open_session(&admin, WorkerHello::default())
        .expect("session");
    assert!(registry.ready_since_open(&early.id, "m", 1));
    assert!(!registry.ready_since_open(&late.id, "m", 1));
    loaded(&registry, &device, "m");
    assert!(registry.ready_since_open(&late.id, "m", 2));
}

/// A model unloaded while a worker still held it no longer disappears once that worker lets
/// go (its record stayed, the name taken and counted), or a new load during the drain no
/// longer keeps the model.
#[test]
fn a_drained_unload_removes_the_model_with_its_last_lease() {
    let probe = Arc::new(Probe::default());
    let device = probe_device(&probe);
    let registry = Registry::new(RegistryLimits::default());
    let admin = Caller::Admin;
    loaded(&registry, &device, "m");
    let s = registry
        .open_session(&admin, WorkerHello::default())
        .expect("session");
    let lease = registry.attach(&admin, &s.id, "m", 0).expect("attach");
    let (versions, _) = registry.unload(&admin, "m", None, false).expect("unload");
    assert_eq!(versions[0].state, VersionState::Draining);
    assert_eq!(registry.stats(&admin).models, 1, "still draining");
    registry
        .release(&admin, &s.id, &lease.lease_id)
        .expect("release");
    assert_eq!(registry.stats(&admin).models, 0);
    assert!(registry.list(&admin).is_empty());

    // Loaded again while draining: the model stays when the old version goes.
    loaded(&registry, &device, "n");
    let lease = registry.attach(&admin, &s.id, "n", 0).expect("attach n");
    registry.unload(&admin, "n", None, false).expect("unload n");
    loaded(&registry, &device, "n");
    registry
        .release(&admin, &s.id, &lease.lease_id)
        .expect("release n");
    assert_eq!(registry.list(&admin).len(), 1);
}

/// Replicas are reserved with the load (bytes and arenas), attachable on their device only once
/// they have an arena (a host-like arena: once copied), dropped alone, and freed with the
/// version. Fails if the accounting drifts or an attach lands on the wrong device.
#[test]
fn replicas_are_accounted_and_attached_by_device() {
    let device = probe_device(&Arc::new(Probe::default()));
    let registry = Registry::new(RegistryLimits::default());
    let admin = Caller::Admin;
    let r = reserve_on(&registry, "m", &["a", "b", "c"]).expect("reserve");
    let key = r.key();
    let stats = registry.stats(&admin);
    assert_eq!((stats.arena_bytes, stats.arenas), (3000, 3));
    registry.set_arena(
        "m",
        r.version,
        device.allocate(0, "m").wait().expect("arena"),
    );
    registry.finish_load("m", r.version, Ok(r.manifest.clone()));
    let s = registry
        .open_session(&admin, WorkerHello::default())
        .expect("session");

    // On the first device: at once. On a replica's before its arena: retry shortly.
    let on_a = registry
        .attach_on(&admin, &s.id, "m", 0, Some("A"))
        .expect("attach on a");
    assert_eq!(on_a.device, "a");
    assert!(matches!(
        registry.attach_on(&admin, &s.id, "m", 0, Some("b")),
        Err(CoreError::Allocating { .. })
    ));
    // Its arena is there but not copied (no attach while loading here): still retry shortly.
    assert!(registry.set_replica_arena(&key, "b", device.allocate(0, "m@b").wait().unwrap()));
    assert!(matches!(
        registry.attach_on(&admin, &s.id, "m", 0, Some("b")),
        Err(CoreError::Allocating { .. })
    ));
    assert!(registry.replica_ready(&key, "b"));
    let on_b = registry
        .attach_on(&admin, &s.id, "m", 0, Some("b"))
        .expect("attach on b");
    assert_eq!(on_b.device, "b");
    // Not placed there: the error names where it is.
    let e = registry
        .attach_on(&admin, &s.id, "m", 0, Some("z"))
        .unwrap_err();
    assert!(e.to_string().contains("it is on a, b, c"), "{e}");
    let used = registry.by_device();
    assert_eq!(used["a"].leases, 1);
    assert_eq!(used["b"].leases, 1);
    assert_eq!(used["c"].arenas, 1);

    // c's copy failed: dropped alone.
    registry.drop_replica(&key, "c", "copy failed");
    let stats = registry.stats(&admin);
    assert_eq!((stats.arena_bytes, stats.arenas), (2000, 2));
    assert!(!registry.set_replica_arena(&key, "c", device.allocate(0, "late").wait().unwrap()));

    registry.end_session(&s.id);
    registry.unload(&admin, "m", None, true).expect("unload");
    let stats = registry.stats(&admin);
    assert_eq!((stats.arena_bytes, stats.arenas), (0, 0));
    assert!(registry.by_device().is_empty());
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

/// A replica whose copy fails takes the sessions that attached to it while it was copied
/// (they waited on its ready event, which the failure opens: they would compute on what the
/// copy left) and only those; the version stays on its first device. Fails if drop_replica
/// leaves such a session open, or ends another.
#[test]
fn a_failed_replica_ends_the_sessions_attached_to_it() {
    let probe = Arc::new(Probe {
        attach_while_loading: true,
        ..Probe::default()
    });
    let device = probe_device(&probe);
    let registry = Registry::new(RegistryLimits::default());
    let admin = Caller::Admin;
    let key = loaded_on(&registry, &device, "m", &["a", "b"]).key();
    assert!(registry.set_replica_arena(&key, "b", device.allocate(0, "m@b").wait().unwrap()));
    let on_a = registry
        .open_session(&admin, WorkerHello::default())
        .unwrap();
    let on_b = registry
        .open_session(&admin, WorkerHello::default())
        .unwrap();
    registry
        .attach_on(&admin, &on_a.id, "m", 0, Some("a"))
        .expect("on a");
    let copying = registry
        .attach_on(&admin, &on_b.id, "m", 0, Some("b"))
        .expect("on b while copied");
    assert!(copying.loading, "attached before the copy is done");

    registry.drop_replica(&key, "b", "peer copy failed");
    assert!(
        on_b.revocation.reason().contains("peer copy failed"),
        "{}",
        on_b.revocation.reason()
    );
    assert!(
        on_b.revocation.reason().contains("device b"),
        "{}",
        on_b.revocation.reason()
    );
    assert_eq!(on_a.revocation.reason(), "session revoked", "not revoked");
    let stats = registry.stats(&admin);
    assert_eq!(
        (stats.arena_bytes, stats.arenas, stats.sessions),
        (1000, 1, 1)
    );
    assert_eq!(registry.by_device()["a"].leases, 1);
    // Reconnecting, b's worker is told where the version is.
    let again = registry
        .open_session(&admin, WorkerHello::default())
        .unwrap();
    let e = registry
        .attach_on(&admin, &again.id, "m", 0, Some("b"))
        .unwrap_err();
    assert!(e.to_string().contains("it is on a"), "{e}");
}

/// A copy that outlives its version (the name unloaded and loaded again meanwhile, with
/// version numbers starting over) touches nothing of the new load: no arena handed in, not
/// marked ready, not dropped, no manifest to check against. Fails if the replica calls go by
/// name and number alone.
#[test]
fn a_replica_copy_never_touches_a_later_load_of_the_name() {
    let device = probe_device(&Arc::new(Probe::default()));
    let registry = Registry::new(RegistryLimits::default());
    let admin = Caller::Admin;
    let old = loaded_on(&registry, &device, "m", &["a", "b"]).key();
    registry.unload(&admin, "m", None, false).expect("unload");
    let new = loaded_on(&registry, &device, "m", &["a", "b"]).key();
    assert_eq!(
        (old.model.as_str(), old.version),
        (new.model.as_str(), new.version)
    );
    assert_ne!(old, new);

    assert!(registry.replica_manifest(&old).is_none());
    assert!(!registry.set_replica_arena(&old, "b", device.allocate(0, "old").wait().unwrap()));
    assert!(!registry.replica_ready(&old, "b"));
    registry.drop_replica(&old, "b", "old copy failed");
    let stats = registry.stats(&admin);
    assert_eq!(
        (stats.arena_bytes, stats.arenas),
        (2000, 2),
        "the new replica is still reserved"
    );

    // The new load's own copy goes through.
    assert!(registry.replica_manifest(&new).is_some());
    assert!(registry.set_replica_arena(&new, "b", device.allocate(0, "new").wait().unwrap()));
    assert!(registry.replica_ready(&new, "b"));
}

/// `max_device_bytes` holds per device under the registry's lock: loads placed from the same
/// snapshot (each saw the device empty) cannot both land on it. Fails if only placement checks
/// the cap.
#[test]
fn the_device_cap_is_held_when_loads_are_reserved() {
    let device = probe_device(&Arc::new(Probe::default()));
    let registry = Registry::new(RegistryLimits {
        max_device_bytes: Some(1500),
        ..RegistryLimits::default()
    });
    loaded_on(&registry, &device, "m1", &["a"]);
    let reserve = |devices: &[&str]| reserve_on(&registry, "m2", devices);
    let e = reserve(&["a"]).unwrap_err();
    assert!(matches!(e, CoreError::NoDeviceRoom(_)), "{e:?}");
    assert!(e.to_string().contains("max_device_bytes 1500"), "{e}");
    // A replica over the cap refuses the whole load.
    let e = reserve(&["b", "a"]).unwrap_err();
    assert!(matches!(e, CoreError::NoDeviceRoom(_)), "{e:?}");
    assert_eq!(
        registry.stats(&Caller::Admin).arena_bytes,
        1000,
        "nothing reserved"
    );
    reserve(&["b"]).expect("room on b");
}

/// `replicate_on_attach` reserves one further replica per device, of a ready version only,
/// counted like any replica and held to the limits; a device that has it (or a copy under
/// way) is told to retry, an ending version gets none. Fails if a second worker's attach
/// reserves a second copy, or the limits are skipped.
#[test]
fn a_replica_for_a_worker_is_reserved_once_within_the_limits() {
    let device = probe_device(&Arc::new(Probe::default()));
    let registry = Registry::new(RegistryLimits {
        max_total_bytes: Some(2500),
        ..RegistryLimits::default()
    });
    let admin = Caller::Admin;
    let no_quota = |_: &str| Quota::default();
    let key = loaded_on(&registry, &device, "m", &["a"]).key();
    let add = |on: &str| registry.add_replica(&admin, "m", 0, on, &no_quota);
    match add("b").expect("reserved") {
        ReplicaOnAttach::Copy { key: k, source } => {
            assert_eq!(k, key);
            assert_eq!(source.len(), 0, "the version's first arena");
        }
        other => panic!("{other:?}"),
    }
    let stats = registry.stats(&admin);
    assert_eq!((stats.arena_bytes, stats.arenas), (2000, 2));
    assert!(
        matches!(add("B"), Ok(ReplicaOnAttach::Pending)),
        "a copy under way"
    );
    assert!(
        matches!(add("a"), Ok(ReplicaOnAttach::Pending)),
        "the first device"
    );
    let e = add("c").unwrap_err();
    assert!(matches!(e, CoreError::LimitExceeded { .. }), "{e:?}");
    assert_eq!(registry.stats(&admin).arenas, 2, "nothing reserved");

    // Draining (a worker still holds it): no copy for it.
    let s = registry
        .open_session(&admin, WorkerHello::default())
        .unwrap();
    registry
        .attach_on(&admin, &s.id, "m", 1, Some("a"))
        .unwrap();
    registry.unload(&admin, "m", None, false).expect("unload");
    assert!(matches!(
        registry.add_replica(&admin, "m", 1, "c", &no_quota),
        Ok(ReplicaOnAttach::Refused)
    ));
}

/// A tenant's stats count its model's arenas as its bytes count them: the first and each
/// replica. Fails if replicas count in the bytes but not in the arenas.
#[test]
fn a_tenants_stats_count_replicas_as_arenas() {
    let registry = Registry::new(RegistryLimits::default());
    let tenant = Caller::Tenant {
        name: Arc::from("t"),
        quota: Quota::default(),
    };
    let mut manifest = empty_manifest("m");
    manifest.arena_bytes = 1000;
    let devices = ["a", "b", "c"].map(String::from);
    let load_for = LoadFor {
        default_owner: Some("t".into()),
        ..LoadFor::default()
    };
    registry
        .reserve(
            &tenant,
            &load_for,
            &|_| Quota::default(),
            manifest,
            "m",
            0,
            &devices,
            false,
            LoadClaim::default(),
        )
        .expect("reserve");
    let own = registry.stats(&tenant);
    assert_eq!((own.arena_bytes, own.arenas), (3000, 3));
    let all = registry.stats(&Caller::Admin);
    assert_eq!((all.arena_bytes, all.arenas), (3000, 3));
}

/// An attach's lease is given back when its guard drops uncommitted (a failure after the
/// registry's step: the export, the ticket, the reply), and kept once committed.
#[test]
fn a_pending_lease_is_given_back_unless_committed() {
    let device = probe_device(&Arc::new(Probe::default()));
    let registry = Arc::new(Registry::new(RegistryLimits::default()));
    let admin = Caller::Admin;
    loaded(&registry, &device, "m");
    let s = registry
        .open_session(&admin, WorkerHello::default())
        .expect("session");
    let (attached, pending) = registry
        .attach_pending(&admin, &s.id, "m", 0, None)
        .expect("attach");
    assert_eq!(pending.id(), attached.lease_id);
    let fd: std::os::fd::OwnedFd = std::fs::File::open("/dev/null").expect("fd").into();
    let expires = std::time::Instant::now() + std::time::Duration::from_secs(60);
    registry
        .issue_ticket(&attached.lease_id, fd, None, expires)
        .expect("ticket");
    drop(pending);
    assert_eq!(registry.tickets(), 0, "the lease's ticket went with it");
    let err = registry
        .release(&admin, &s.id, &attached.lease_id)
        .expect_err("given back already");
    assert!(matches!(err, CoreError::LeaseNotFound(_)), "{err:?}");

    let (attached, pending) = registry
        .attach_pending(&admin, &s.id, "m", 0, None)
        .expect("attach");
    assert_eq!(pending.commit(), attached.lease_id);
    registry
        .release(&admin, &s.id, &attached.lease_id)
        .expect("kept, so released once");
}
