//! Tests of the merge of flags, variables and the file, and of the shipped configuration.

use super::*;

fn parse(toml_text: &str) -> FileConfig {
    toml::from_str(toml_text).expect("valid toml")
}

/// Flags must win over the file, and the file over the defaults, field by field.
#[test]
fn flags_override_file_override_defaults() {
    let file = parse(
        r#"
            listen = "127.0.0.1:7000"
            model_root = "/models"
            heartbeat_misses = 5
            [[models]]
            name = "a"
            path = "a"
            [limits]
            max_model_bytes = 100
            "#,
    );
    let args = ServeArgs {
        listen: Some("127.0.0.1:8000".parse().expect("addr")),
        unauthenticated_tcp: Some(true),
        max_model_bytes: Some(7),
        ..ServeArgs::default()
    };
    let c = Config::merge(args, file).expect("config");
    assert_eq!(c.listen, Some("127.0.0.1:8000".parse().expect("addr")));
    assert_eq!(c.model_root, PathBuf::from("/models"));
    assert_eq!(c.heartbeat_misses, 5);
    assert_eq!(c.heartbeat_interval, Duration::from_secs(1));
    assert_eq!(c.registry.max_model_bytes, Some(7));
    assert_eq!(c.models.len(), 1);
}

/// A typo in the file must be an error, not a silently ignored setting.
#[test]
fn unknown_keys_are_refused() {
    assert!(toml::from_str::<FileConfig>("listne = \"127.0.0.1:1\"").is_err());
    assert!(toml::from_str::<FileConfig>("[limits]\nmax_modle_bytes = 1").is_err());
}

/// Nonsense values must be refused at start-up.
#[test]
fn out_of_range_values_are_refused() {
    let args = ServeArgs {
        heartbeat_misses: Some(0),
        ..ServeArgs::default()
    };
    assert!(Config::merge(args, FileConfig::default()).is_err());
    let args = ServeArgs {
        heartbeat_interval_ms: Some(1),
        ..ServeArgs::default()
    };
    assert!(Config::merge(args, FileConfig::default()).is_err());
}

/// A streamed answer's limits come from `[serving]`, bounded; by default a minute idle and an
/// hour in all.
#[test]
fn stream_limits_are_read_and_bounded() {
    let c = Config::merge(ServeArgs::default(), FileConfig::default()).expect("defaults");
    assert_eq!(c.serving.stream_idle, std::time::Duration::from_secs(60));
    assert_eq!(
        c.serving.max_stream_time,
        std::time::Duration::from_secs(3600)
    );
    let file = parse("[serving]\nstream_idle_secs = 5\nmax_stream_secs = 600\n");
    let c = Config::merge(ServeArgs::default(), file).expect("config");
    assert_eq!(c.serving.stream_idle, std::time::Duration::from_secs(5));
    assert_eq!(
        c.serving.max_stream_time,
        std::time::Duration::from_secs(600)
    );
    for bad in ["stream_idle_secs = 0", "max_stream_secs = 100000"] {
        let file = parse(&format!("[serving]\n{bad}\n"));
        assert!(Config::merge(ServeArgs::default(), file).is_err(), "{bad}");
    }
}

/// How a GPU's workers share it: measured by default, or fixed; anything else is refused.
#[test]
fn gpu_sharing_is_read_and_checked() {
    use modelshare_serving::GpuSharing;
    let c = Config::merge(ServeArgs::default(), FileConfig::default()).expect("defaults");
    assert_eq!(c.serving.gpu_sharing, GpuSharing::Auto);
    for (text, want) in [
        ("auto", GpuSharing::Auto),
        ("side-by-side", GpuSharing::SideBySide),
        ("turns", GpuSharing::Turns),
    ] {
        let file = parse(&format!("[serving]\ngpu_sharing = \"{text}\"\n"));
        let c = Config::merge(ServeArgs::default(), file).expect("config");
        assert_eq!(c.serving.gpu_sharing, want, "{text}");
    }
    let file = parse("[serving]\ngpu_sharing = \"mps\"\n");
    let err = Config::merge(ServeArgs::default(), file).expect_err("unknown");
    assert!(err.to_string().contains("gpu_sharing"), "{err}");
}

