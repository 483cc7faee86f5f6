//! Sessions and their leases: tickets, attaching latest, version events, pending leases.

use super::*;

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
