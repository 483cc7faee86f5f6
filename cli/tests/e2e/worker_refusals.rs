//! A worker whose configuration is wrong ends with a failure and a message naming the cause,
//! instead of retrying forever: no server found, a wrong token (UNAUTHENTICATED), a model the
//! server does not have or its tenant may not see (NOT_FOUND at its first attach). A server
//! that is away is waited for. The worker is the real `modelshare-echo-worker` (on the SDK's
//! `serve::run_process`, as `modelshare-embed` is), against the real server.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use modelshare_proto::v1 as pb;

use crate::common::{BIN, KillOnDrop, Server, eventually};
use crate::discovery::machine_has_a_default_server;
use crate::tenants::{self, ADMIN, TA, TB, TenantsFile, abc_tenants, admin_as, load_as};

/// How long a worker may take to give up on a refusal (it needs well under a second).
const GIVES_UP_WITHIN: Duration = Duration::from_secs(10);

/// The echo worker's binary, beside the `modelshare` under test. Cargo builds only this
/// package's binaries for its tests, so the first call builds it (a no-op when it is fresh).
fn echo_worker() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let bin_dir = std::path::Path::new(BIN).parent().expect("bin dir");
        let target_dir = bin_dir.parent().expect("target dir");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args([
                "build",
                "--quiet",
                "-p",
                "modelshare-echo-worker",
                "--target-dir",
            ])
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if bin_dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build");
        assert!(
            status.success(),
            "cargo build -p modelshare-echo-worker: {status}"
        );
        bin_dir.join("modelshare-echo-worker")
    })
}

