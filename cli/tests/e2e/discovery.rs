//! How the `modelshare` client finds the server (the SDK's one rule, `modelshare_worker::discover`):
//! `--server`, else `MODELSHARE_SERVER`, else the socket a server without tenants listens on by
//! default (`$TMPDIR/modelshare-<uid>.sock`), the container socket, `127.0.0.1:50051`; and what
//! it says when there is none. The server and the client run as the real binary, each with
//! `TMPDIR` set to a directory of the test's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{BIN, KillOnDrop};

/// `modelshare serve` with no listener flag and no tenants: it listens on this user's socket in
/// `tmpdir`. Its log goes to `tmpdir/server.log`.
fn serve_with_defaults(tmpdir: &Path) -> KillOnDrop {
    let root = tmpdir.join("models");
    std::fs::create_dir_all(&root).expect("mkdir models");
    let log = std::fs::File::create(tmpdir.join("server.log")).expect("log");
    let child = Command::new(BIN)
        .args(["serve", "--backend", "host", "--model-root"])
        .arg(&root)
        .env("TMPDIR", tmpdir)
        .env_remove("MODELSHARE_LISTEN")
        .env_remove("MODELSHARE_UNIX_SOCKET")
        .env_remove("MODELSHARE_HANDLE_SOCKET")
        .env_remove("MODELSHARE_TENANTS_FILE")
        .env_remove("MODELSHARE_CONFIG")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup log"))
        .stderr(log)
        .spawn()
        .expect("spawn modelshare serve");
    KillOnDrop(child)
}

/// This user's socket in `tmpdir`, named here from the kernel's uid (not by the code under
/// test).
fn user_socket(tmpdir: &Path) -> PathBuf {
    let uid = rustix::process::getuid().as_raw();
    tmpdir.join(format!("modelshare-{uid}.sock"))
}

/// Runs `modelshare <args>` with `env` (and no `MODELSHARE_SERVER` unless `env` sets it).
fn cli(env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("MODELSHARE_SERVER")
        .env_remove("MODELSHARE_TOKEN")
        .env_remove("MODELSHARE_TOKEN_FILE")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run modelshare")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether something is at the places a test machine might have of its own: the container
/// socket or a server with tenants on the default TCP port. A test that needs them empty says
/// so and checks less.
pub fn machine_has_a_default_server() -> bool {
    Path::new("/run/modelshare/grpc.sock").exists()
        || std::net::TcpStream::connect_timeout(
            &"127.0.0.1:50051".parse().expect("addr"),
            Duration::from_millis(300),
        )
        .is_ok()
}

/// With no flag and no variable the client reaches the server on the socket the server chose
/// by default (both computing it from the same `TMPDIR` and uid); `MODELSHARE_SERVER` is taken
/// as given (even when it is wrong and the default socket is there), and `--server` wins over
/// it; once the server has stopped, the client says it looked for that socket. Fails if the
/// client and the server disagree on the default socket, if the order of the rule changes, or
/// if the client no longer names the places it looked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_finds_the_server_by_the_rule() {
    let home = tempfile::tempdir().expect("tempdir");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let mut server = serve_with_defaults(home.path());
    let socket = user_socket(home.path());
    let address = format!("unix:{}", socket.display());
    let home_dir = home.path().to_str().expect("utf-8");
    let elsewhere_dir = elsewhere.path().to_str().expect("utf-8");

    let deadline = Instant::now() + Duration::from_secs(20);
    while !cli(
        &[("TMPDIR", elsewhere_dir)],
        &["--server", &address, "ready"],
    )
    .status
    .success()
    {
        if let Ok(Some(status)) = server.try_wait() {
            panic!(
                "the server exited with {status}: {}",
                std::fs::read_to_string(home.path().join("server.log")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "no server on {address} in 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let by_default = cli(&[("TMPDIR", home_dir)], &["-o", "json", "ls"]);
    assert!(
        by_default.status.success(),
        "no flag, no variable: {}",
        text(&by_default.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&by_default.stdout).expect("json");
    assert!(listed.is_object() || listed.is_array(), "{listed}");

    let by_variable = cli(
        &[("TMPDIR", elsewhere_dir), ("MODELSHARE_SERVER", &address)],
        &["-o", "json", "ls"],
    );
    assert!(
        by_variable.status.success(),
        "MODELSHARE_SERVER: {}",
        text(&by_variable.stderr)
    );

    let wrong_variable = cli(
        &[
            ("TMPDIR", home_dir),
            ("MODELSHARE_SERVER", "unix:/nonexistent/grpc.sock"),
        ],
        &["ls"],
    );
    assert!(
        !wrong_variable.status.success(),
        "a MODELSHARE_SERVER where nothing is was passed over for the default socket"
    );
    assert!(
        text(&wrong_variable.stderr).contains("/nonexistent/grpc.sock"),
        "{}",
        text(&wrong_variable.stderr)
    );

    let by_flag = cli(
        &[
            ("TMPDIR", elsewhere_dir),
            ("MODELSHARE_SERVER", "unix:/nonexistent/grpc.sock"),
        ],
        &["--server", &address, "ls"],
    );
    assert!(
        by_flag.status.success(),
        "--server over MODELSHARE_SERVER: {}",
        text(&by_flag.stderr)
    );

    // The server stopped (its socket removed), the same command says where it looked.
    let stopped = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .expect("kill");
    assert!(stopped.success());
    let exit = server.wait().expect("wait for the server");
    assert!(exit.success(), "the server exited {exit}");
    assert!(!socket.exists(), "the server left its socket behind");
    let gone = cli(&[("TMPDIR", home_dir)], &["ls"]);
    let stderr = text(&gone.stderr);
    assert!(!gone.status.success(), "ls without a server: {stderr}");
    let expected = format!("this user's socket {address}: no such file");
    assert!(stderr.contains(&expected), "'{expected}' missing: {stderr}");
}

/// With no server anywhere the client fails at once, naming every place it looked and why
/// each was passed over, and how to give the address. Fails if a place is left out (the old
/// client tried 127.0.0.1:50051 and reported only that connection).
#[test]
fn with_no_server_the_cli_names_every_place_it_looked() {
    if machine_has_a_default_server() {
        eprintln!("skipped: this machine has a server at the container socket or on :50051");
        return;
    }
    let empty = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let out = cli(
        &[("TMPDIR", empty.path().to_str().expect("utf-8"))],
        &["ls"],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "ls found a server: {stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    let socket = user_socket(empty.path());
    for expected in [
        "no modelshare server found".to_owned(),
        "--server: not given".to_owned(),
        "MODELSHARE_SERVER: not set".to_owned(),
        format!("this user's socket unix:{}: no such file", socket.display()),
        "the container socket unix:/run/modelshare/grpc.sock: no such file".to_owned(),
        "the TCP address of a server with tenants http://127.0.0.1:50051: connection refused"
            .to_owned(),
        "give its address with --server unix:/path/to/socket".to_owned(),
    ] {
        assert!(stderr.contains(&expected), "'{expected}' missing: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}
