//! Replicas on further devices: accounting, failed and stale copies, the device cap,
//! replication on attach, tenants' stats.

use super::*;

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

/// A load that may share memory already on its device is reserved past the cap (it needs no
/// room) and takes none while it compares; if it copies after all, the cap is checked then,
/// its own bytes counted. Fails if a comparing load blocks other loads' room, or one that
/// copies skips the cap.
#[test]
fn a_load_comparing_for_memory_to_share_takes_room_only_if_it_copies() {
    let device = probe_device(&Arc::new(Probe::default()));
    let registry = Registry::new(RegistryLimits {
        max_device_bytes: Some(1500),
        ..RegistryLimits::default()
    });
    loaded_on(&registry, &device, "m1", &["a"]);
    let mut manifest = empty_manifest("twin");
    manifest.arena_bytes = 1000;
    registry
        .reserve(
            &Caller::Admin,
            &LoadFor::default(),
            &|_| Quota::default(),
            manifest,
            "m",
            0,
            &["a".to_owned()],
            false,
            LoadClaim::default(),
            true,
        )
        .expect("a load that shares needs no room");
    assert_eq!(registry.bytes_by_device().get("a"), Some(&1000), "m1 only");
    let e = registry.device_room_now("twin", 1).unwrap_err();
    assert!(matches!(e, CoreError::NoDeviceRoom(_)), "{e:?}");
    assert_eq!(
        registry.bytes_by_device().get("a"),
        Some(&2000),
        "it copies: counted"
    );
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
            false,
        )
        .expect("reserve");
    let own = registry.stats(&tenant);
    assert_eq!((own.arena_bytes, own.arenas), (3000, 3));
    let all = registry.stats(&Caller::Admin);
    assert_eq!((all.arena_bytes, all.arenas), (3000, 3));
}
