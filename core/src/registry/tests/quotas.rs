//! The `loads` quota: running loads, and loads from their admission.

use super::*;

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
            false,
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

/// A model's name would be found in one case only, or another tenant's private model would be
/// found (and spelled) under another case.
#[test]
fn names_resolve_in_any_case_among_the_callers_models() {
    let device = probe_device(&Arc::new(Probe::default()));
    let registry = Registry::new(RegistryLimits::default());
    let (quota, tenant, load_for) = one_load_tenant();
    let job = begin(
        &registry,
        &device,
        &tenant,
        &load_for,
        quota,
        "All-MiniLM-L6-v2",
    )
    .expect("load");
    registry.finish_load(&job.model, job.version, Ok(job.manifest.clone()));
    for asked in ["All-MiniLM-L6-v2", "all-minilm-l6-v2", "ALL-MINILM-L6-V2"] {
        assert_eq!(
            registry.resolve(&tenant, asked).as_deref(),
            Some("All-MiniLM-L6-v2"),
            "{asked}"
        );
    }
    assert_eq!(
        registry
            .resolve(&Caller::Admin, "all-minilm-l6-v2")
            .as_deref(),
        Some("All-MiniLM-L6-v2")
    );
    let other = Caller::Tenant {
        name: Arc::from("u"),
        quota: Quota::default(),
    };
    assert_eq!(registry.resolve(&other, "all-minilm-l6-v2"), None);
    assert_eq!(
        registry.canonical(&other, "all-minilm-l6-v2"),
        "all-minilm-l6-v2"
    );
    assert_eq!(registry.resolve(&tenant, "nope"), None);
}
