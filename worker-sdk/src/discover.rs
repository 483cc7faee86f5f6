//! Finding the server: the one rule by which the CLI, the workers and any worker on this SDK
//! pick the address to connect to when they are given none.
//!
//! The first of these that applies:
//! 1. the address the caller was given (its `--server`), as is;
//! 2. `MODELSHARE_SERVER`, as is;
//! 3. this user's socket, `$TMPDIR/modelshare-<uid>.sock` (`/tmp` without `TMPDIR`), where
//!    `modelshare serve` listens without a tenants file or listeners: taken if a socket is
//!    there;
//! 4. the container socket, `/run/modelshare/grpc.sock` (the image's and the manifests'):
//!    taken if a socket is there;
//! 5. `http://127.0.0.1:50051`, where `modelshare serve` listens with a tenants file and no
//!    listener given: taken if something there accepts a connection.
//!
//! An empty flag or variable counts as not given. An address given (1, 2) is taken without
//! looking at it: connecting is what tells whether a server is there, and a worker waits for a
//! server restarting behind it. The places of 3 to 5 are named by
//! [`modelshare_proto::endpoint`], as the server names them. When none applies,
//! [`DiscoverError`] lists every place looked at, with why it was not taken, and says how to
//! give the address.
//!
//! [`discover`] reads this process's environment; [`discover_in`] takes an [`Env`] instead
//! (the environment is process-wide: tests build their own).

use std::fmt;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use modelshare_proto::endpoint::{self, CONTAINER_SOCKET, DEFAULT_TCP};

/// The variable that names the server when no address is given.
pub const ENV_SERVER: &str = "MODELSHARE_SERVER";

/// How long the rule waits for the TCP address to accept a connection (on loopback a refusal
/// is immediate; this bounds a host that drops packets to it).
const TCP_PROBE: Duration = Duration::from_millis(300);

/// Where an address came from, in the rule's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The address the caller was given (`--server`).
    Flag,
    /// `MODELSHARE_SERVER`.
    Env,
    /// This user's socket, `$TMPDIR/modelshare-<uid>.sock`.
    UserSocket,
    /// The container socket, `/run/modelshare/grpc.sock`.
    ContainerSocket,
    /// The TCP address of a server with tenants, `127.0.0.1:50051`.
    DefaultTcp,
}

/// `--server`, `MODELSHARE_SERVER`, `this user's socket`, ...: what a person reads in a log line
/// or an error.
impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Flag => "--server",
            Source::Env => ENV_SERVER,
            Source::UserSocket => "this user's socket",
            Source::ContainerSocket => "the container socket",
            Source::DefaultTcp => "the TCP address of a server with tenants",
        })
    }
}

/// A server address the rule found, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAddress {
    /// The address, as [`crate::connect::channel_with`] takes it: `unix:/path`,
    /// `http://host:port`, `https://host:port`.
    pub address: String,
    /// Where it came from.
    pub source: Source,
}

/// `unix:/tmp/modelshare-1000.sock (this user's socket)`.
impl fmt::Display for ServerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.address, self.source)
    }
}

/// One place the rule looked at, and why it was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Miss {
    /// What was looked at: `--server`, `this user's socket unix:/tmp/modelshare-1000.sock`, ...
    pub place: String,
    /// Why it was not taken: `not given`, `no such file`, `connection refused`, ...
    pub why: String,
}

/// No address was given and no server was found where one listens by default.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no modelshare server found ({}): give its address with --server unix:/path/to/socket, \
     http://host:port or https://host:port, or set {ENV_SERVER}",
    list(.looked)
)]
pub struct DiscoverError {
    /// Every place looked at, in the rule's order.
    pub looked: Vec<Miss>,
}

/// `place: why; place: why; ...`
fn list(looked: &[Miss]) -> String {
    let parts: Vec<String> = looked
        .iter()
        .map(|m| format!("{}: {}", m.place, m.why))
        .collect();
    parts.join("; ")
}

/// What the rule reads besides the flag: the environment of the process and the fixed places.
/// [`Env::current`] is this process's; a test makes its own.
#[derive(Debug, Clone)]
pub struct Env {
    /// The value of `MODELSHARE_SERVER` (not valid UTF-8: replaced lossily, then refused by the
    /// connection naming it).
    pub server: Option<String>,
    /// The directory of this user's socket: `std::env::temp_dir()`, as the server takes it.
    pub temp_dir: PathBuf,
    /// This process's uid (`None`: unknown, and this user's socket is not looked for).
    pub uid: Option<u32>,
    /// The container socket ([`CONTAINER_SOCKET`]).
    pub container_socket: PathBuf,
    /// The TCP address of a server with tenants ([`DEFAULT_TCP`]).
    pub default_tcp: SocketAddr,
}

