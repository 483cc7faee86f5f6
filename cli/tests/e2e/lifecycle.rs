//! Unload, leases, draining, shutdown and restart.

use std::time::Duration;

use modelshare_proto::v1 as pb;
use safetensors::Dtype;

use crate::common::{self, Server, t};

fn write_small(root: &std::path::Path, dir: &str, seed: u64) {
    common::write_safetensors(
        &root.join(dir).join("model.safetensors"),
        &[
            t("w", Dtype::F32, &[64, 64], seed),
            t("b", Dtype::F16, &[64], seed + 1),
        ],
    );
}

/// Unloading a model must free its arena: GetStats returns to zero and the model disappears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unload_frees_the_arena() {
    let server = Server::start().await;
    write_small(&server.root, "m", 1);
    let mut admin = server.admin().await;
    let v = common::load(&mut admin, "m", "m").await.expect("load");
    let s = common::stats(&mut admin).await;
    assert_eq!((s.arenas, s.arena_bytes), (1, v.arena_bytes));
    assert!(v.arena_bytes >= 64 * 64 * 4 + 64 * 2);
    let r = admin
        .unload_model(pb::UnloadModelRequest {
            name: "m".into(),
            version: 0,
            ..Default::default()
        })
        .await
        .expect("unload")
        .into_inner();
    assert_eq!(r.versions.len(), 1);
    assert_eq!(r.versions[0].state, pb::VersionState::Freed as i32);
    let s = common::stats(&mut admin).await;
    assert_eq!((s.arenas, s.arena_bytes, s.models), (0, 0, 0));
    let list = admin
        .list_models(pb::ListModelsRequest {})
        .await
        .expect("list")
        .into_inner();
    assert!(list.models.is_empty());
}

/// An unload under a lease must drain: attaches refused, bytes kept until the last release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unload_while_attached_drains_until_release() {
    let server = Server::start().await;
    write_small(&server.root, "m", 1);
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "m").await.expect("load");
    let session = modelshare_worker::Session::open(&server.address, "holder")
        .await
        .expect("session");
    let model = session.attach("m").await.expect("attach");
    let before = model.tensor("w").expect("w").bytes().to_vec();
    let mut events = session.subscribe();

    let r = admin
        .unload_model(pb::UnloadModelRequest {
            name: "m".into(),
            version: 0,
            ..Default::default()
        })
        .await
        .expect("unload")
        .into_inner();
    assert_eq!(r.versions[0].state, pb::VersionState::Draining as i32);
    assert_eq!(
        events.recv().await.expect("event"),
        modelshare_worker::SessionEvent::VersionDraining {
            model: "m".into(),
            version: 1
        }
    );
    let s = common::stats(&mut admin).await;
    assert_eq!(s.arenas, 1, "a draining version keeps its memory");
    assert_eq!(common::count(&s, pb::VersionState::Draining), 1);
    let other = modelshare_worker::Session::open(&server.address, "late")
        .await
        .expect("session");
    let err = other
        .attach_version("m", 1)
        .await
        .expect_err("attach to draining");
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition), "{err}");
    let err = other
        .attach("m")
        .await
        .expect_err("latest of a draining model");
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition), "{err}");
    // The holder still reads the same bytes.
    assert_eq!(model.tensor("w").expect("w").bytes(), before.as_slice());

    model.release().await.expect("release");
    let s = common::stats(&mut admin).await;
    assert_eq!((s.arenas, s.arena_bytes, s.leases), (0, 0, 0));
}

/// Ending a session without releasing (the worker going away) must release its leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_session_releases_its_leases() {
    let server = Server::start().await;
    write_small(&server.root, "m", 1);
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "m").await.expect("load");
    // A raw session: hello, then attach twice, then close the stream without releasing.
    let common::RawSession {
        mut worker,
        tx,
        events,
        welcome,
    } = common::raw_session(
        &server.address,
        pb::Hello {
            worker_name: "short".into(),
            pid: 4242,
            labels: [("role".to_string(), "test".to_string())].into(),
            ..Default::default()
        },
    )
    .await;
    for _ in 0..2 {
        worker
            .attach(pb::AttachRequest {
                device_uuid: String::new(),
                session_id: welcome.session_id.clone(),
                model: "m".into(),
                version: 0,
            })
            .await
            .expect("attach");
    }
    let s = common::stats(&mut admin).await;
    assert_eq!((s.sessions, s.leases), (1, 2));
    let ps = admin
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .expect("ps")
        .into_inner();
    assert_eq!(ps.sessions.len(), 1);
    assert_eq!(ps.sessions[0].worker_name, "short");
    assert_eq!(ps.sessions[0].pid, 4242);
    assert_eq!(
        ps.sessions[0].labels.get("role").map(String::as_str),
        Some("test")
    );
    assert_eq!(ps.sessions[0].leases.len(), 2);
    drop(tx);
    drop(events);
    common::eventually(Duration::from_secs(3), "session and leases gone", || {
        let mut admin = admin.clone();
        async move {
            let s = common::stats(&mut admin).await;
            s.sessions == 0 && s.leases == 0
        }
    })
    .await;
    let s = common::stats(&mut admin).await;
    assert_eq!(s.arenas, 1, "the model itself stays loaded");
}