/// The echo worker with `args` and `env`, and none of the `MODELSHARE_*` variables of the
/// test's environment; its error output goes to a file of `dir`.
fn spawn_worker(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (Child, PathBuf) {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let log = dir.join(format!(
        "worker-{}.log",
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let file = std::fs::File::create(&log).expect("worker log");
    let mut cmd = Command::new(echo_worker());
    cmd.args(args).args(["--name", "refusals-e2e"]);
    for var in [
        "MODELSHARE_SERVER",
        "MODELSHARE_TOKEN",
        "MODELSHARE_TOKEN_FILE",
        "MODELSHARE_TLS_CA",
        "MODELSHARE_TLS_CERT",
        "MODELSHARE_TLS_KEY",
        "MODELSHARE_TLS_DOMAIN",
    ] {
        cmd.env_remove(var);
    }
    let child = cmd
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("spawn modelshare-echo-worker");
    (child, log)
}

/// Runs the echo worker until it exits, at most [`GIVES_UP_WITHIN`]: its status and error
/// output. A worker still running then is killed and the test fails with what it printed.
async fn worker_exit(
    dir: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (ExitStatus, String) {
    let (child, log) = spawn_worker(dir, args, env);
    let mut child = KillOnDrop(child);
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return (status, std::fs::read_to_string(&log).unwrap_or_default());
        }
        if started.elapsed() > GIVES_UP_WITHIN {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the worker {args:?} was still running after {GIVES_UP_WITHIN:?}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts a failed exit whose last line (the `error: ...` the process prints) holds every
/// one of `words`.
fn assert_fails_saying(status: ExitStatus, output: &str, words: &[&str]) {
    assert!(!status.success(), "the worker exited {status}:\n{output}");
    let error = output
        .lines()
        .rev()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no 'error:' line:\n{output}"));
    for word in words {
        assert!(error.contains(word), "'{word}' missing from: {error}");
    }
    assert!(!output.contains("panicked"), "{output}");
}

/// A tenants server with the models `names` written under its root (none loaded).
async fn tenants_server(tenants: &TenantsFile, names: &[&str]) -> Server {
    tenants::start(tenants, &[], names).await
}

/// A wrong token, given with `--token` or in a `--token-file`, ends the worker with an error
/// naming the refusal (UNAUTHENTICATED) and the token, within seconds; so does none at all on
/// a server with tenants. The old worker retried forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_ends_the_worker() {
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = tenants_server(&tenants, &["m"]).await;
    let dir = server.dir.path();
    let wrong_file = dir.join("wrong-token");
    std::fs::write(&wrong_file, "ms_not_a_known_token\n").expect("write token");
    let wrong_file = wrong_file.to_str().expect("utf-8");
    let base = ["--server", server.address.as_str(), "--model", "m"];
    /// The worker's flags and environment of one case.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)]);
    let cases: [Case<'_>; 4] = [
        (&["--token", "ms_not_a_known_token"], &[]),
        (&["--token-file", wrong_file], &[]),
        (&[], &[("MODELSHARE_TOKEN", "ms_not_a_known_token")]),
        (&[], &[]),
    ];
    for (flags, env) in cases {
        let args: Vec<&str> = base.iter().chain(flags).copied().collect();
        let (status, output) = worker_exit(dir, &args, env).await;
        assert_fails_saying(status, &output, &["UNAUTHENTICATED", "token"]);
    }
}

/// A model the server does not have ends the worker at its first attach (NOT_FOUND), naming
/// the model; so does a model another tenant owns and has not shared. The right tenant's
/// token (`--token`) serves it. Fails if the worker waits for the model forever, or if the
/// token flag is not sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_or_hidden_model_ends_the_worker() {
    let plain = Server::start_with(&[], |root| tenants::models(root, &["m"])).await;
    let (status, output) = worker_exit(
        plain.dir.path(),
        &["--server", &plain.address, "--model", "nope"],
        &[],
    )
    .await;
    assert_fails_saying(status, &output, &["NOT_FOUND", "'nope'", "load"]);

    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = tenants_server(&tenants, &["m"]).await;
    let mut admin = admin_as(&server, Some(ADMIN)).await;
    load_as(&mut admin, "m", "m", "a", None)
        .await
        .expect("load m for a");
    let (status, output) = worker_exit(
        server.dir.path(),
        &["--server", &server.address, "--model", "m", "--token", TB],
        &[],
    )
    .await;
    assert_fails_saying(status, &output, &["NOT_FOUND", "'m'"]);

    // The owner's token: attached and serving, as the server sees it.
    let (child, log) = spawn_worker(
        server.dir.path(),
        &["--server", &server.address, "--model", "m", "--token", TA],
        &[],
    );
    let mut owner = KillOnDrop(child);
    let serving = || async {
        admin_as(&server, Some(ADMIN))
            .await
            .list_sessions(pb::ListSessionsRequest {})
            .await
            .expect("sessions")
            .into_inner()
            .sessions
            .iter()
            .any(|s| s.tenant == "a" && s.serving.iter().any(|v| v.model == "m"))
    };
    let deadline = Instant::now() + GIVES_UP_WITHIN;
    while !serving().await {
        if let Ok(Some(status)) = owner.try_wait() {
            panic!(
                "the owner's worker exited {status}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the owner's worker never served m"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = owner.kill();
}

/// With no address and no server where one listens by default, the worker fails at once,
/// naming the places it looked. The old worker dialled /run/modelshare/grpc.sock forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_server_found_the_worker_says_where_it_looked() {
    if machine_has_a_default_server() {
        eprintln!("skipped: this machine has a server at the container socket or on :50051");
        return;
    }
    let empty = tempfile::tempdir().expect("tempdir");
    let (status, output) = worker_exit(
        empty.path(),
        &["--model", "m"],
        &[("TMPDIR", empty.path().to_str().expect("utf-8"))],
    )
    .await;
    assert_fails_saying(
        status,
        &output,
        &[
            "no modelshare server found",
            "MODELSHARE_SERVER: not set",
            &format!("{}/modelshare-", empty.path().display()),
            "/run/modelshare/grpc.sock",
            "127.0.0.1:50051",
            "--server",
        ],
    );
}

/// A server that is away (stopped, to be started again) is waited for: the worker keeps
/// trying, and serves once the server is back. Fails if a refused connection or UNAVAILABLE
/// were made fatal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_away_is_waited_for() {
    let mut server = Server::start_with(&["--model", "m=m", "--adopt-wait-ms", "0"], |root| {
        tenants::models(root, &["m"])
    })
    .await;
    server.stop_with("TERM");
    let (child, log) = spawn_worker(
        server.dir.path(),
        &["--server", &server.address, "--model", "m"],
        &[],
    );
    let mut worker = KillOnDrop(child);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        worker.try_wait().expect("wait").is_none(),
        "the worker gave up on a server that is away:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    server.spawn();
    server.wait_ready().await;
    eventually(Duration::from_secs(20), "the worker serves m", || async {
        server
            .admin()
            .await
            .list_sessions(pb::ListSessionsRequest {})
            .await
            .expect("sessions")
            .into_inner()
            .sessions
            .iter()
            .any(|s| s.serving.iter().any(|v| v.model == "m"))
    })
    .await;
    assert!(worker.try_wait().expect("wait").is_none());
}
