//! The `modelshare` admin commands, run as the real binary against a real server: what they
//! print (tables and JSON), and how they fail.

use std::process::{Command, Output, Stdio};

use safetensors::Dtype;
use serde_json::Value;

use crate::common::{self, BIN, Server, T, t, write_safetensors};

/// The two tensors of the model the CLI tests load.
fn tensors() -> Vec<T> {
    vec![
        t("encoder.weight", Dtype::F32, &[8, 4], 11),
        t("encoder.norm", Dtype::BF16, &[5], 12),
    ]
}

/// A server with the test model at `tiny/model.safetensors`.
async fn server() -> Server {
    Server::start_with(&[], |root| {
        write_safetensors(&root.join("tiny/model.safetensors"), &tensors());
    })
    .await
}

/// Runs `modelshare --server <address> <args>` to its end, off the async threads.
async fn cli(address: &str, args: &[&str]) -> Output {
    let address = address.to_owned();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .arg("--server")
            .arg(&address)
            .args(&args)
            .env_remove("MODELSHARE_SERVER")
            .stdin(Stdio::null())
            .output()
            .expect("run modelshare")
    })
    .await
    .expect("join")
}

/// Runs a command that must succeed; its stdout.
async fn ok(address: &str, args: &[&str]) -> String {
    let out = cli(address, args).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "modelshare {args:?} failed with {}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    stdout
}

/// Runs a command with `--output json`; its one JSON document.
async fn json(address: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let stdout = ok(address, &all).await;
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("modelshare {args:?} --output json printed non-JSON ({e}): {stdout}")
    })
}

/// Runs a command that must fail; its stderr, checked for a panic.
async fn fails(address: &str, args: &[&str]) -> String {
    let out = cli(address, args).await;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "modelshare {args:?} succeeded; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        !stderr.contains("panicked"),
        "modelshare {args:?} panicked: {stderr}"
    );
    stderr
}

/// `load` would not say which version it made, or not wait for the load to finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_prints_the_new_version() {
    let server = server().await;
    let out = ok(&server.address, &["load", "tiny", "tiny"]).await;
    assert!(out.starts_with("loaded tiny v1"), "{out}");
    assert!(out.contains("2 tensors"), "{out}");
    assert!(out.contains("(ready)"), "{out}");
    let out = ok(&server.address, &["load", "tiny", "tiny"]).await;
    assert!(out.starts_with("loaded tiny v2"), "{out}");

    let v = json(&server.address, &["load", "other", "tiny"]).await;
    assert_eq!(v["model"], "other", "{v}");
    assert_eq!(v["version"]["version"], 1, "{v}");
    assert_eq!(v["version"]["state"], "ready", "{v}");
}

/// `ls` would not show a loaded model and its state, as a table or as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_shows_the_model_ready() {
    let server = server().await;
    let empty = ok(&server.address, &["ls"]).await;
    assert!(empty.contains("no models loaded"), "{empty}");
    let v = json(&server.address, &["ls"]).await;
    assert_eq!(v["models"], serde_json::json!([]), "{v}");

    ok(&server.address, &["load", "tiny", "tiny"]).await;
    let table = ok(&server.address, &["ls"]).await;
    let row = table
        .lines()
        .find(|l| l.contains("tiny") && l.contains("ready"))
        .unwrap_or_else(|| panic!("no row with tiny and ready in:\n{table}"));
    assert!(
        row.contains("1*"),
        "the latest ready version is not marked: {row}"
    );

    let v = json(&server.address, &["ls"]).await;
    let models = v["models"].as_array().expect("models array");
    assert_eq!(models.len(), 1, "{v}");
    assert_eq!(models[0]["name"], "tiny", "{v}");
    assert_eq!(models[0]["latest_ready"], 1, "{v}");
    assert_eq!(models[0]["versions"][0]["state"], "ready", "{v}");
    assert_eq!(models[0]["versions"][0]["tensor_count"], 2, "{v}");
    assert_eq!(models[0]["versions"][0]["source"], "tiny", "{v}");
}