/// A session that stops heartbeating must be ended by the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_session_times_out() {
    let server = Server::start_with(
        &["--heartbeat-interval-ms", "50", "--heartbeat-misses", "2"],
        |_| {},
    )
    .await;
    let mut admin = server.admin().await;
    let raw = common::raw_session(&server.address, pb::Hello::default()).await;
    assert_eq!(common::stats(&mut admin).await.sessions, 1);
    // Keep the stream open but say nothing.
    common::eventually(Duration::from_secs(3), "silent session ended", || {
        let mut admin = admin.clone();
        async move { common::stats(&mut admin).await.sessions == 0 }
    })
    .await;
    drop(raw);
}

/// A lease can only be released by its own session, and only once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_checks_the_owner() {
    let server = Server::start().await;
    write_small(&server.root, "m", 1);
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "m").await.expect("load");
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("channel");
    let mut worker = modelshare_proto::v1::worker_service_client::WorkerServiceClient::new(ch);
    let owner = modelshare_worker::Session::open(&server.address, "owner")
        .await
        .expect("session");
    let model = owner.attach("m").await.expect("attach");
    let thief = modelshare_worker::Session::open(&server.address, "thief")
        .await
        .expect("session");
    let err = worker
        .release(pb::ReleaseRequest {
            session_id: thief.id(),
            lease_id: model.lease_id(),
        })
        .await
        .expect_err("release by another session");
    assert_eq!(err.code(), tonic::Code::NotFound);
    let err = worker
        .attach(pb::AttachRequest {
            device_uuid: String::new(),
            session_id: "no-such-session".into(),
            model: "m".into(),
            version: 0,
        })
        .await
        .expect_err("attach without a session");
    assert_eq!(err.code(), tonic::Code::NotFound);
    let lease = model.lease_id().to_owned();
    model.release().await.expect("release");
    let err = worker
        .release(pb::ReleaseRequest {
            session_id: owner.id(),
            lease_id: lease,
        })
        .await
        .expect_err("double release");
    assert_eq!(err.code(), tonic::Code::NotFound);
}

/// SIGTERM and SIGINT must shut the server down cleanly: exit 0, sockets removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_shut_down_cleanly() {
    for signal in ["TERM", "INT"] {
        let mut server =
            Server::start_with(&["--model", "m=m"], |root| write_small(root, "m", 1)).await;
        // A live session must not hold up the shutdown.
        let session = modelshare_worker::Session::open(&server.address, "w")
            .await
            .expect("session");
        let _model = session.attach("m").await.expect("attach");
        let status = server.stop_with(signal);
        assert!(
            status.success(),
            "SIG{signal}: exit {status}; log:\n{}",
            server.log()
        );
        assert!(
            !server.socket.exists(),
            "gRPC socket left behind after SIG{signal}"
        );
        assert!(
            !server.handles.exists(),
            "handle socket left behind after SIG{signal}"
        );
        let log = server.log();
        assert!(
            log.contains("shutdown requested") && log.contains("stopped"),
            "{log}"
        );
    }
}

/// Start-up models must come back after a restart, and a stale socket from a killed server
/// must not stop the new one from binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_reloads_startup_models() {
    let mut server = Server::start_with(&["--model", "m=m", "--model", "n=n"], |root| {
        write_small(root, "m", 1);
        write_small(root, "n", 2);
    })
    .await;
    let mut admin = server.admin().await;
    assert_eq!(common::stats(&mut admin).await.arenas, 2);
    let status = server.stop_with("KILL");
    assert!(!status.success());
    assert!(
        server.socket.exists(),
        "a killed server leaves its socket file"
    );
    server.spawn();
    server.wait_ready().await;
    let mut admin = server.admin().await;
    let list = admin
        .list_models(pb::ListModelsRequest {})
        .await
        .expect("list")
        .into_inner();
    let names: Vec<&str> = list.models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["m", "n"]);
    assert!(list.models.iter().all(|m| m.latest_ready == 1));
}

