//! Loading real safetensors models and reading them back the way a worker does.

use std::time::Duration;

use modelshare_proto::v1 as pb;
use safetensors::{Dtype, SafeTensors};

use crate::common::{self, Server, T, t};

/// Every tensor of `files` (parsed by the official crate) must equal the bytes a worker sees
/// through its read-only mapping, and match the manifest's checksum.
async fn assert_worker_sees(server: &Server, model: &str, files: &[std::path::PathBuf]) {
    let session = modelshare_worker::Session::open(&server.address, "verifier")
        .await
        .expect("session");
    let attached = session.attach(model).await.expect("attach");
    let mut seen = 0;
    for f in files {
        let bytes = std::fs::read(f).expect("read file");
        let st = SafeTensors::deserialize(&bytes).expect("official parser");
        for (name, view) in st.tensors() {
            let tensor = attached.tensor(&name).expect("tensor in manifest");
            assert_eq!(tensor.bytes(), view.data(), "bytes of '{name}' differ");
            let shape: Vec<u64> = view.shape().iter().map(|d| *d as u64).collect();
            assert_eq!(tensor.shape(), shape.as_slice(), "shape of '{name}'");
            assert!(tensor.verify(), "checksum of '{name}' does not match");
            assert_eq!(tensor.offset() % 256, 0, "offset of '{name}' not aligned");
            seen += 1;
        }
    }
    assert_eq!(
        seen,
        attached.manifest().tensors.len(),
        "manifest has extra tensors"
    );
    attached.release().await.expect("release");
}

fn all_dtypes() -> Vec<T> {
    vec![
        t("embed.weight", Dtype::F32, &[97, 33], 1),
        t("layers.0.wq", Dtype::F16, &[64, 65], 2),
        t("layers.0.wk", Dtype::BF16, &[31, 64], 3),
        t("position_ids", Dtype::I64, &[1, 77], 4),
        t("tokens", Dtype::U8, &[1001], 5),
        t("mask", Dtype::BOOL, &[3, 5], 6),
        t("counts", Dtype::I32, &[7], 7),
        t("double", Dtype::F64, &[2, 2], 8),
        t("scalar", Dtype::F32, &[], 9),
        t("empty", Dtype::F32, &[0, 4], 10),
    ]
}

/// A single-file model of every common dtype must arrive byte-exact in the worker's mapping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_file_every_dtype_round_trips() {
    let server = Server::start().await;
    let dir = server.root.join("tiny");
    common::write_safetensors(&dir.join("model.safetensors"), &all_dtypes());
    std::fs::write(dir.join("config.json"), br#"{"hidden_size": 64}"#).expect("config");
    std::fs::write(dir.join("tokenizer.json"), br#"{"vocab": {}}"#).expect("tokenizer");
    let mut admin = server.admin().await;
    let v = common::load(&mut admin, "tiny", "tiny")
        .await
        .expect("load");
    assert_eq!(v.version, 1);
    assert_eq!(v.state, pb::VersionState::Ready as i32);
    assert_eq!(v.tensor_count, 10);

    let d = admin
        .describe_model(pb::DescribeModelRequest {
            name: "tiny".into(),
            version: 0,
        })
        .await
        .expect("describe")
        .into_inner();
    let m = d.manifest.expect("manifest");
    let wk = m
        .tensors
        .iter()
        .find(|t| t.name == "layers.0.wk")
        .expect("wk");
    assert_eq!(wk.dtype, pb::DType::DtypeBf16 as i32);
    assert_eq!(wk.shape, vec![31, 64]);
    assert_eq!(wk.byte_length, 31 * 64 * 2);
    assert_eq!(
        m.header_metadata.get("format").map(String::as_str),
        Some("pt")
    );
    let files: Vec<&str> = m.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(files, ["config.json", "tokenizer.json"]);

    assert_worker_sees(&server, "tiny", &[dir.join("model.safetensors")]).await;
    let session = modelshare_worker::Session::open(&server.address, "meta")
        .await
        .expect("session");
    let model = session.attach("tiny").await.expect("attach");
    assert_eq!(
        model.metadata("config.json").as_deref(),
        Some(&br#"{"hidden_size": 64}"#[..])
    );
}

/// A sharded model (index + 3 shards) must load as one arena holding every shard's tensors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_model_round_trips() {
    let server = Server::start().await;
    let dir = server.root.join("sharded");
    let all = all_dtypes();
    let shards = vec![all[..3].to_vec(), all[3..7].to_vec(), all[7..].to_vec()];
    common::write_sharded(&dir, &shards);
    let mut admin = server.admin().await;
    let v = common::load(&mut admin, "sharded", "sharded")
        .await
        .expect("load");
    assert_eq!(v.tensor_count, 10);
    let stats = common::stats(&mut admin).await;
    assert_eq!(
        stats.arenas, 1,
        "one arena per version, however many shards"
    );
    assert_eq!(stats.arena_bytes, v.arena_bytes);
    let files: Vec<_> = (1..=3)
        .map(|i| dir.join(format!("model-{i:05}-of-00003.safetensors")))
        .collect();
    assert_worker_sees(&server, "sharded", &files).await;
}

/// A single `.safetensors` file may be named directly instead of its directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_path_loads_too() {
    let server = Server::start().await;
    let file = server.root.join("loose/weights.safetensors");
    common::write_safetensors(&file, &all_dtypes()[..3]);
    let mut admin = server.admin().await;
    common::load(&mut admin, "loose", "loose/weights.safetensors")
        .await
        .expect("load");
    assert_worker_sees(&server, "loose", &[file]).await;
}