/// With only a Unix socket, no TCP port must be opened by default.
#[test]
fn unix_only_has_no_tcp_listener() {
    let args = ServeArgs {
        unix_socket: Some("/run/ms/grpc.sock".into()),
        ..ServeArgs::default()
    };
    let c = Config::merge(args, FileConfig::default()).expect("config");
    assert_eq!(c.listen, None);
    assert_eq!(c.handle_socket, PathBuf::from("/run/ms/grpc-handles.sock"));
    // Two servers whose sockets share a folder get two handle sockets.
    let other = ServeArgs {
        unix_socket: Some("/run/ms/other.sock".into()),
        ..ServeArgs::default()
    };
    let c = Config::merge(other, FileConfig::default()).expect("config");
    assert_eq!(c.handle_socket, PathBuf::from("/run/ms/other-handles.sock"));
}

/// Without a tenants file, TCP only when asked for by name, and a default Unix socket of mode
/// 0600; with one, TCP on loopback by default.
#[test]
fn without_tenants_tcp_needs_to_be_asked_for() {
    let tcp = ServeArgs {
        listen: Some("127.0.0.1:1".parse().expect("addr")),
        ..ServeArgs::default()
    };
    let err = Config::merge(tcp.clone(), FileConfig::default()).expect_err("TCP, no tenants");
    assert!(err.to_string().contains("--unauthenticated-tcp"), "{err}");
    let asked = ServeArgs {
        unauthenticated_tcp: Some(true),
        ..tcp.clone()
    };
    assert!(Config::merge(asked, FileConfig::default()).is_ok());
    let in_file = parse("unauthenticated_tcp = true");
    assert!(Config::merge(tcp, in_file).is_ok());

    let c = Config::merge(ServeArgs::default(), FileConfig::default()).expect("defaults");
    assert_eq!(c.listen, None);
    assert_eq!(c.unix_socket, Some(default_unix_socket()));
    assert_eq!(c.unix_socket_mode, Some(0o600));
    let uid = current_uid();
    assert!(
        c.handle_socket
            .ends_with(format!("modelshare-{uid}-handles.sock")),
        "{:?}",
        c.handle_socket
    );

    let with_tenants = parse(r#"tenants_file = "/etc/ms/tenants.toml""#);
    let c = Config::merge(ServeArgs::default(), with_tenants).expect("tenants");
    assert_eq!(c.listen, Some(SocketAddr::from(([127, 0, 0, 1], 50051))));
    assert_eq!(c.unix_socket, None);
}

/// NAME=PATH parsing for --model.
#[test]
fn startup_model_syntax() {
    let m: StartupModel = "tiny=models/tiny".parse().expect("parse");
    assert_eq!(m.name, "tiny");
    assert_eq!(m.path, "models/tiny");
    assert!("tiny".parse::<StartupModel>().is_err());
    assert!("=x".parse::<StartupModel>().is_err());
}

/// TLS needs both files and a TCP listener; the file's `[tls]` table and the flags merge.
#[test]
fn tls_settings_are_checked() {
    let file = parse(
        r#"
            listen = "127.0.0.1:7000"
            tenants_file = "/etc/ms/tenants.toml"
            unix_socket_mode = "0660"
            [tls]
            cert = "/c.pem"
            key = "/k.pem"
            client_ca = "/ca.pem"
            "#,
    );
    let c = Config::merge(ServeArgs::default(), file).expect("config");
    let tls = c.tls.expect("tls");
    assert_eq!(tls.client_auth, ClientAuth::Required);
    assert_eq!(tls.client_ca, Some(PathBuf::from("/ca.pem")));
    assert_eq!(c.unix_socket_mode, Some(0o660));
    assert_eq!(c.tenants_file, Some(PathBuf::from("/etc/ms/tenants.toml")));

    let only_cert = ServeArgs {
        listen: Some("127.0.0.1:1".parse().expect("addr")),
        unauthenticated_tcp: Some(true),
        server_tls_cert: Some("/c.pem".into()),
        ..ServeArgs::default()
    };
    assert!(Config::merge(only_cert, FileConfig::default()).is_err());
    let no_tcp = ServeArgs {
        unix_socket: Some("/run/ms.sock".into()),
        server_tls_cert: Some("/c.pem".into()),
        server_tls_key: Some("/k.pem".into()),
        ..ServeArgs::default()
    };
    assert!(Config::merge(no_tcp, FileConfig::default()).is_err());
    let auth_without_ca = ServeArgs {
        listen: Some("127.0.0.1:1".parse().expect("addr")),
        unauthenticated_tcp: Some(true),
        server_tls_cert: Some("/c.pem".into()),
        server_tls_key: Some("/k.pem".into()),
        server_tls_client_auth: Some(ClientAuth::Required),
        ..ServeArgs::default()
    };
    let err = Config::merge(auth_without_ca, FileConfig::default()).expect_err("no CA");
    assert!(err.to_string().contains("client CA"), "{err}");
    assert!(parse_mode("0660").is_ok());
    assert!(parse_mode("0999").is_err());
    assert!(parse_mode("01777").is_err());
}

/// The configuration shipped in the Kubernetes manifest must be one the server accepts.
#[test]
fn the_kubernetes_config_parses() {
    let yaml = include_str!("../../../deploy/k8s/server-daemonset.yaml");
    let body: String = yaml
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("modelshare.toml: |"))
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
        .collect();
    assert!(body.contains("tenants_file"), "{body}");
    let file: FileConfig = toml::from_str(&body).expect("valid config");
    let c = Config::merge(ServeArgs::default(), file).expect("config");
    assert!(c.tls.is_some() && c.tenants_file.is_some());
    assert_eq!(c.unix_socket_mode, Some(0o660));
}