/// A second server must refuse a socket a live server is using, with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_refuses_a_live_socket() {
    let server = Server::start().await;
    let out = std::process::Command::new(common::BIN)
        .args(["serve", "--backend", "host", "--unix-socket"])
        .arg(&server.socket)
        .arg("--handle-socket")
        .arg(server.dir.path().join("other-handles.sock"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another process is listening"), "{err}");
    // The first server is unharmed.
    let mut admin = server.admin().await;
    common::stats(&mut admin).await;
}

/// A start-up model that fails to load must stop the server with an error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_startup_model_fails_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(common::BIN)
        .args(["serve", "--backend", "host", "--model", "m=missing"])
        .arg("--unix-socket")
        .arg(dir.path().join("g.sock"))
        .arg("--handle-socket")
        .arg(dir.path().join("h.sock"))
        .arg("--model-root")
        .arg(dir.path())
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("start-up model 'm'") && err.contains("missing"),
        "{err}"
    );
}

/// The TOML config file must be honoured, and flags must override it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_file_is_honoured() {
    let cfg_dir = tempfile::tempdir().expect("tempdir");
    let cfg = cfg_dir.path().join("modelshare.toml");
    std::fs::write(
        &cfg,
        "heartbeat_interval_ms = 250\n[[models]]\nname = \"from-file\"\npath = \"m\"\n[limits]\nmax_model_bytes = 1000000\n",
    )
    .expect("write config");
    let server = Server::start_with(&["--config", cfg.to_str().expect("utf8")], |root| {
        write_small(root, "m", 1)
    })
    .await;
    let mut admin = server.admin().await;
    let list = admin
        .list_models(pb::ListModelsRequest {})
        .await
        .expect("list")
        .into_inner();
    assert_eq!(list.models[0].name, "from-file");
    // An unknown key must stop the server instead of being ignored.
    std::fs::write(&cfg, "heartbeat_intervall_ms = 5\n").expect("write config");
    let out = std::process::Command::new(common::BIN)
        .args(["serve", "--config", cfg.to_str().expect("utf8")])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field"));
}

/// A regular file at a socket path would be deleted and replaced by the socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_at_a_socket_path_is_refused_not_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let precious = dir.path().join("notes.txt");
    std::fs::write(&precious, b"keep me").expect("file");
    for flag in ["--unix-socket", "--handle-socket"] {
        let other = if flag == "--unix-socket" {
            "--handle-socket"
        } else {
            "--unix-socket"
        };
        let out = std::process::Command::new(common::BIN)
            .args(["serve", "--backend", "host", "--model-root"])
            .arg(dir.path())
            .arg(flag)
            .arg(&precious)
            .arg(other)
            .arg(dir.path().join(format!("other{flag}.sock")))
            .output()
            .expect("run");
        assert!(!out.status.success(), "{flag}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&precious.display().to_string()) && err.contains("is not a socket"),
            "{flag}: {err}"
        );
        assert_eq!(std::fs::read(&precious).expect("still there"), b"keep me");
    }
}

/// `serve --tls-cert ...` (a client flag) would start a plain-text server while its operator
/// believes TLS is on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_flags_are_refused_by_serve() {
    for args in [
        &["serve", "--tls-cert", "/etc/cert.pem"][..],
        &["--tls-key", "/etc/key.pem", "serve"],
        &["demo", "--token", "t"],
    ] {
        let out = std::process::Command::new(common::BIN)
            .args(args)
            .env_remove("MODELSHARE_TOKEN")
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("is a client flag"), "{args:?}: {err}");
    }
}

