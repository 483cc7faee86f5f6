//! Unloads: arenas dropped outside the lock, drain deadlines, drained unloads.

use super::*;

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