/// The container image's configuration file must be one the server accepts as it stands: no
/// TCP listener and HTTP on loopback (it has no tenants file), the sockets in the shared volume.
#[test]
fn the_image_config_parses() {
    let file: FileConfig =
        toml::from_str(include_str!("../../../deploy/modelshare.toml")).expect("valid config");
    let c = Config::merge(ServeArgs::default(), file).expect("config");
    assert_eq!(c.listen, None);
    assert_eq!(
        c.unix_socket,
        Some(PathBuf::from("/run/modelshare/grpc.sock"))
    );
    assert_eq!(
        c.handle_socket,
        PathBuf::from("/run/modelshare/handles.sock")
    );
    assert_eq!(c.model_root, PathBuf::from("/models"));
    // No tenants file: HTTP on loopback only (compose widens it with --unauthenticated-tcp).
    assert!(c.http_listen.is_some_and(|a| a.ip().is_loopback()));
}

/// Every TOML snippet of the docs must parse as what it shows (a sample that does not parse
/// was once in the README): a block with `[admin]` or `[[tenants]]` as a tenants file, any
/// other as a server configuration; and the shipped tenants example.
#[test]
fn every_toml_snippet_of_the_docs_parses() {
    let docs = [
        ("README.md", include_str!("../../../README.md")),
        (
            "deploy/README.md",
            include_str!("../../../deploy/README.md"),
        ),
        (
            "docs/ARCHITECTURE.md",
            include_str!("../../../docs/ARCHITECTURE.md"),
        ),
        (
            "workers/README.md",
            include_str!("../../../workers/README.md"),
        ),
    ];
    let mut seen = 0;
    for (doc, text) in docs {
        let mut lines = text.lines().enumerate();
        while let Some((at, line)) = lines.next() {
            if line.trim() != "```toml" {
                continue;
            }
            let block: String = lines
                .by_ref()
                .take_while(|(_, l)| l.trim() != "```")
                .map(|(_, l)| format!("{l}\n"))
                .collect();
            seen += 1;
            if block.contains("[admin]") || block.contains("[[tenants]]") {
                if let Err(e) = modelshare_core::tenants::file::TenantTable::parse(&block) {
                    panic!("{doc}:{}: the tenants sample does not parse: {e}", at + 1);
                }
            } else {
                let file: FileConfig = toml::from_str(&block).unwrap_or_else(|e| {
                    panic!("{doc}:{}: the config sample does not parse: {e}", at + 1)
                });
                Config::merge(ServeArgs::default(), file).unwrap_or_else(|e| {
                    panic!("{doc}:{}: the config sample is refused: {e}", at + 1)
                });
            }
        }
    }
    assert!(seen >= 2, "found {seen} TOML blocks");
    let example = include_str!("../../../deploy/tenants.example.toml");
    modelshare_core::tenants::file::TenantTable::parse(example)
        .expect("deploy/tenants.example.toml");
}