/// `serve --help` and `demo --help` list their own options only; client commands list the client
/// options under their own heading.
#[test]
fn client_flags_are_listed_only_where_they_apply() {
    let help = |args: &[&str]| {
        let out = std::process::Command::new(common::BIN)
            .args(args)
            .output()
            .expect("run");
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for args in [
        &["serve", "--help"][..],
        &["demo", "--help"],
        &["-s", "unix:/x", "serve", "-h"],
    ] {
        let text = help(args);
        for flag in [
            "--server ",
            "--token",
            "--tls-cert",
            "--tls-ca",
            "--output",
            "Client options",
        ] {
            assert!(!text.contains(flag), "{args:?} lists {flag}:\n{text}");
        }
        assert!(
            text.contains("--model-root") || text.contains("--listen"),
            "{text}"
        );
    }
    for args in [&["ps", "--help"][..], &["--help"]] {
        let text = help(args);
        let client = text
            .find("Client options:")
            .unwrap_or_else(|| panic!("{args:?}: {text}"));
        assert!(text[client..].contains("--tls-cert"), "{text}");
    }
}

/// Without a tenants file every caller is the admin: TCP is refused unless asked for by name,
/// and the default listener is a Unix socket of mode 0600 that the client finds by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tenants_the_server_serves_its_own_user_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(common::BIN)
        .args([
            "serve",
            "--backend",
            "host",
            "--listen",
            "127.0.0.1:0",
            "--model-root",
        ])
        .arg(dir.path())
        .env("TMPDIR", dir.path())
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "TCP without tenants started");
    assert!(
        err.contains("--unauthenticated-tcp") && err.contains("tenants file"),
        "{err}"
    );

    let mut server = std::process::Command::new(common::BIN)
        .args(["serve", "--backend", "host", "--model-root"])
        .arg(dir.path())
        .env("TMPDIR", dir.path())
        .env_remove("MODELSHARE_LISTEN")
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("serve");
    let uid = rustix_uid();
    let socket = dir.path().join(format!("modelshare-{uid}.sock"));
    let mut listed = None;
    for _ in 0..200 {
        let out = std::process::Command::new(common::BIN)
            .args(["-o", "json", "ls"])
            .env("TMPDIR", dir.path())
            .env_remove("MODELSHARE_SERVER")
            .output()
            .expect("ls");
        if out.status.success() {
            listed = Some(out);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(&socket).map(|m| m.permissions().mode() & 0o777)
    };
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        listed.is_some(),
        "the client did not reach the default socket"
    );
    assert_eq!(mode.expect("the default socket"), 0o600);
}

/// The uid of this process.
fn rustix_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("uid")
}

/// A start that fails after binding its sockets (the TCP port is taken) removes them.
#[test]
fn a_failed_start_leaves_no_socket_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let port = taken.local_addr().expect("addr").port();
    let out = std::process::Command::new(common::BIN)
        .args([
            "serve",
            "--backend",
            "host",
            "--unauthenticated-tcp",
            "--model-root",
        ])
        .arg(dir.path())
        .arg("--unix-socket")
        .arg(dir.path().join("g.sock"))
        .arg("--handle-socket")
        .arg(dir.path().join("h.sock"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Address already in use"), "{err}");
    for sock in ["g.sock", "h.sock"] {
        assert!(!dir.path().join(sock).exists(), "{sock} left behind");
    }
}

/// A server over a missing model root (or a file) would start and fail every load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_model_root_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").expect("file");
    for (root, says) in [
        (dir.path().join("nonexistent"), "No such file or directory"),
        (file, "is not a directory"),
    ] {
        let out = std::process::Command::new(common::BIN)
            .args(["serve", "--backend", "host", "--model-root"])
            .arg(&root)
            .arg("--unix-socket")
            .arg(dir.path().join("g.sock"))
            .arg("--handle-socket")
            .arg(dir.path().join("h.sock"))
            .output()
            .expect("run");
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        let want = format!("model root {}: {says}", root.display());
        assert!(err.contains(&want), "{err}");
        assert!(
            !dir.path().join("g.sock").exists(),
            "a socket was left behind"
        );
    }
}

/// Without a CUDA driver, `--backend cuda` must fail with an error that names the missing
/// library, and `--backend auto` must fall back to host memory. (On a machine with a GPU the
/// GPU check covers the CUDA side; there this test has nothing to check.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuda_without_a_driver_is_a_clear_error_and_auto_falls_back() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(common::BIN)
        .args(["serve", "--backend", "cuda", "--unix-socket"])
        .arg(dir.path().join("g.sock"))
        .arg("--handle-socket")
        .arg(dir.path().join("h.sock"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("libcuda.so") && err.contains("LD_LIBRARY_PATH"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let server = Server::start_with(&["--backend", "auto"], |root| write_small(root, "m", 1)).await;
    let mut admin = server.admin().await;
    let device = common::stats(&mut admin).await.device.expect("device");
    assert_eq!(device.backend, pb::BackendKind::Host as i32);
}

/// A client's huge input would come back whole in the status message (a megabyte
/// `grpc-message`, which gRPC clients reject, hiding the real status), on gRPC and HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_echo_at_most_a_bounded_part_of_the_input() {
    let server = Server::start().await;
    let mut admin = server.admin().await;
    let huge = "x".repeat(512 << 10);
    let err = common::load(&mut admin, &huge, "nowhere")
        .await
        .expect_err("bad name");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().len() < 4096, "{} bytes", err.message().len());
    assert!(
        err.message().contains("bytes cut"),
        "{}",
        &err.message()[..200]
    );
    let err = common::load(&mut admin, "m", &huge)
        .await
        .expect_err("bad path");
    assert!(err.message().len() < 4096, "{} bytes", err.message().len());
}

