//! Admission against the host's memory: cgroup limits (v1 and v2), loads in progress, models
//! larger than what is free.

use std::time::Duration;

use modelshare_proto::v1 as pb;

use crate::common::{self, Server};

/// A model of one F32 tensor of `mib` MiB of zeros (a sparse file), at `<root>/<name>`.
fn write_zeros_model(root: &std::path::Path, name: &str, mib: u64) {
    write_sparse_model(root, name, mib << 18);
}

/// A model of one F32 tensor of `elems` zeros (a sparse file: nothing is written or read),
/// at `<root>/<name>`.
fn write_sparse_model(root: &std::path::Path, name: &str, elems: u64) {
    let header = format!(
        r#"{{"w":{{"dtype":"F32","shape":[{elems}],"data_offsets":[0,{}]}}}}"#,
        elems * 4
    );
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let path = dir.join("model.safetensors");
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    std::fs::write(&path, &bytes).expect("write header");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    f.set_len(bytes.len() as u64 + elems * 4)
        .expect("sparse length");
}

/// A fake `/proc` and cgroup tree for `--proc-root`: 10 GiB `MemAvailable`, and this
/// process's cgroup (`version` 1 or 2) limited to `limit_mib` with `usage_mib` in use.
fn fake_proc_root(version: u8, limit_mib: u64, usage_mib: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let write = |path: &str, text: String| {
        let path = p.join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    };
    write(
        "proc/meminfo",
        "MemTotal: 20971520 kB\nMemFree: 10485760 kB\nMemAvailable: 10485760 kB\n".into(),
    );
    let (limit, usage) = ((limit_mib << 20).to_string(), (usage_mib << 20).to_string());
    if version == 2 {
        write(
            "proc/self/cgroup",
            "0::/system.slice/modelshare.service\n".into(),
        );
        let cg = "sys/fs/cgroup/system.slice/modelshare.service";
        write(&format!("{cg}/memory.max"), limit);
        write(&format!("{cg}/memory.current"), usage);
    } else {
        write(
            "proc/self/cgroup",
            "7:cpu,cpuacct:/docker/c0ffee\n5:memory:/docker/c0ffee\n1:name=systemd:/docker/c0ffee\n"
                .into(),
        );
        let cg = "sys/fs/cgroup/memory/docker/c0ffee";
        write(&format!("{cg}/memory.limit_in_bytes"), limit);
        write(&format!("{cg}/memory.usage_in_bytes"), usage);
    }
    dir
}

