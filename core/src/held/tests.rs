//! The held-memory records and the rules of offers and claims, without a server.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use modelshare_device::HostBackend;

use super::*;
use crate::model::{Manifest, TensorMeta};
use crate::tenants::policy::Access;
use crate::weights::dtype::DType;

fn manifest(model: &str, version: u32) -> Manifest {
    Manifest {
        model: model.into(),
        version,
        arena_bytes: 512,
        alignment: 256,
        tensors: vec![TensorMeta {
            name: "w".into(),
            dtype: DType::F32,
            shape: vec![64],
            offset: 0,
            byte_length: 256,
            xxh3: 7,
            ms64: 0,
        }],
        header_metadata: BTreeMap::new(),
        files: Vec::new(),
    }
}

fn files() -> Vec<FileId> {
    vec![FileId {
        path: "m/model.safetensors".into(),
        len: 1000,
        mtime_ns: 5,
        ino: 9,
    }]
}

fn record(model: &str, version: u32, holders: Vec<Holder>) -> HeldRecord {
    let mut r = HeldRecord::new(
        &manifest(model, version),
        Some("t".into()),
        &Access::default(),
        "m",
        files(),
        "host",
        "host",
    );
    r.holders = holders;
    r
}

fn me() -> Holder {
    Holder::of(std::process::id()).expect("this process is alive")
}

/// A store over `dir` after a "restart": the records written there are pending.
fn restarted(dir: &std::path::Path, wait: Duration) -> HeldStore {
    HeldStore::open(Some(dir.to_path_buf()), wait)
}

/// A record no longer survives a restart as pending memory (counted as held by workers, its
/// number offered to a load of the same source), or a record's file is readable by others.
#[test]
fn a_record_survives_a_restart_as_pending() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let recs = dir.path().join("h.held");
    let first = HeldStore::open(Some(recs.clone()), Duration::from_secs(5));
    first.remember(&record("m", 3, vec![me()]));
    let file = recs.join("m@3.json");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "mode {mode:o}");
    assert_eq!(
        std::fs::metadata(&recs).unwrap().permissions().mode() & 0o077,
        0
    );

    let second = restarted(&recs, Duration::from_secs(5));
    assert_eq!(second.held_by_workers_bytes(), 512);
    assert_eq!(second.version_hint("m", "m"), Some(3));
    assert_eq!(second.version_hint("m", "other/path"), None);
    let p = second.pending();
    assert_eq!(
        (p[0].model.as_str(), p[0].version, p[0].bytes),
        ("m", 3, 512)
    );
}

/// A record whose holders are all gone (or that never had one) is no longer dropped at start,
/// so that a restart would wait for memory no process can offer.
#[test]
fn memory_no_live_process_held_is_not_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let first = HeldStore::open(Some(dir.path().to_path_buf()), Duration::from_secs(5));
    let dead = Holder {
        pid: std::process::id(),
        start: 1,
    };
    first.remember(&record("gone", 1, vec![dead]));
    first.remember(&record("never", 1, Vec::new()));
    first.remember(&record("kept", 1, vec![me()]));
    let second = restarted(dir.path(), Duration::from_secs(5));
    let names: Vec<String> = second.pending().into_iter().map(|p| p.model).collect();
    assert_eq!(names, ["kept"]);
    assert!(!dir.path().join("gone@1.json").exists());
}