/// A host-backend server over `dir` (its model root and sockets) started under `prlimit
/// --nofile=<nofile>` (soft:hard), its log discarded.
fn serve_with_nofile(nofile: &str, dir: &std::path::Path, extra: &[&str]) -> common::KillOnDrop {
    std::process::Command::new("prlimit")
        .arg(format!("--nofile={nofile}"))
        .arg(common::BIN)
        .args(["serve", "--backend", "host", "--model-root"])
        .arg(dir)
        .arg("--unix-socket")
        .arg(dir.join("g.sock"))
        .arg("--handle-socket")
        .arg(dir.join("h.sock"))
        .args(extra)
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(common::KillOnDrop)
        .expect("prlimit and the server")
}

/// The server would keep a low soft limit on open files that its hard limit allows raising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_file_limit_is_raised_to_the_hard_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = serve_with_nofile("100:2048", dir.path(), &[]);
    let address = format!("unix:{}", dir.path().join("g.sock").display());
    let mut limits = String::new();
    for _ in 0..200 {
        if modelshare_worker::connect::channel(&address).await.is_ok() {
            limits =
                std::fs::read_to_string(format!("/proc/{}/limits", server.id())).expect("limits");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = server.kill();
    let _ = server.wait();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no open-file line in {limits:?}"));
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(numbers, ["2048", "2048"], "{line}");
}

/// The user and system CPU ticks a process has used (`/proc/<pid>/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of the line (utime, stime) are 11 and 12 after the command.
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// With its descriptors exhausted by idle clients, a listener would retry accept() in a loop
/// that takes whole cores (and keeps spinning after they leave); it must pause, and serve
/// again once descriptors are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_descriptors_do_not_spin_the_listeners() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut server = serve_with_nofile(
        "160:160",
        dir.path(),
        &[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--unauthenticated-tcp",
        ],
    );
    let address = format!("http://127.0.0.1:{port}");
    let mut ready = false;
    for _ in 0..200 {
        if modelshare_worker::connect::channel(&address).await.is_ok() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "the server did not start");
    // Hold more connections than the server has descriptors.
    let mut idle = Vec::new();
    for _ in 0..220 {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(s) => idle.push(s),
            Err(_) => break,
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = cpu_ticks(server.id());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = cpu_ticks(server.id()) - before;
    // Spinning would be ~200 ticks (a whole core for 2 s); pacing costs a few.
    assert!(
        used < 60,
        "the server used {used} CPU ticks in 2 s with descriptors exhausted"
    );
    drop(idle);
    // Descriptors free again: the server answers.
    let mut answered = false;
    for _ in 0..50 {
        if let Ok(ch) = modelshare_worker::connect::channel(&address).await {
            let mut admin = pb::admin_service_client::AdminServiceClient::new(ch);
            if admin.list_models(pb::ListModelsRequest {}).await.is_ok() {
                answered = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        answered,
        "the server did not serve again once descriptors were free"
    );
}

/// Each unredeemed ticket holds a descriptor: one client attaching a thousand times without
/// redeeming must hit its session's limit (RESOURCE_EXHAUSTED), not exhaust the server's
/// descriptors, so that another session's attach and a load still work; and the timer must
/// close the hoarded descriptors when the tickets expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hoarded_tickets_are_limited_and_expire() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_small(dir.path(), "m", 1);
    write_small(dir.path(), "n", 2);
    let cfg = dir.path().join("modelshare.toml");
    // Long enough for the thousand attaches below on a slow machine; checked after them.
    let ttl = Duration::from_secs(10);
    std::fs::write(&cfg, format!("ticket_ttl_ms = {}\n", ttl.as_millis())).expect("config");
    // 512 descriptors: a quarter (128) for tickets in all, 64 per session.
    let mut server = serve_with_nofile(
        "512:512",
        dir.path(),
        &["--config", cfg.to_str().expect("utf8")],
    );
    let address = format!("unix:{}", dir.path().join("g.sock").display());
    let mut channel = None;
    for _ in 0..200 {
        if let Ok(ch) = modelshare_worker::connect::channel(&address).await {
            channel = Some(ch);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut admin = pb::admin_service_client::AdminServiceClient::new(channel.expect("started"));
    common::load(&mut admin, "m", "m").await.expect("load m");
    let hoarder = common::raw_session(&address, pb::Hello::default()).await;
    // The session lives through the tickets' time (its heartbeats), so that what closes the
    // descriptors below is the tickets' expiry, not the session's end.
    let heartbeat = hoarder.heartbeats();
    let baseline = common::open_fds(server.id());
    let baseline_memfds = common::memfd_fds(server.id());
    let attach = |mut session: RawSessionClient, id: String| async move {
        session
            .attach(pb::AttachRequest {
                device_uuid: String::new(),
                session_id: id,
                model: "m".into(),
                version: 0,
            })
            .await
    };
    let (mut granted, mut refused) = (0, 0);
    let hoarding_since = std::time::Instant::now();
    for _ in 0..1000 {
        match attach(hoarder.worker.clone(), hoarder.welcome.session_id.clone()).await {
            Ok(_) => granted += 1,
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                assert!(
                    status
                        .message()
                        .contains("unredeemed tickets of this session"),
                    "{}",
                    status.message()
                );
                refused += 1;
            }
        }
    }
    assert!(
        hoarding_since.elapsed() < ttl,
        "the attaches outlasted the tickets: the count below would not be the limit's"
    );
    assert_eq!((granted, refused), (64, 936));
    let hoarding = common::open_fds(server.id());
    assert!(hoarding < 400, "{baseline} → {hoarding} descriptors");
    let hoarding_memfds = common::memfd_fds(server.id());
    assert_eq!(
        hoarding_memfds,
        baseline_memfds + 64,
        "one arena copy per granted ticket"
    );
    // Someone else still attaches and loads.
    let other = common::raw_session(&address, pb::Hello::default()).await;
    attach(other.worker.clone(), other.welcome.session_id.clone())
        .await
        .expect("another session attaches");
    common::load(&mut admin, "n", "n")
        .await
        .expect("a load still opens its files");
    // The timer closes what was never redeemed.
    let pid = server.id();
    common::eventually(
        ttl + Duration::from_secs(10),
        "expired tickets closed",
        // Left: the arena of n (the other session's ticket expires with the hoarder's).
        || async move {
            common::memfd_fds(pid) <= baseline_memfds + 1 && common::open_fds(pid) <= baseline + 4
        },
    )
    .await;
    attach(hoarder.worker.clone(), hoarder.welcome.session_id.clone())
        .await
        .expect("the session's tickets expired: it may attach again");
    heartbeat.abort();
    let _ = server.kill();
    let _ = server.wait();
}

type RawSessionClient =
    modelshare_proto::v1::worker_service_client::WorkerServiceClient<tonic::transport::Channel>;

/// Reads the held-memory record of `model`@`version` beside the server's handle socket.
fn held_record(server: &Server, model: &str, version: u32) -> Option<serde_json::Value> {
    let path = server
        .dir
        .path()
        .join("handles.sock.held")
        .join(format!("{model}@{version}.json"));
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Waits until the record of m@1 names `pid` among its holders (the server keeps it current
/// within seconds of an attach).
async fn wait_until_recorded_holder(server: &Server, pid: u32) {
    common::eventually(
        Duration::from_secs(10),
        "the record names the worker",
        || {
            let held = held_record(server, "m", 1);
            async move {
                held.is_some_and(|r| {
                    r["holders"]
                        .as_array()
                        .is_some_and(|h| h.iter().any(|x| x["pid"] == pid))
                })
            }
        },
    )
    .await;
}

/// The inode of the memory file a probe maps (the same inode: the same memory).
fn mapped_inode(report: &serde_json::Value) -> u64 {
    report["mapping"]["inode"]
        .as_u64()
        .unwrap_or_else(|| panic!("no mapping inode in {report}"))
}

/// A worker keeps its mapping across a `kill -9` of the server; the restarted server adopts
/// that memory for its start-up model instead of loading a second copy, under the same version
/// number, and the worker's session re-attaches it. Fails if the restart reads the files
/// again (a new memory file), loses the version number, or leaves the memory counted as held by
/// workers only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_adopts_the_memory_a_worker_kept() {
    let mut server =
        Server::start_with(&["--model", "m=m"], |root| write_small(root, "m", 1)).await;
    let mut keeper = common::Worker::start(&server, "m", "keeper");
    let inode_before = mapped_inode(&keeper.report);
    wait_until_recorded_holder(&server, keeper.pid()).await;

    assert!(!server.stop_with("KILL").success());
    server.spawn();
    server.wait_ready().await;
    let log = server.log();
    assert!(log.contains("adopted the memory a worker kept"), "{log}");
    assert!(
        log.contains("model back from memory a worker kept"),
        "{log}"
    );

    let mut admin = server.admin().await;
    let stats = common::stats(&mut admin).await;
    assert_eq!(stats.arenas, 1);
    assert_eq!(stats.held_by_workers_bytes, 0);
    let list = admin
        .list_models(pb::ListModelsRequest {})
        .await
        .expect("list")
        .into_inner();
    assert_eq!(list.models[0].latest_ready, 1);

    // The keeper's session came back and attached again; a new worker maps the same memory.
    let mut reattached = false;
    for _ in 0..4 {
        let ev = keeper.next_event();
        if ev["event"] == "reattached" {
            reattached = true;
            break;
        }
    }
    assert!(reattached, "the keeper's session did not re-attach");
    let fresh = common::Worker::start(&server, "m", "fresh");
    assert_eq!(fresh.report["verified"], true, "{}", fresh.report);
    assert_eq!(mapped_inode(&fresh.report), inode_before);
}

/// When the model's files changed while the server was down, the memory a worker kept is
/// the old bytes: the restarted server loads the new files and does not adopt it. Fails if the
/// server serves the stale memory, or keeps counting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_of_changed_files_is_not_adopted() {
    let mut server =
        Server::start_with(&["--model", "m=m"], |root| write_small(root, "m", 1)).await;
    let keeper = common::Worker::start(&server, "m", "keeper");
    let inode_before = mapped_inode(&keeper.report);
    wait_until_recorded_holder(&server, keeper.pid()).await;

    assert!(!server.stop_with("KILL").success());
    // Same names and shapes, other bytes.
    write_small(&server.root, "m", 7);
    server.spawn();
    server.wait_ready().await;
    let mut admin = server.admin().await;
    common::eventually(
        Duration::from_secs(15),
        "the kept memory no longer counted",
        || {
            let mut admin = admin.clone();
            async move { common::stats(&mut admin).await.held_by_workers_bytes == 0 }
        },
    )
    .await;
    assert_eq!(common::stats(&mut admin).await.arenas, 1);
    let fresh = common::Worker::start(&server, "m", "fresh");
    assert_eq!(fresh.report["verified"], true, "{}", fresh.report);
    assert_ne!(mapped_inode(&fresh.report), inode_before);
    assert!(
        !server.log().contains("model back from memory"),
        "{}",
        server.log()
    );
}

/// A restart after a `kill -9` with no worker holding anything does not wait for offers: the
/// start-up model is loaded from its files at once. Fails if every restart waits out
/// `--adopt-wait-ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_holders_does_not_wait() {
    let mut server = Server::start_with(&["--model", "m=m", "--adopt-wait-ms", "60000"], |root| {
        write_small(root, "m", 1)
    })
    .await;
    {
        let probe = common::Worker::start(&server, "m", "short-lived");
        wait_until_recorded_holder(&server, probe.pid()).await;
        // Dropped: the probe is killed.
    }
    assert!(!server.stop_with("KILL").success());
    let started = std::time::Instant::now();
    server.spawn();
    server.wait_ready().await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "waited {:?}",
        started.elapsed()
    );
    assert!(
        server.log().contains("no process that held this version"),
        "{}",
        server.log()
    );
}