/// `describe` would not list the tensors with their names and dtypes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_lists_tensors_and_dtypes() {
    let server = server().await;
    ok(&server.address, &["load", "tiny", "tiny"]).await;
    let out = ok(&server.address, &["describe", "tiny"]).await;
    for needle in [
        "encoder.weight",
        "encoder.norm",
        "F32",
        "BF16",
        "[8, 4]",
        "[5]",
    ] {
        assert!(out.contains(needle), "describe lacks {needle:?}:\n{out}");
    }
    let out = ok(&server.address, &["describe", "tiny", "--version", "1"]).await;
    assert!(out.contains("encoder.weight"), "{out}");
}

/// `describe --output json` would report wrong shapes, unaligned offsets or bad checksums.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_json_has_shape_offset_and_checksum() {
    let server = server().await;
    ok(&server.address, &["load", "tiny", "tiny"]).await;
    let v = json(&server.address, &["describe", "tiny"]).await;
    let manifest = &v["manifest"];
    assert_eq!(manifest["model"], "tiny", "{v}");
    assert_eq!(manifest["version"], 1, "{v}");
    assert_eq!(manifest["alignment"], 256, "{v}");
    let listed = manifest["tensors"].as_array().expect("tensors array");
    let want = tensors();
    assert_eq!(listed.len(), want.len(), "{v}");
    for w in &want {
        let got = listed
            .iter()
            .find(|x| x["name"] == w.name.as_str())
            .unwrap_or_else(|| panic!("tensor {} missing: {v}", w.name));
        let shape: Vec<u64> = serde_json::from_value(got["shape"].clone()).expect("shape");
        let want_shape: Vec<u64> = w.shape.iter().map(|&d| d as u64).collect();
        assert_eq!(shape, want_shape, "{got}");
        let offset = got["offset"].as_u64().expect("offset");
        assert_eq!(offset % 256, 0, "offset not aligned: {got}");
        assert_eq!(got["byte_length"], w.data.len() as u64, "{got}");
        let xxh3 = got["xxh3"].as_str().expect("xxh3 string");
        assert_eq!(xxh3.len(), 16, "{got}");
        assert!(xxh3.chars().all(|c| c.is_ascii_hexdigit()), "{got}");
        let expected = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&w.data));
        assert_eq!(xxh3, expected, "checksum of {}", w.name);
    }
    let dtypes: Vec<&str> = listed.iter().filter_map(|x| x["dtype"].as_str()).collect();
    assert!(
        dtypes.contains(&"F32") && dtypes.contains(&"BF16"),
        "{dtypes:?}"
    );
}

/// `stats` would not account for a loaded arena, or not release it on `unload`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_follow_load_and_unload() {
    let server = server().await;
    let v = json(&server.address, &["stats"]).await;
    assert_eq!(v["arena_bytes"], 0, "{v}");
    assert_eq!(v["device"]["backend"], "host", "{v}");

    ok(&server.address, &["load", "tiny", "tiny"]).await;
    let v = json(&server.address, &["stats"]).await;
    assert!(v["arena_bytes"].as_u64().expect("arena_bytes") > 0, "{v}");
    assert_eq!(v["arenas"], 1, "{v}");
    assert_eq!(v["versions_by_state"]["ready"], 1, "{v}");

    let table = ok(&server.address, &["stats"]).await;
    assert!(table.contains("arena bytes"), "{table}");

    let u = json(&server.address, &["unload", "tiny"]).await;
    assert_eq!(u["versions"][0]["state"], "freed", "{u}");
    let v = json(&server.address, &["stats"]).await;
    assert_eq!(v["arena_bytes"], 0, "{v}");
    assert_eq!(v["arenas"], 0, "{v}");
}