/// Plays the kernel's part for a fake v2 cgroup: every 2 ms writes the bytes of the memfds
/// (arenas) process `pid` holds to `current` (`memory.current`), until dropped.
struct Charging {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Charging {
    fn start(pid: u32, current: std::path::PathBuf) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let tmp = current.with_extension("tmp");
            while !stopped.load(Ordering::Relaxed) {
                let bytes: u64 = std::fs::read_dir(format!("/proc/{pid}/fd"))
                    .map(|dir| {
                        dir.filter_map(Result::ok)
                            .filter(|e| {
                                std::fs::read_link(e.path())
                                    .is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:"))
                            })
                            .filter_map(|e| std::fs::metadata(e.path()).ok())
                            .map(|m| m.len())
                            .sum()
                    })
                    .unwrap_or(0);
                // Replaced whole, so the server never reads half a figure.
                if std::fs::write(&tmp, bytes.to_string()).is_ok() {
                    let _ = std::fs::rename(&tmp, &current);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Charging {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Two 64 MiB loads at once against a 100 MiB cgroup limit (10 GiB `MemAvailable`), the
/// cgroup charged with the server's arenas as the kernel would: exactly one is admitted, the
/// other refused RESOURCE_EXHAUSTED naming the cgroup (and, when it came while the first was
/// loading, the bytes that load reserved); once the first is unloaded the refused model loads.
/// Fails if admission reads `MemAvailable` only or does not count loads in progress (both
/// were admitted: two 12.9 GiB loads with 21.5 GiB available).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_loads_are_admitted_against_memory_less_loads_in_progress() {
    let fake = fake_proc_root(2, 100, 0);
    let server = Server::start_with(
        &[
            "--proc-root",
            fake.path().to_str().expect("utf8"),
            "--max-concurrent-loads",
            "4",
        ],
        |root| {
            write_zeros_model(root, "a", 64);
            write_zeros_model(root, "b", 64);
        },
    )
    .await;
    let _charging = Charging::start(
        server.pid(),
        fake.path()
            .join("sys/fs/cgroup/system.slice/modelshare.service/memory.current"),
    );
    let (mut a, mut b) = (server.admin().await, server.admin().await);
    let (ra, rb) = tokio::join!(
        common::load(&mut a, "a", "a"),
        common::load(&mut b, "b", "b")
    );
    let (refused, err, loaded) = match (ra, rb) {
        (Ok(_), Err(e)) => ("b", e, "a"),
        (Err(e), Ok(_)) => ("a", e, "b"),
        (ra, rb) => panic!("expected exactly one admitted, got a: {ra:?}, b: {rb:?}"),
    };
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("cgroup memory limit"),
        "{}",
        err.message()
    );
    assert_eq!(
        common::stats(&mut a).await.models,
        1,
        "only {loaded} is loaded"
    );
    a.unload_model(pb::UnloadModelRequest {
        name: loaded.into(),
        version: 0,
        ..Default::default()
    })
    .await
    .expect("unload");
    let pid = server.pid();
    common::eventually(Duration::from_secs(5), "the arena freed", || async {
        common::memfd_fds(pid) == 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    common::load(&mut a, refused, refused)
        .await
        .expect("admitted once the first load's memory is back");
}

/// A cgroup memory limit below `MemAvailable` bounds admission, v2 (`memory.max` less
/// `memory.current`) and v1 (`memory.limit_in_bytes` less `memory.usage_in_bytes`): with
/// 100 MiB limit and 50 MiB used, a 64 MiB model is refused naming 50 MiB free, a 16 MiB one
/// loads. Fails if admission reads `MemAvailable` only (a 5 GiB model was admitted in a 3 GiB
/// cgroup and the server OOM-killed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cgroup_memory_limit_below_mem_available_is_honoured_v1_and_v2() {
    for version in [2, 1] {
        let fake = fake_proc_root(version, 100, 50);
        let server = Server::start_with(
            &["--proc-root", fake.path().to_str().expect("utf8")],
            |root| {
                write_zeros_model(root, "big", 64);
                write_zeros_model(root, "small", 16);
            },
        )
        .await;
        let mut admin = server.admin().await;
        let err = common::load(&mut admin, "big", "big")
            .await
            .expect_err("no room under the cgroup limit");
        assert_eq!(
            err.code(),
            tonic::Code::ResourceExhausted,
            "v{version}: {err:?}"
        );
        assert!(
            err.message().contains(&format!("{} bytes", 50u64 << 20))
                && err.message().contains("cgroup"),
            "v{version}: {}",
            err.message()
        );
        common::load(&mut admin, "small", "small")
            .await
            .unwrap_or_else(|e| panic!("v{version}: 16 MiB fits in 50 MiB: {e:?}"));
    }
}

/// A model larger than the host's available memory (a sparse file: nothing is read) is refused
/// before anything is allocated, with how much it needs and how much is free. Fails if the
/// server accepts it (and would die writing it), or creates a version record for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_larger_than_free_memory_is_refused_before_allocating() {
    let server = Server::start().await;
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("MemTotal");
    // Twice the machine's memory, in one F32 tensor.
    let elems = total_kib * 1024 * 2 / 4;
    write_sparse_model(&server.root, "huge", elems);

    let mut admin = server.admin().await;
    let err = common::load(&mut admin, "huge", "huge")
        .await
        .expect_err("no room");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("host memory (MemAvailable)") && err.message().contains("free now"),
        "{}",
        err.message()
    );
    let s = common::stats(&mut admin).await;
    assert_eq!((s.arenas, s.models), (0, 0));
}

/// A load of bytes the server holds already needs no room of its own: against a 100 MiB
/// cgroup limit charged with the server's arenas, a second 64 MiB model of the same bytes
/// loads (into the first one's memory), where a third of the same layout with one byte
/// different is refused RESOURCE_EXHAUSTED like any copy that does not fit. Fails if a
/// shared load reserves memory (the second is refused) or a load that turns out to differ
/// skips admission (the third loads past the limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_of_bytes_already_held_needs_no_room() {
    let fake = fake_proc_root(2, 100, 0);
    let server = Server::start_with(
        &["--proc-root", fake.path().to_str().expect("utf8")],
        |root| {
            write_zeros_model(root, "a", 64);
            write_zeros_model(root, "b", 64);
            write_zeros_model(root, "c", 64);
            let path = root.join("c/model.safetensors");
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .expect("open");
            // In the middle: past the sample taken at admission, so the load reserves its
            // memory only once the comparison finds the difference.
            let len = f.metadata().expect("len").len();
            std::os::unix::fs::FileExt::write_all_at(&f, &[1], len - (32 << 20)).expect("one byte");
        },
    )
    .await;
    let _charging = Charging::start(
        server.pid(),
        fake.path()
            .join("sys/fs/cgroup/system.slice/modelshare.service/memory.current"),
    );
    let mut admin = server.admin().await;
    common::load(&mut admin, "a", "a").await.expect("a fits");
    // The charge follows the arena (the thread's next pass).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let b = common::load(&mut admin, "b", "b")
        .await
        .expect("b shares a's memory: no room needed");
    assert!(b.shares_memory, "{b:?}");
    let err = common::load(&mut admin, "c", "c")
        .await
        .expect_err("c differs, and a copy does not fit");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert_eq!(common::memfd_fds(server.pid()), 1);
}