/// Two workers hold a model an admin loaded (no start-up model); after a `kill -9` and a
/// restart, one worker's offer brings the version back and both sessions re-attach it. Fails if
/// a worker whose offer was not the one taken is told the model does not exist (NOT_FOUND
/// while it is being brought back, instead of UNAVAILABLE: retry) and gives it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_reattaches_a_model_brought_back_from_memory() {
    let mut server = Server::start_with(&[], |root| write_small(root, "m", 3)).await;
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "m").await.expect("load");
    let mut a = common::Worker::start(&server, "m", "a");
    let mut b = common::Worker::start(&server, "m", "b");
    wait_until_recorded_holder(&server, a.pid()).await;
    wait_until_recorded_holder(&server, b.pid()).await;
    assert!(!server.stop_with("KILL").success());
    server.spawn();
    server.wait_ready().await;
    for w in [&mut a, &mut b] {
        let mut seen = Vec::new();
        loop {
            let ev = w.next_event();
            seen.push(ev["event"].as_str().unwrap_or("").to_owned());
            assert_ne!(ev["event"], "model_gone", "{seen:?} {ev}\n{}", server.log());
            if ev["event"] == "reattached" {
                break;
            }
            assert!(seen.len() < 6, "{seen:?}");
        }
    }
    let mut admin = server.admin().await;
    let s = common::stats(&mut admin).await;
    assert_eq!((s.arenas, s.leases, s.held_by_workers_bytes), (1, 2, 0));
}