/// On a server of several devices, `load --replicas` and `--devices` say where the version
/// went, `ls` lists each version's devices, and `stats` shows every device with what it holds
/// instead of the first one only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_and_stats_name_every_device() {
    let server = Server::start_with(&["--host-devices", "2"], |root| {
        write_safetensors(&root.join("tiny/model.safetensors"), &tensors());
    })
    .await;
    let loaded = ok(
        &server.address,
        &["load", "tiny", "tiny", "--replicas", "2"],
    )
    .await;
    assert!(loaded.contains("on host, host-1"), "{loaded}");
    let stderr = fails(
        &server.address,
        &["load", "other", "tiny", "--devices", "5"],
    )
    .await;
    assert!(stderr.contains("0=host, 1=host-1"), "{stderr}");

    let listed = ok(&server.address, &["ls"]).await;
    assert!(
        listed.contains("DEVICES") && listed.contains("host, host-1"),
        "{listed}"
    );
    let table = ok(&server.address, &["stats"]).await;
    assert!(table.contains("2 (host; each below)"), "{table}");
    assert!(
        !table.contains("device total"),
        "only the first device's: {table}"
    );
    for row in ["host (host memory)", "host-1 (host memory (host-1))"] {
        assert!(table.contains(row), "no row for {row}: {table}");
    }
    let v = json(&server.address, &["stats"]).await;
    let devices = v["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 2, "{v}");
    for d in devices {
        assert_eq!(d["arenas"], 1, "one replica each: {v}");
        // Host memory: its use is what the arenas hold.
        assert!(d["arena_bytes"].as_u64() > Some(0), "{v}");
        assert_eq!(d["used_bytes"], d["arena_bytes"], "{v}");
    }
    // `all` with another count of replicas: which was meant?
    let stderr = fails(
        &server.address,
        &[
            "load",
            "other",
            "tiny",
            "--devices",
            "all",
            "--replicas",
            "1",
        ],
    )
    .await;
    assert!(stderr.contains("devices 'all'"), "{stderr}");
    // Freed, the version is on no device any more.
    let u = json(&server.address, &["unload", "tiny"]).await;
    assert_eq!(u["versions"][0]["state"], "freed", "{u}");
    assert_eq!(u["versions"][0]["devices"], serde_json::json!([]), "{u}");
}

/// `unload --version` would unload the wrong version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unload_one_version_keeps_the_other() {
    let server = server().await;
    ok(&server.address, &["load", "tiny", "tiny"]).await;
    ok(&server.address, &["load", "tiny", "tiny"]).await;
    let u = json(&server.address, &["unload", "tiny", "--version", "1"]).await;
    let versions = u["versions"].as_array().expect("versions");
    assert_eq!(versions.len(), 1, "{u}");
    assert_eq!(versions[0]["version"], 1, "{u}");
    assert_eq!(versions[0]["state"], "freed", "{u}");
    let v = json(&server.address, &["describe", "tiny"]).await;
    assert_eq!(v["model"]["latest_ready"], 2, "{v}");
}

/// `ps` would fail or invent sessions when no worker is connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ps_shows_no_sessions() {
    let server = server().await;
    let v = json(&server.address, &["ps"]).await;
    assert_eq!(v["sessions"], serde_json::json!([]), "{v}");
    let table = ok(&server.address, &["ps"]).await;
    assert!(table.contains("no sessions"), "{table}");
}

/// Failed commands would exit 0, or hide the server's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_exit_non_zero_with_the_reason() {
    let server = server().await;

    let err = fails(&server.address, &["describe", "nope"]).await;
    assert!(err.contains("not found"), "{err}");
    assert!(err.contains("'nope'"), "{err}");

    let err = fails(&server.address, &["unload", "nope"]).await;
    assert!(err.contains("not found"), "{err}");

    let err = fails(&server.address, &["load", "bad", "../x"]).await;
    assert!(err.contains("'..'"), "{err}");
    assert!(err.contains("InvalidArgument"), "{err}");

    let err = fails(&server.address, &["load", "Bad/infer", "tiny"]).await;
    assert!(err.contains("model name 'Bad/infer'"), "{err}");

    let err = fails(&server.address, &["load", "gone", "no/such"]).await;
    assert!(err.contains("does not exist"), "{err}");
    assert!(err.contains("NotFound"), "{err}");

    // Nothing was loaded by any of them.
    let v = json(&server.address, &["ls"]).await;
    assert_eq!(v["models"], serde_json::json!([]), "{v}");
}

/// A server that is not there would make the CLI panic or hang instead of saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_socket_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("nobody-listens.sock");
    let address = format!("unix:{}", socket.display());
    for args in [
        &["ls"][..],
        &["stats", "--output", "json"],
        &["load", "x", "y"],
    ] {
        let err = fails(&address, args).await;
        assert!(err.contains("cannot connect"), "{args:?}: {err}");
        assert!(
            err.contains(&socket.display().to_string()),
            "{args:?}: the message does not name the socket: {err}"
        );
    }
    // Over TCP, each cause once (tonic's transport errors repeat their sources' texts).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = format!("http://{}", listener.local_addr().expect("addr"));
    drop(listener);
    let err = fails(&address, &["ls"]).await;
    assert!(
        err.contains("cannot connect") && err.contains("refused"),
        "{err}"
    );
    let parts: Vec<&str> = err.trim().split(": ").collect();
    for (i, p) in parts.iter().enumerate().skip(1) {
        assert_ne!(Some(p), parts.get(i + 1), "a cause printed twice: {err}");
    }
}