/// Loads of different models must run at once, and both come out intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_loads_of_different_models() {
    let server = Server::start().await;
    for (i, name) in ["alpha", "beta", "gamma"].iter().enumerate() {
        let tensors: Vec<T> = (0..8)
            .map(|k| {
                t(
                    &format!("w{k}"),
                    Dtype::F32,
                    &[256, 1024],
                    (i * 100 + k) as u64,
                )
            })
            .collect();
        common::write_safetensors(&server.root.join(name).join("model.safetensors"), &tensors);
    }
    let mut handles = Vec::new();
    for name in ["alpha", "beta", "gamma"] {
        let mut admin = server.admin().await;
        handles.push(tokio::spawn(async move {
            common::load(&mut admin, name, name).await
        }));
    }
    for h in handles {
        let v = h.await.expect("join").expect("load");
        assert_eq!(v.state, pb::VersionState::Ready as i32);
    }
    let mut admin = server.admin().await;
    let stats = common::stats(&mut admin).await;
    assert_eq!(stats.arenas, 3);
    assert_eq!(stats.models, 3);
    for name in ["alpha", "beta", "gamma"] {
        assert_worker_sees(
            &server,
            name,
            &[server.root.join(name).join("model.safetensors")],
        )
        .await;
    }
}

/// Loading a name again makes a new latest version; a worker on v1 keeps working while v2
/// loads, and v1 is freed when its last lease goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_version_retires_the_old_one_after_its_last_lease() {
    let server = Server::start().await;
    common::write_safetensors(
        &server.root.join("v1/model.safetensors"),
        &[t("w", Dtype::F32, &[8], 1)],
    );
    let big: Vec<T> = (0..8)
        .map(|k| {
            t(
                &format!("w{}", if k == 0 { String::new() } else { k.to_string() }),
                Dtype::F32,
                &[if k == 0 { 8 } else { 1 << 20 }],
                2 + k,
            )
        })
        .collect();
    common::write_safetensors(&server.root.join("v2/model.safetensors"), &big);
    let mut admin = server.admin().await;
    assert_eq!(
        common::load(&mut admin, "m", "v1")
            .await
            .expect("v1")
            .version,
        1
    );
    let session = modelshare_worker::Session::open(&server.address, "w")
        .await
        .expect("session");
    let mut events = session.subscribe();
    let v1 = session.attach("m").await.expect("attach v1");
    let w1 = v1.tensor("w").expect("w");

    // v2 loads while the worker reads v1.
    let mut loader = admin.clone();
    let load = tokio::spawn(async move { common::load(&mut loader, "m", "v2").await });
    for _ in 0..50 {
        assert_eq!(w1.bytes(), common::random_bytes(1, 32));
    }
    assert_eq!(load.await.expect("join").expect("v2").version, 2);
    assert_eq!(
        events.recv().await.expect("event"),
        modelshare_worker::SessionEvent::VersionReady {
            model: "m".into(),
            version: 2
        }
    );
    assert_eq!(
        events.recv().await.expect("event"),
        modelshare_worker::SessionEvent::VersionDraining {
            model: "m".into(),
            version: 1
        }
    );
    let d = admin
        .describe_model(pb::DescribeModelRequest {
            name: "m".into(),
            version: 0,
        })
        .await
        .expect("describe")
        .into_inner();
    let states: Vec<(u32, i32)> = d
        .model
        .expect("model")
        .versions
        .iter()
        .map(|v| (v.version, v.state))
        .collect();
    assert_eq!(
        states,
        [
            (1, pb::VersionState::Draining as i32),
            (2, pb::VersionState::Ready as i32)
        ]
    );
    // The worker on v1 still reads v1; a new attach gets v2.
    assert_eq!(w1.bytes(), common::random_bytes(1, 32));
    let latest = session.attach("m").await.expect("latest");
    assert_eq!(latest.version(), 2);
    assert_eq!(
        latest.tensor("w").expect("w").bytes(),
        common::random_bytes(2, 32)
    );
    // The last lease on v1 goes: v1 is freed.
    drop(w1);
    v1.release().await.expect("release");
    let s = common::stats(&mut admin).await;
    assert_eq!(s.arenas, 1, "only v2 is held");
    assert_eq!(s.arena_bytes, latest.manifest().arena_bytes);
}