/// A force-unloaded version that a live worker may still map (host memory outlives the
/// server's handle) is counted as held by workers and against `--max-total-bytes` until that
/// worker exits. Fails if the memory vanishes from the accounting at the unload (and a second
/// model is admitted past the limit), or stays counted after the worker is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_revoked_worker_keeps_is_counted_until_it_exits() {
    // Each small model's arena is 16,640 bytes: room for one, not two.
    let mut server = Server::start_with(
        &[
            "--max-total-bytes",
            "20000",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        |root| {
            write_small(root, "m", 1);
            write_small(root, "n", 2);
        },
    )
    .await;
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "m").await.expect("load m");
    let keeper = common::Worker::start(&server, "m", "keeper");
    admin
        .unload_model(pb::UnloadModelRequest {
            name: "m".into(),
            version: 0,
            force: true,
            drain_timeout_ms: 0,
        })
        .await
        .expect("force unload");
    let s = common::stats(&mut admin).await;
    assert_eq!((s.arenas, s.held_by_workers_bytes), (0, 16640));
    let refused = common::load(&mut admin, "n", "n")
        .await
        .expect_err("past the limit");
    assert!(
        refused.message().contains("revoked workers"),
        "{}",
        refused.message()
    );
    let (_, metrics) = common::http_get(&server.metrics_address(), "/metrics");
    assert!(
        metrics.contains(r#"modelshare_held_by_workers_bytes{device="host",model="m"} 16640"#),
        "{metrics}"
    );

    drop(keeper);
    common::eventually(
        Duration::from_secs(10),
        "the exited worker's memory no longer counted",
        || {
            let mut admin = admin.clone();
            async move { common::stats(&mut admin).await.held_by_workers_bytes == 0 }
        },
    )
    .await;
    common::load(&mut admin, "n", "n")
        .await
        .expect("admitted once the worker is gone");
    server.stop_with("TERM");
}