/// The README's main-job command must start a server, run workers that verify the model, and
/// show that the model's memory is held once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_workers_on_one_arena() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(crate::common::BIN)
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "3",
            "--exit-after-ready",
            "--dir",
        ])
        .arg(dir.path())
        .output()
        .expect("run demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("loaded:         tiny-demo v1"), "{stdout}");
    assert_eq!(stdout.matches("checksums ok").count(), 3, "{stdout}");
    assert!(
        stdout.contains("3 workers, 3 leases, 1 arena(s)")
            && stdout.contains("1 distinct memfd(s) mapped"),
        "{stdout}"
    );
    assert!(!dir.path().join("grpc.sock").exists(), "socket left behind");

    // Without --dir: its own temporary directory goes at the end, and the terminal holds the
    // summary, not the server's log.
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(crate::common::BIN)
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "2",
            "--exit-after-ready",
        ])
        .env("TMPDIR", tmp.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("run demo");
    assert!(out.status.success());
    let left: Vec<_> = std::fs::read_dir(tmp.path()).expect("tmp").collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains(" INFO "), "{stderr}");
}

/// The tenant workflow from the CLI alone: make tokens, write their hashes, then load for a
/// tenant, share, list with owners, reload, and see per-tenant usage; tokens from files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_workflow_from_the_cli() {
    let keys = tempfile::tempdir().expect("tmp");
    let (hashes, files) = make_token_files(keys.path()).await;
    let tenants = write_tenants_file(keys.path(), &hashes);
    let server = Server::start_with(
        &["--tenants-file", tenants.to_str().expect("utf-8")],
        |root| {
            write_safetensors(&root.join("tiny/model.safetensors"), &tensors());
        },
    )
    .await;
    let addr = server.address.as_str();
    let (admin, a, b) = (&files[0], &files[1], &files[2]);

    load_for_a_and_share_with_b(addr, admin, a, b).await;
    reload_and_stats_as_the_admin(addr, admin, a).await;
    // No token reaches the server's log.
    let log = server.log();
    for f in &files {
        let token = std::fs::read_to_string(f).expect("read");
        assert!(!log.contains(token.trim()), "a token is in the log");
    }
}

/// Makes a token each for the admin, a and b with `token new`, checks `token hash` gives the
/// same hash from stdin, and writes each token to `<who>.token` under `keys`. Returns the
/// hashes and the token files, in that order.
async fn make_token_files(keys: &std::path::Path) -> (Vec<String>, Vec<String>) {
    let mut hashes = Vec::new();
    let mut files = Vec::new();
    for who in ["admin", "a", "b"] {
        let made = json("unix:/nonexistent", &["token", "new"]).await;
        let token = made["token"].as_str().expect("token").to_owned();
        let hash = made["hash"].as_str().expect("hash").to_owned();
        // `token hash` gives the same hash from stdin.
        let mut child = Command::new(BIN)
            .args(["token", "hash"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("token hash");
        use std::io::Write;
        writeln!(child.stdin.take().expect("stdin"), "{token}").expect("write");
        let out = child.wait_with_output().expect("wait");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), hash);
        let file = keys.join(format!("{who}.token"));
        std::fs::write(&file, format!("{token}\n")).expect("token file");
        files.push(file.display().to_string());
        hashes.push(hash);
    }
    (hashes, files)
}

/// Writes `tenants.toml` under `keys`: the admin, a (leases quota 7, generation caps of 512
/// tokens and 1 stop string) and b, by their `hashes`.
fn write_tenants_file(keys: &std::path::Path, hashes: &[String]) -> std::path::PathBuf {
    let tenants = keys.join("tenants.toml");
    std::fs::write(
        &tenants,
        format!(
            "[admin]\ntoken_hashes = [\"{}\"]\n[[tenants]]\nname = \"a\"\ntoken_hashes = [\"{}\"]\n[tenants.quota]\nleases = 7\nmax_tokens = 512\nstop_strings = 1\n[[tenants]]\nname = \"b\"\ntoken_hashes = [\"{}\"]\n",
            hashes[0], hashes[1], hashes[2]
        ),
    )
    .expect("tenants file");
    tenants
}