impl Env {
    /// This process's environment, uid and the fixed places.
    pub fn current() -> Self {
        Self {
            server: std::env::var_os(ENV_SERVER).map(|v| v.to_string_lossy().into_owned()),
            temp_dir: std::env::temp_dir(),
            uid: endpoint::current_uid(),
            container_socket: PathBuf::from(CONTAINER_SOCKET),
            default_tcp: DEFAULT_TCP,
        }
    }
}

/// The server's address by the rule (see the module docs), with `flag` the address the caller
/// was given (its `--server`; `None` or empty: none), in this process's environment.
pub fn discover(flag: Option<&str>) -> Result<ServerAddress, DiscoverError> {
    discover_in(flag, &Env::current())
}

/// [`discover`] in `env` instead of this process's environment.
pub fn discover_in(flag: Option<&str>, env: &Env) -> Result<ServerAddress, DiscoverError> {
    let mut looked = Vec::new();
    let given = |value: Option<&str>, source| {
        value.filter(|v| !v.is_empty()).map(|v| ServerAddress {
            address: v.to_owned(),
            source,
        })
    };
    if let Some(found) = given(flag, Source::Flag) {
        return Ok(found);
    }
    looked.push(miss(Source::Flag, "not given"));
    if let Some(found) = given(env.server.as_deref(), Source::Env) {
        return Ok(found);
    }
    looked.push(miss(Source::Env, "not set"));
    match env.uid {
        Some(uid) => {
            let path = endpoint::default_unix_socket(&env.temp_dir, uid);
            if let Some(found) = socket(&path, Source::UserSocket, &mut looked) {
                return Ok(found);
            }
        }
        None => looked.push(Miss {
            place: format!("{} in {}", Source::UserSocket, env.temp_dir.display()),
            why: "this process's uid is unknown (no /proc/self/status)".into(),
        }),
    }
    if let Some(found) = socket(&env.container_socket, Source::ContainerSocket, &mut looked) {
        return Ok(found);
    }
    let address = format!("http://{}", env.default_tcp);
    match TcpStream::connect_timeout(&env.default_tcp, TCP_PROBE) {
        Ok(_) => Ok(ServerAddress {
            address,
            source: Source::DefaultTcp,
        }),
        Err(e) => {
            let why = match e.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
                std::io::ErrorKind::TimedOut => {
                    format!("no answer within {} ms", TCP_PROBE.as_millis())
                }
                _ => e.to_string(),
            };
            looked.push(Miss {
                place: format!("{} {address}", Source::DefaultTcp),
                why,
            });
            Err(DiscoverError { looked })
        }
    }
}

/// A place looked at by name only (the flag, the variable).
fn miss(source: Source, why: &str) -> Miss {
    Miss {
        place: source.to_string(),
        why: why.to_owned(),
    }
}