/// Whether process `pid` ignores or catches SIGHUP (bit 0 of `SigIgn` or `SigCgt` in
/// `/proc/<pid>/status`): the server ignores it first thing, then catches it.
fn catches_sighup(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let mask = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or(0)
    };
    (mask("SigIgn:") | mask("SigCgt:")) & 1 != 0
}

/// A SIGHUP (tenants reload) sent while the server is still starting must not kill it: the
/// server catches SIGHUP before it does anything slow (opening its device can take seconds),
/// and a SIGHUP then is harmless. Fails if the handler is installed only once the device is
/// open (the signal's default action would end a server opening a GPU), or if a SIGHUP right
/// after it kills the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_while_starting_is_not_fatal() {
    for _ in 0..3 {
        let mut server = Server::spawn_with(&["--model", "m=m"], |root| write_small(root, "m", 1));
        let pid = server.pid();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !catches_sighup(pid) {
            assert!(std::time::Instant::now() < deadline, "SIGHUP never caught");
            std::thread::sleep(Duration::from_micros(50));
        }
        let log = server.log();
        assert!(
            !log.contains("device ready"),
            "SIGHUP was caught only after the device was opened:\n{log}"
        );
        for _ in 0..5 {
            let _ = std::process::Command::new("kill")
                .args(["-HUP", &pid.to_string()])
                .status();
            std::thread::sleep(Duration::from_millis(1));
        }
        server.wait_ready().await;
        let mut admin = server.admin().await;
        assert_eq!(common::stats(&mut admin).await.arenas, 1);
        assert!(server.stop_with("TERM").success());
    }
}
