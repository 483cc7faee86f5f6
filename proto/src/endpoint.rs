//! Where a server listens when nothing says otherwise, computed in one place so that the server
//! (which listens there) and its clients (the CLI and the workers, which look there) agree.
//!
//! - [`default_unix_socket`]: the per-user socket, `$TMPDIR/modelshare-<uid>.sock` (`/tmp` when
//!   `TMPDIR` is unset): where a server without tenants and without listeners serves gRPC.
//! - [`CONTAINER_SOCKET`]: the socket the container image and the Kubernetes manifests serve
//!   on (`deploy/`), which workers in a pod beside the server find mounted.
//! - [`DEFAULT_TCP`]: the TCP address of a server with a tenants file and no listener given.
//!
//! Pure functions of what they are given, plus [`current_uid`], read from `/proc/self/status`
//! (this crate has no system-call crate: the server passes the uid it gets from the kernel).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

/// The gRPC socket of the container image and the Kubernetes manifests.
pub const CONTAINER_SOCKET: &str = "/run/modelshare/grpc.sock";

/// The gRPC TCP address of a server with a tenants file and neither `--listen` nor
/// `--unix-socket`: `127.0.0.1:50051`.
pub const DEFAULT_TCP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 50051);

/// The per-user gRPC socket in `temp_dir` (the server and the clients pass
/// `std::env::temp_dir()`: `$TMPDIR`, else `/tmp`) of the user `uid`:
/// `<temp_dir>/modelshare-<uid>.sock`.
pub fn default_unix_socket(temp_dir: &Path, uid: u32) -> PathBuf {
    temp_dir.join(format!("modelshare-{uid}.sock"))
}

/// The real uid of this process (as `getuid` says), from the `Uid:` line of
/// `/proc/self/status`; `None` where that cannot be read (no procfs).
pub fn current_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    uid_of_status(&status)
}

/// The real uid in the text of `/proc/<pid>/status`: the first number of its `Uid:` line
/// (real, effective, saved, filesystem).
fn uid_of_status(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|real| real.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name is the contract between the server and its clients: a change on one side only
    /// would leave every client looking in the wrong place.
    #[test]
    fn the_per_user_socket_is_named_by_uid_in_the_temp_dir() {
        assert_eq!(
            default_unix_socket(Path::new("/tmp"), 1000),
            PathBuf::from("/tmp/modelshare-1000.sock")
        );
        assert_eq!(
            default_unix_socket(Path::new("/run/user/7/tmp"), 0),
            PathBuf::from("/run/user/7/tmp/modelshare-0.sock")
        );
        assert_eq!(DEFAULT_TCP.to_string(), "127.0.0.1:50051");
    }

    /// The real uid is the first of four; the effective one (second) would name another user's
    /// socket in a setuid process.
    #[test]
    fn the_real_uid_is_read_from_the_status_text() {
        let status = "Name:\tcat\nUmask:\t0022\nState:\tR (running)\nUid:\t1000\t0\t0\t0\nGid:\t5\t5\t5\t5\n";
        assert_eq!(uid_of_status(status), Some(1000));
        assert_eq!(uid_of_status("Name:\tcat\n"), None);
        assert_eq!(uid_of_status("Uid:\tx\t0\t0\t0\n"), None);
    }

    /// This process's uid is the owner of the files it creates (no setuid in a test).
    #[test]
    fn the_current_uid_owns_what_this_process_creates() {
        use std::os::unix::fs::MetadataExt;
        let file = std::env::temp_dir().join(format!("modelshare-uid-{}", std::process::id()));
        std::fs::write(&file, b"").expect("write");
        let owner = std::fs::metadata(&file).expect("metadata").uid();
        std::fs::remove_file(&file).expect("remove");
        assert_eq!(current_uid(), Some(owner));
    }
}