/// With the token files `admin`, `a` and `b`: no token is refused; the admin loads `tiny` for
/// a; b does not see it, nor may change its access; a shares it with b, who then sees it; the
/// admin's table shows the owner and the sharing.
async fn load_for_a_and_share_with_b(addr: &str, admin: &str, a: &str, b: &str) {
    let err = fails(addr, &["ls"]).await;
    assert!(err.to_lowercase().contains("unauthenticated"), "{err}");
    ok(
        addr,
        &[
            "--token-file",
            admin,
            "load",
            "tiny",
            "tiny",
            "--tenant",
            "a",
        ],
    )
    .await;
    let hidden = json(addr, &["--token-file", b, "ls"]).await.to_string();
    assert!(
        !hidden.contains("tiny"),
        "b must not see a's private model: {hidden}"
    );
    let mine = json(addr, &["--token-file", a, "ls"]).await.to_string();
    assert!(mine.contains("\"owner\":\"a\""), "{mine}");
    let err = fails(addr, &["--token-file", b, "access", "tiny", "--public"]).await;
    assert!(err.contains("not found"), "{err}");
    ok(
        addr,
        &["--token-file", a, "access", "tiny", "--share-with", "b"],
    )
    .await;
    let theirs = json(addr, &["--token-file", b, "ls"]).await.to_string();
    assert!(theirs.contains("tiny"), "{theirs}");
    let table = ok(addr, &["--token-file", admin, "ls"]).await;
    assert!(
        table.contains("OWNER") && table.contains("shared: b"),
        "{table}"
    );
}

/// Only the admin (token file `admin`, not `a`) reloads the tenants; its stats show the
/// tenants and a's leases quota.
async fn reload_and_stats_as_the_admin(addr: &str, admin: &str, a: &str) {
    let err = fails(addr, &["--token-file", a, "reload-tenants"]).await;
    assert!(err.to_lowercase().contains("permission"), "{err}");
    let reloaded = ok(addr, &["--token-file", admin, "reload-tenants"]).await;
    assert!(
        reloaded.contains('a') && reloaded.contains('b'),
        "{reloaded}"
    );
    let stats = ok(addr, &["--token-file", admin, "stats"]).await;
    assert!(
        stats.contains("TENANT") || stats.contains("tenant"),
        "{stats}"
    );
    assert!(
        stats.contains("/7") || stats.contains("/ 7"),
        "the leases quota: {stats}"
    );
    assert!(
        stats.contains("max_tokens 512, stop 1"),
        "a's generation caps: {stats}"
    );
}

/// `modelshare ready` exits 1 while the server's start-up model is still loading (the server
/// up, its health NOT_SERVING) and 0 once it is loaded; 1 when nothing listens. Fails if it says
/// ready before the start-up models are in, or never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_waits_for_the_start_up_models() {
    let ready = |address: &str| {
        std::process::Command::new(common::BIN)
            .args(["--server", address, "ready"])
            .output()
            .expect("run ready")
    };
    let nobody = ready("unix:/nonexistent/grpc.sock");
    assert!(!nobody.status.success());

    // 384 MiB of weights: seconds of hashing in a debug build.
    let mut server = common::Server::spawn_with(&["--model", "big=big"], |root| {
        let tensors: Vec<common::T> = (0..6)
            .map(|i| common::t(&format!("w{i}"), Dtype::F32, &[4096, 4096], i))
            .collect();
        common::write_safetensors(&root.join("big/model.safetensors"), &tensors);
    });
    let started = std::time::Instant::now();
    let mut saw_loading = false;
    loop {
        let out = ready(&server.address);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() {
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ready");
            break;
        }
        saw_loading |= err.contains("not ready: the server is NOT_SERVING");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "never ready: {err}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(saw_loading, "ready never saw the server up and loading");
    let mut admin = server.admin().await;
    assert_eq!(common::stats(&mut admin).await.arenas, 1);
    server.stop_with("TERM");
}
