//! The configuration file, the flags each command takes, and the defaults without a tenants
//! file.

use std::time::Duration;

use modelshare_proto::v1 as pb;

use super::write_small;
use crate::common::{self, Server};

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

/// A variable says `false` to a boolean the file says `true` to, and wins (flags > variables >
/// file): with `unauthenticated_tcp = true` in the file and `MODELSHARE_UNAUTHENTICATED_TCP=false`,
/// TCP without a tenants file is refused at start. The variable used to be OR'ed with the file,
/// and the server started with every TCP caller the admin.
#[test]
fn a_variable_turns_off_a_boolean_of_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("modelshare.toml");
    std::fs::write(&cfg, "unauthenticated_tcp = true\n").expect("write config");
    let mut child = std::process::Command::new(common::BIN)
        .arg("serve")
        .args(["--backend", "host", "--listen", "127.0.0.1:0"])
        .arg("--config")
        .arg(&cfg)
        .arg("--unix-socket")
        .arg(dir.path().join("grpc.sock"))
        .arg("--handle-socket")
        .arg(dir.path().join("handles.sock"))
        .arg("--model-root")
        .arg(dir.path())
        .env("MODELSHARE_UNAUTHENTICATED_TCP", "false")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run modelshare");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server started: the variable's false did not turn the file's true off");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("stderr");
    assert!(!status.success(), "{err}");
    // The configuration's refusal, not the command line's.
    assert!(err.contains("to accept that"), "{err}");
}

/// `modelshare embed`'s help and the README say the same: one text per argument, quoted when it
/// has spaces (`embed --model m hello world` embeds two texts, which users did not expect).
#[test]
fn embed_help_and_readme_say_one_text_per_argument() {
    let out = std::process::Command::new(common::BIN)
        .args(["embed", "--help"])
        .output()
        .expect("run modelshare");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("one per argument"), "{help}");
    assert!(help.contains("quote"), "{help}");
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"),
    )
    .expect("README");
    for line in readme
        .lines()
        .filter(|l| l.contains("modelshare embed --model"))
    {
        assert!(
            line.contains('"'),
            "an unquoted example in the README: {line}"
        );
    }
}