/// `devices` takes "all", a comma list, an integer or a TOML list; the old `device` still
/// works; the flag wins; both names at once and repeats are refused. Models take `devices`
/// and `replicas`; `max_device_bytes` sits in `[limits]`.
#[test]
fn device_selection_and_placement_keys() {
    let merged = |toml: &str, flag: Option<&str>| {
        let args = ServeArgs {
            devices: flag.map(str::to_owned),
            ..ServeArgs::default()
        };
        Config::merge(args, parse(toml)).map(|c| c.devices)
    };
    let listed =
        |items: &[&str]| DeviceSelection::Listed(items.iter().map(|s| s.to_string()).collect());
    assert_eq!(merged("", None).unwrap(), DeviceSelection::All);
    assert_eq!(
        merged(r#"devices = "all""#, None).unwrap(),
        DeviceSelection::All
    );
    assert_eq!(
        merged(r#"devices = "0, 1""#, None).unwrap(),
        listed(&["0", "1"])
    );
    assert_eq!(merged("devices = 1", None).unwrap(), listed(&["1"]));
    assert_eq!(
        merged(r#"devices = ["all"]"#, None).unwrap(),
        DeviceSelection::All
    );
    assert_eq!(
        merged(r#"devices = [0, "GPU-x"]"#, None).unwrap(),
        listed(&["0", "GPU-x"])
    );
    assert_eq!(
        merged(r#"device = "GPU-y""#, None).unwrap(),
        listed(&["GPU-y"])
    );
    assert_eq!(
        merged(r#"devices = "0""#, Some("all")).unwrap(),
        DeviceSelection::All
    );
    assert!(merged("devices = \"0\"\ndevice = \"1\"", None).is_err());
    assert!(merged(r#"devices = [1, 1]"#, None).is_err());
    assert!(merged(r#"devices = []"#, None).is_err());

    let c = Config::merge(
        ServeArgs::default(),
        parse(
            r#"
            host_devices = 4
            [[models]]
            name = "a"
            path = "a"
            devices = ["1"]
            [[models]]
            name = "b"
            path = "b"
            replicas = 2
            [limits]
            max_device_bytes = 1000
            "#,
        ),
    )
    .expect("config");
    assert_eq!(c.host_devices, 4);
    assert_eq!(c.max_device_bytes, Some(1000));
    assert_eq!(c.models[0].devices, ["1"]);
    assert_eq!(c.models[1].replicas, 2);
}

/// Host memory figures are read under `/` unless the flag (or its variable) or the file names
/// another root; the flag wins.
#[test]
fn proc_root_defaults_to_slash_and_the_flag_wins() {
    let c = Config::merge(ServeArgs::default(), parse("")).expect("config");
    assert_eq!(c.proc_root, PathBuf::from("/"));
    let c = Config::merge(ServeArgs::default(), parse(r#"proc_root = "/fake""#)).expect("config");
    assert_eq!(c.proc_root, PathBuf::from("/fake"));
    let args = ServeArgs {
        proc_root: Some("/flag".into()),
        ..ServeArgs::default()
    };
    let c = Config::merge(args, parse(r#"proc_root = "/fake""#)).expect("config");
    assert_eq!(c.proc_root, PathBuf::from("/flag"));
}

/// The flags of `serve` as the command line gives them (no variables are read: none of these
/// tests' names is set in the test process).
fn flags(words: &[&str]) -> Result<ServeArgs, clap::Error> {
    #[derive(clap::Parser)]
    struct Line {
        #[command(flatten)]
        serve: ServeArgs,
    }
    let line = std::iter::once("serve").chain(words.iter().copied());
    <Line as clap::Parser>::try_parse_from(line).map(|l| l.serve)
}

/// Booleans follow "flags > variables > file" like every other key: `--x=false` turns off a
/// file's `x = true` (the flags used to be OR'ed with the file, and `=false` was refused).
#[test]
fn boolean_flags_say_true_and_false_and_win_over_the_file() {
    let on = "load_cpu_hash = true\nreplicate_on_attach = true";
    for (words, file, want) in [
        (&[][..], "", false),
        (&[][..], on, true),
        (&["--load-cpu-hash", "--replicate-on-attach"][..], "", true),
        (
            &["--load-cpu-hash=true", "--replicate-on-attach=true"][..],
            "",
            true,
        ),
        (
            &["--load-cpu-hash=false", "--replicate-on-attach=false"][..],
            on,
            false,
        ),
        (
            &["--load-cpu-hash=no", "--replicate-on-attach=off"][..],
            on,
            false,
        ),
    ] {
        let args = flags(words).unwrap_or_else(|e| panic!("{words:?}: {e}"));
        let c = Config::merge(args, parse(file)).expect("config");
        assert_eq!(
            (c.load_cpu_hash, c.replicate_on_attach),
            (want, want),
            "{words:?} over {file:?}"
        );
    }
    assert!(flags(&["--load-cpu-hash=maybe"]).is_err());

    // `unauthenticated_tcp = true` in a file, turned off by the flag: TCP without tenants is
    // refused again.
    let tcp = ["--listen", "127.0.0.1:1"];
    let file = "unauthenticated_tcp = true";
    assert!(Config::merge(flags(&tcp).expect("flags"), parse(file)).is_ok());
    let off = flags(&[tcp[0], tcp[1], "--unauthenticated-tcp=false"]).expect("flags");
    let err = Config::merge(off, parse(file)).expect_err("turned off");
    assert!(err.to_string().contains("--unauthenticated-tcp"), "{err}");
}

/// HTTP beyond loopback without a tenants file would no longer be refused (every caller the
/// admin), or loopback, a tenants file or the one opt-in would no longer be accepted.
#[test]
fn http_beyond_loopback_needs_tenants_or_the_opt_in() {
    let refused = Config::merge(
        flags(&["--http-listen", "0.0.0.0:9400"]).expect("flags"),
        parse(""),
    )
    .expect_err("open HTTP without tenants");
    let text = refused.to_string();
    assert!(
        text.contains("HTTP on 0.0.0.0:9400 without a tenants file")
            && text.contains("--http-listen 127.0.0.1:9400")
            && text.contains("--unauthenticated-tcp"),
        "{text}"
    );
    // The image's file said so: refused the same way.
    assert!(
        Config::merge(
            flags(&[]).expect("flags"),
            parse("http_listen = \"[::]:9400\"")
        )
        .is_err()
    );
    for words in [
        &["--http-listen", "127.0.0.1:9400"][..],
        &["--http-listen", "[::1]:9400"],
        &["--http-listen", "0.0.0.0:9400", "--unauthenticated-tcp"],
    ] {
        let args = flags(words).expect("flags");
        assert!(Config::merge(args, parse("")).is_ok(), "{words:?}");
    }
    let tenants = tempfile::NamedTempFile::new().expect("tmp");
    let path = tenants.path().to_str().expect("utf-8");
    let args = flags(&["--http-listen", "0.0.0.0:9400", "--tenants-file", path]).expect("flags");
    let c = Config::merge(args, parse("")).expect("with tenants");
    assert_eq!(c.http_listen.map(|a| a.port()), Some(9400));
}
