//! Where the server listens: the gRPC TCP address and Unix socket (and their defaults, which
//! hang on whether a tenants file is given), the HTTP port, the handle socket, and the mode
//! of the Unix sockets.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use modelshare_proto::endpoint::{self, DEFAULT_TCP};

use super::args::ServeArgs;
use super::error::ConfigError;
use super::file::FileConfig;
use super::settings::parse_mode;

/// The listeners of the merged configuration, and the tenants file their defaults hang on.
#[derive(Debug, Clone)]
pub(super) struct Listeners {
    /// TCP address for gRPC.
    pub(super) listen: Option<SocketAddr>,
    /// Unix socket for gRPC.
    pub(super) unix_socket: Option<PathBuf>,
    /// HTTP address of the inference doors.
    pub(super) http_listen: Option<SocketAddr>,
    /// HTTP address of the operators' endpoints.
    pub(super) metrics_listen: Option<SocketAddr>,
    /// Handle socket for fd passing.
    pub(super) handle_socket: PathBuf,
    /// Tenants file (none: authentication off).
    pub(super) tenants_file: Option<PathBuf>,
    /// Whether gRPC serves on the default Unix socket (no tenants, no listener given).
    pub(super) default_unix: bool,
}

impl Listeners {
    /// Merges the listeners of the flags and the file, refusing gRPC over TCP, and HTTP beyond
    /// loopback, without a tenants file unless `unauthenticated_tcp` accepts it.
    pub(super) fn merge(args: &ServeArgs, file: &FileConfig) -> Result<Self, ConfigError> {
        let tenants_file = args.tenants_file.clone().or(file.tenants_file.clone());
        let unauthenticated_tcp = args
            .unauthenticated_tcp
            .or(file.unauthenticated_tcp)
            .unwrap_or(false);
        let listen_given = args.listen.or(file.listen);
        let unix_given = args.unix_socket.clone().or(file.unix_socket.clone());
        // Without tenants, gRPC defaults to a Unix socket only this user can reach; with
        // tenants (tokens), to TCP on loopback.
        let default_unix = listen_given.is_none() && unix_given.is_none() && tenants_file.is_none();
        let unix_socket = if default_unix {
            Some(default_unix_socket())
        } else {
            unix_given
        };
        let listen = listen_given.or_else(|| unix_socket.is_none().then_some(DEFAULT_TCP));
        if let Some(addr) = listen
            && tenants_file.is_none()
            && !unauthenticated_tcp
        {
            return Err(ConfigError::Invalid(format!(
                "gRPC over TCP ({addr}) without a tenants file would make anyone who reaches the \
                 port the admin: give --tenants-file, serve on --unix-socket only, or pass \
                 --unauthenticated-tcp (unauthenticated_tcp = true) to accept that"
            )));
        }
        let handle_socket = args
            .handle_socket
            .clone()
            .or(file.handle_socket.clone())
            .unwrap_or_else(|| {
                if default_unix {
                    std::env::temp_dir().join(format!("modelshare-{}-handles.sock", current_uid()))
                } else {
                    default_handle_socket(unix_socket.as_deref())
                }
            });
        let http_listen = args.http_listen.or(file.http_listen);
        let metrics_listen = args.metrics_listen.or(file.metrics_listen);
        // Without tokens every HTTP caller is the admin too: beyond this machine only with the
        // same opt-in as gRPC over TCP.
        if let Some(addr) = http_listen
            && tenants_file.is_none()
            && !unauthenticated_tcp
            && !addr.ip().is_loopback()
        {
            return Err(ConfigError::Invalid(format!(
                "HTTP on {addr} without a tenants file would make anyone who reaches the port \
                 the admin (the OpenAI and KServe doors then take no token): give \
                 --tenants-file, listen on loopback (--http-listen 127.0.0.1:{}), or pass \
                 --unauthenticated-tcp (unauthenticated_tcp = true), which accepts that for gRPC \
                 over TCP and HTTP alike",
                addr.port()
            )));
        }
        Ok(Self {
            listen,
            unix_socket,
            http_listen,
            metrics_listen,
            handle_socket,
            tenants_file,
            default_unix,
        })
    }

    /// The mode of the Unix sockets: the flag's, else the file's (parsed), else 0600 for the
    /// default socket of a server without tenants, else none (as the umask leaves it).
    pub(super) fn socket_mode(
        &self,
        args: &ServeArgs,
        file: &FileConfig,
    ) -> Result<Option<u32>, ConfigError> {
        let unix_socket_mode = match args.unix_socket_mode {
            Some(m) => Some(m),
            None => file
                .unix_socket_mode
                .as_deref()
                .map(parse_mode)
                .transpose()
                .map_err(|e| ConfigError::Invalid(format!("unix_socket_mode: {e}")))?,
        };
        // The default socket of a server without tenants: this user (and root) only.
        Ok(unix_socket_mode.or(self.default_unix.then_some(0o600)))
    }
}

/// The uid this process runs as.
pub(super) fn current_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// The gRPC Unix socket a server without tenants and without listeners serves on, and where
/// clients look for a server when given no address (`modelshare_worker::discover`):
/// `$TMPDIR/modelshare-<uid>.sock` (`/tmp` without `TMPDIR`), named by
/// [`modelshare_proto::endpoint::default_unix_socket`].
pub fn default_unix_socket() -> PathBuf {
    endpoint::default_unix_socket(&std::env::temp_dir(), current_uid())
}

/// Beside the gRPC Unix socket when there is one, named after it (`grpc.sock` →
/// `grpc-handles.sock`), so two servers whose sockets share a folder do not share a handle
/// socket; else in the temporary directory.
fn default_handle_socket(unix_socket: Option<&Path>) -> PathBuf {
    let beside = unix_socket.and_then(|s| {
        let dir = s.parent().filter(|d| !d.as_os_str().is_empty())?;
        let stem = s.file_stem()?.to_str()?;
        Some(dir.join(format!("{stem}-handles.sock")))
    });
    beside.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("modelshare-{}-handles.sock", current_uid()))
    })
}