/// Garbage in the records directory no longer gets removed (or is taken for a record).
#[test]
fn unreadable_records_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x@1.json"), b"{not json").unwrap();
    let mut wrong = record("y", 2, vec![me()]);
    wrong.format = 99;
    std::fs::write(
        dir.path().join("y@2.json"),
        serde_json::to_vec(&wrong).unwrap(),
    )
    .unwrap();
    let renamed = record("z", 1, vec![me()]);
    std::fs::write(
        dir.path().join("other@1.json"),
        serde_json::to_vec(&renamed).unwrap(),
    )
    .unwrap();
    let store = restarted(dir.path(), Duration::from_secs(5));
    assert!(store.pending().is_empty());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// A load of the same files no longer waits for an offer and takes the adopted memory, or a
/// load of changed files (another mtime) waits for memory that is not its bytes.
#[tokio::test]
async fn a_claiming_load_gets_the_offered_memory() {
    let dir = tempfile::tempdir().unwrap();
    HeldStore::open(Some(dir.path().to_path_buf()), Duration::from_secs(5)).remember(&record(
        "m",
        3,
        vec![me()],
    ));
    let store = std::sync::Arc::new(restarted(dir.path(), Duration::from_secs(5)));

    let mut changed = files();
    changed[0].mtime_ns += 1;
    assert!(store.claim(&manifest("m", 1), &changed).await.is_none());

    let claimer = {
        let store = store.clone();
        tokio::spawn(async move { store.claim(&manifest("m", 1), &files()).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let ticket = store
        .offer("m", 3, "host", 512, Some(1000), Duration::from_secs(5))
        .expect("wanted");
    assert!(HeldStore::is_offer(&ticket));
    assert!(
        store
            .offer("m", 3, "host", 512, Some(1000), Duration::from_secs(5))
            .unwrap_err()
            .contains("under way")
    );
    assert!(
        store
            .redeem_offer(&ticket, Some(1001))
            .unwrap_err()
            .contains("another user")
    );
    let ticket = {
        store.offer_failed(&("m".into(), 3));
        store.sweep(&BTreeMap::new());
        // The refused redemption used the ticket up; a new offer is wanted again.
        store
            .offer("m", 3, "host", 512, Some(1000), Duration::from_secs(5))
            .expect("wanted again")
    };
    let redeemed = store.redeem_offer(&ticket, Some(1000)).expect("redeem");
    assert_eq!(redeemed.record.version, 3);
    let device = HostBackend::thread().unwrap();
    let arena = device.allocate(512, "m@3").await.unwrap();
    assert!(matches!(store.adopted(&("m".into(), 3), arena), Ok(true)));
    let (got, rec) = claimer.await.unwrap().expect("the adopted memory");
    assert_eq!(got.len(), 512);
    assert_eq!(rec.version, 3);
    assert_eq!(store.held_by_workers_bytes(), 0);
    // Until the load has registered the version, the record stays (attaches hear "retry"),
    // and no other offer is wanted. Model names are found in any case: a worker that attached
    // with another spelling offers that one.
    assert!(store.pending_record("m", 3).is_some());
    assert_eq!(
        store.pending_record("M", 3).map(|r| r.model),
        Some("m".to_owned())
    );
    assert!(store.pending_record("M", 4).is_none());
    assert!(
        store
            .offer("m", 3, "host", 512, None, Duration::from_secs(1))
            .unwrap_err()
            .contains("already adopted")
    );
    store.restored(&("m".into(), 3));
    assert!(store.pending_record("m", 3).is_none());
}

/// A claim no longer gives up at the deadline when no worker offers (the load then reads the
/// files), or an offer after the deadline is wanted.
#[tokio::test]
async fn a_claim_gives_up_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    HeldStore::open(Some(dir.path().to_path_buf()), Duration::from_secs(5)).remember(&record(
        "m",
        1,
        vec![me()],
    ));
    let store = restarted(dir.path(), Duration::from_millis(100));
    let started = std::time::Instant::now();
    assert!(store.claim(&manifest("m", 1), &files()).await.is_none());
    assert!(started.elapsed() >= Duration::from_millis(90));
    assert!(
        store
            .offer("m", 1, "host", 512, None, Duration::from_secs(1))
            .is_err()
    );
    assert_eq!(store.held_by_workers_bytes(), 0);
}

/// Offers for another device, or of an allocation smaller than the arena, are no longer
/// refused.
#[test]
fn offers_must_match_the_record() {
    let dir = tempfile::tempdir().unwrap();
    HeldStore::open(Some(dir.path().to_path_buf()), Duration::from_secs(5)).remember(&record(
        "m",
        1,
        vec![me()],
    ));
    let store = restarted(dir.path(), Duration::from_secs(5));
    let ttl = Duration::from_secs(1);
    assert!(
        store
            .offer("m", 1, "GPU-other", 512, None, ttl)
            .unwrap_err()
            .contains("device")
    );
    assert!(
        store
            .offer("m", 1, "host", 100, None, ttl)
            .unwrap_err()
            .contains("smaller")
    );
    assert!(
        store
            .offer("m", 2, "host", 512, None, ttl)
            .unwrap_err()
            .contains("no record")
    );
    assert!(store.offer("m", 1, "host", 512, None, ttl).is_ok());
}

/// The sweep no longer removes the record of a version whose memory went, keeps one still
/// live, or keeps the holders current.
#[test]
fn the_sweep_follows_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let store = HeldStore::open(Some(dir.path().to_path_buf()), Duration::from_secs(5));
    store.remember(&record("a", 1, Vec::new()));
    store.remember(&record("b", 1, Vec::new()));
    let mut live = BTreeMap::new();
    live.insert(("a".to_owned(), 1), BTreeSet::from([std::process::id()]));
    store.sweep(&live);
    assert!(dir.path().join("a@1.json").exists());
    assert!(!dir.path().join("b@1.json").exists());
    let back: HeldRecord =
        serde_json::from_slice(&std::fs::read(dir.path().join("a@1.json")).unwrap()).unwrap();
    assert_eq!(back.holders, vec![me()]);
}