/// `unix:<path>` when a socket is at `path`; else why not, added to `looked`.
fn socket(path: &Path, source: Source, looked: &mut Vec<Miss>) -> Option<ServerAddress> {
    let address = format!("unix:{}", path.display());
    let why = match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_socket() => return Some(ServerAddress { address, source }),
        Ok(_) => "not a socket".to_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "no such file".to_owned(),
        Err(e) => format!("cannot be looked at: {e}"),
    };
    looked.push(Miss {
        place: format!("{source} {address}"),
        why,
    });
    None
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::os::unix::net::UnixListener;

    use super::*;

    /// A temporary directory standing in for `$TMPDIR` and `/run/modelshare`, with nothing in
    /// it, and a TCP address nothing listens on.
    struct Scene {
        _dir: tempfile::TempDir,
        env: Env,
    }

    const UID: u32 = 4242;

    impl Scene {
        fn new() -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            let env = Env {
                server: None,
                temp_dir: dir.path().join("tmp"),
                uid: Some(UID),
                container_socket: dir.path().join("run/modelshare/grpc.sock"),
                default_tcp: refused_address(),
            };
            std::fs::create_dir_all(&env.temp_dir).expect("mkdir tmp");
            std::fs::create_dir_all(env.container_socket.parent().expect("parent"))
                .expect("mkdir run");
            Self { _dir: dir, env }
        }

        fn user_socket(&self) -> PathBuf {
            self.env.temp_dir.join(format!("modelshare-{UID}.sock"))
        }
    }

    /// A loopback address that refuses connections: a port bound, then let go.
    fn refused_address() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    }

    fn found(flag: Option<&str>, env: &Env) -> ServerAddress {
        discover_in(flag, env).unwrap_or_else(|e| panic!("nothing found: {e}"))
    }

    /// The flag wins over the variable and over sockets that exist; the variable over the
    /// sockets. Fails if the order is changed or a given address is second-guessed.
    #[test]
    fn a_given_address_wins_in_order() {
        let mut scene = Scene::new();
        let _user = UnixListener::bind(scene.user_socket()).expect("bind user socket");
        let _container = UnixListener::bind(&scene.env.container_socket).expect("bind");
        scene.env.server = Some("http://from-env:1".into());
        assert_eq!(
            found(Some("unix:/given/by/flag.sock"), &scene.env),
            ServerAddress {
                address: "unix:/given/by/flag.sock".into(),
                source: Source::Flag
            }
        );
        // An empty flag is no flag.
        assert_eq!(
            found(Some(""), &scene.env),
            ServerAddress {
                address: "http://from-env:1".into(),
                source: Source::Env
            }
        );
        // An address given is taken as is, even where nothing listens.
        scene.env.server = Some("unix:/nonexistent/grpc.sock".into());
        assert_eq!(
            found(None, &scene.env).address,
            "unix:/nonexistent/grpc.sock"
        );
        // An empty variable is no variable: this user's socket comes next.
        scene.env.server = Some(String::new());
        assert_eq!(
            found(None, &scene.env),
            ServerAddress {
                address: format!("unix:{}", scene.user_socket().display()),
                source: Source::UserSocket
            }
        );
    }

    /// This user's socket comes before the container socket, and each is taken only when a
    /// socket is there: a plain file in its place is passed over.
    #[test]
    fn sockets_are_taken_only_where_a_socket_is() {
        let scene = Scene::new();
        let _container = UnixListener::bind(&scene.env.container_socket).expect("bind");
        assert_eq!(
            found(None, &scene.env),
            ServerAddress {
                address: format!("unix:{}", scene.env.container_socket.display()),
                source: Source::ContainerSocket
            }
        );
        std::fs::write(scene.user_socket(), b"").expect("a plain file");
        assert_eq!(found(None, &scene.env).source, Source::ContainerSocket);
        std::fs::remove_file(scene.user_socket()).expect("rm");
        let _user = UnixListener::bind(scene.user_socket()).expect("bind user socket");
        assert_eq!(found(None, &scene.env).source, Source::UserSocket);
    }

    /// With no socket, the TCP address of a server with tenants is taken when something
    /// accepts connections there.
    #[test]
    fn the_tcp_address_is_taken_when_it_accepts() {
        let mut scene = Scene::new();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        scene.env.default_tcp = listener.local_addr().expect("addr");
        assert_eq!(
            found(None, &scene.env),
            ServerAddress {
                address: format!("http://{}", scene.env.default_tcp),
                source: Source::DefaultTcp
            }
        );
    }

    /// With nothing anywhere, the error names every place with why it was not taken, in
    /// order, and how to give the address. Fails if a place is left out of the message.
    #[test]
    fn the_failure_lists_every_place_and_why() {
        let scene = Scene::new();
        std::fs::write(&scene.env.container_socket, b"").expect("a plain file");
        let err = discover_in(None, &scene.env).expect_err("nothing is there");
        let user = format!("unix:{}", scene.user_socket().display());
        let container = format!("unix:{}", scene.env.container_socket.display());
        let tcp = format!("http://{}", scene.env.default_tcp);
        let places: Vec<(&str, &str)> = err
            .looked
            .iter()
            .map(|m| (m.place.as_str(), m.why.as_str()))
            .collect();
        assert_eq!(
            places,
            [
                ("--server", "not given"),
                ("MODELSHARE_SERVER", "not set"),
                (
                    format!("this user's socket {user}").as_str(),
                    "no such file"
                ),
                (
                    format!("the container socket {container}").as_str(),
                    "not a socket"
                ),
                (
                    format!("the TCP address of a server with tenants {tcp}").as_str(),
                    "connection refused"
                ),
            ]
        );
        let text = err.to_string();
        assert!(text.starts_with("no modelshare server found ("), "{text}");
        let mut at = 0;
        for (place, why) in &places {
            let here = text[at..]
                .find(&format!("{place}: {why}"))
                .unwrap_or_else(|| panic!("'{place}: {why}' missing or out of order: {text}"));
            at += here;
        }
        assert!(
            text.ends_with(
                "give its address with --server unix:/path/to/socket, http://host:port or \
                 https://host:port, or set MODELSHARE_SERVER"
            ),
            "{text}"
        );
    }

    /// Without a uid this user's socket cannot be named: the failure says so instead of
    /// naming another user's socket.
    #[test]
    fn an_unknown_uid_is_said() {
        let mut scene = Scene::new();
        scene.env.uid = None;
        let err = discover_in(None, &scene.env).expect_err("nothing is there");
        assert_eq!(err.looked.len(), 5, "{err}");
        assert!(
            err.looked[2].why.contains("uid is unknown"),
            "{:?}",
            err.looked[2]
        );
    }

    /// The process's environment is read as the server reads it: the same temporary directory
    /// and the uid the kernel gives.
    #[test]
    fn the_current_env_names_the_servers_socket() {
        let env = Env::current();
        assert_eq!(env.temp_dir, std::env::temp_dir());
        assert!(env.uid.is_some());
        assert_eq!(env.container_socket, Path::new("/run/modelshare/grpc.sock"));
        assert_eq!(env.default_tcp.to_string(), "127.0.0.1:50051");
    }
}
