//! Starting, stopping and restarting the server: signals, sockets, start-up models, the
//! model root and the backend.

use std::time::Duration;

use modelshare_proto::v1 as pb;

use super::write_small;
use crate::common::{self, Server};

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

/// A start-up load says what it loads, how big and from where, before it is done (it used to
/// be silent until ready).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_startup_load_says_what_it_loads() {
    let server = Server::start_with(&["--model", "m=m"], |root| write_small(root, "m", 1)).await;
    let log = server.log();
    assert!(
        log.contains("loading start-up model m (0.0 GiB) from m"),
        "{log}"
    );
    let loading = log.find("loading start-up model m").expect("said");
    let ready = log.find("start-up model ready").expect("ready");
    assert!(loading < ready, "{log}");
}

/// Waits until `path` exists, at most 10 s.
fn wait_for_file(path: &std::path::Path) -> bool {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < until {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Two servers whose gRPC sockets share a folder each get their own handle socket, named after
/// their gRPC socket (both used to take `modelshare-handles.sock`, and the second failed); a
/// handle socket another server holds is refused with the flag that gives one's own.
#[test]
fn servers_sharing_a_folder_get_their_own_handle_sockets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spawn = |name: &str, extra: &[&std::ffi::OsStr]| {
        std::process::Command::new(common::BIN)
            .arg("serve")
            .args(["--backend", "host", "--model-root"])
            .arg(dir.path())
            .arg("--unix-socket")
            .arg(dir.path().join(format!("{name}.sock")))
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run modelshare")
    };
    let mut a = spawn("a", &[]);
    assert!(
        wait_for_file(&dir.path().join("a-handles.sock")),
        "a's handle socket"
    );
    let mut b = spawn("b", &[]);
    assert!(
        wait_for_file(&dir.path().join("b-handles.sock")),
        "b's handle socket"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(b.try_wait().expect("wait").is_none(), "b is serving");

    let taken = dir.path().join("a-handles.sock");
    let c = spawn(
        "c",
        &[std::ffi::OsStr::new("--handle-socket"), taken.as_os_str()],
    );
    let out = c.wait_with_output().expect("c ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("--handle-socket"), "{err}");
    assert!(err.contains("another process is listening"), "{err}");
    for p in [&mut a, &mut b] {
        let _ = p.kill();
        let _ = p.wait();
    }
}