/// With keep_previous, an older version stays ready and attachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_previous_keeps_the_old_version() {
    let server = Server::start().await;
    common::write_safetensors(
        &server.root.join("v1/model.safetensors"),
        &[t("w", Dtype::F32, &[8], 1)],
    );
    common::write_safetensors(
        &server.root.join("v2/model.safetensors"),
        &[t("w", Dtype::F32, &[8], 2)],
    );
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "v1").await.expect("v1");
    let mut stream = admin
        .load_model(pb::LoadModelRequest {
            name: "m".into(),
            path: "v2".into(),
            keep_previous: true,
            ..Default::default()
        })
        .await
        .expect("load")
        .into_inner();
    while stream.message().await.expect("stream").is_some() {}
    let session = modelshare_worker::Session::open(&server.address, "w")
        .await
        .expect("session");
    assert_eq!(session.attach("m").await.expect("latest").version(), 2);
    let old = session.attach_version("m", 1).await.expect("v1");
    let tensor = old.tensor("w").expect("w");
    let w: &[f32] = tensor.as_slice::<f32>().expect("f32");
    assert_eq!(bytemuck_bytes(w), common::random_bytes(1, 32));
    assert!(
        old.tensor("w").expect("w").as_slice::<half::f16>().is_err(),
        "wrong dtype accepted"
    );
}

fn bytemuck_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The progress stream must report bytes monotonically and end with the ready version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_progress_is_streamed() {
    let server = Server::start().await;
    let tensors: Vec<T> = (0..16)
        .map(|k| t(&format!("w{k}"), Dtype::F32, &[1024, 1024], k))
        .collect();
    common::write_safetensors(&server.root.join("big/model.safetensors"), &tensors);
    let mut admin = server.admin().await;
    let mut stream = admin
        .load_model(pb::LoadModelRequest {
            name: "big".into(),
            path: "big".into(),
            ..Default::default()
        })
        .await
        .expect("load")
        .into_inner();
    let mut total = 0;
    let mut last = 0;
    let mut done = None;
    while let Some(msg) = stream.message().await.expect("stream") {
        match msg.event.expect("event") {
            pb::load_model_progress::Event::Started(s) => total = s.bytes_total,
            pb::load_model_progress::Event::Progress(p) => {
                assert!(p.bytes_done >= last, "progress went backwards");
                assert_eq!(p.bytes_total, total);
                last = p.bytes_done;
            }
            pb::load_model_progress::Event::Done(v) => done = Some(v),
        }
    }
    assert_eq!(total, 16 << 22);
    let v = done.expect("done");
    assert_eq!(v.bytes_loaded, total);
}

/// The worker's view must be a shared, read-only mapping of the server's memfd, not a copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_mapping_is_shared_and_read_only() {
    let server = Server::start().await;
    common::write_safetensors(
        &server.root.join("shared/model.safetensors"),
        &[t("w", Dtype::F32, &[512, 1024], 3)],
    );
    let mut admin = server.admin().await;
    common::load(&mut admin, "shared", "shared")
        .await
        .expect("load");
    let session = modelshare_worker::Session::open(&server.address, "w")
        .await
        .expect("session");
    let model = session.attach("shared").await.expect("attach");
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    let line = maps
        .lines()
        .find(|l| l.contains("memfd:modelshare:shared@1"))
        .unwrap_or_else(|| panic!("no memfd mapping of the model in /proc/self/maps:\n{maps}"));
    let perms = line.split_whitespace().nth(1).expect("perms");
    assert_eq!(
        perms, "r--s",
        "mapping must be read-only and shared: {line}"
    );
    drop(model);
    tokio::time::sleep(Duration::from_millis(10)).await;
}

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
