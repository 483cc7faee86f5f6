//! Watching the process at the other end of a Unix-socket session.
//!
//! A worker on the Unix socket is known by its peer credentials (`SO_PEERCRED`, which the
//! kernel fills in; a worker cannot lie about it). A pidfd opened on that pid when the session
//! starts becomes readable when the process exits, so a killed worker's session ends at once
//! even if its connection were somehow kept open (an fd inherited by a child, say). Where the
//! kernel has no pidfd (before 5.3) the watch never fires and the stream's end does the job.

use std::os::fd::OwnedFd;

use rustix::process::{Pid, PidfdFlags, pidfd_open};
use tokio::io::unix::AsyncFd;

use crate::sys;

/// A watch on a peer process.
#[derive(Debug)]
pub struct PeerWatch {
    pid: Option<u32>,
    fd: Option<AsyncFd<OwnedFd>>,
}

impl PeerWatch {
    /// Watches `pid` (no watch for `None`, or where pidfds are not available).
    pub fn open(pid: Option<u32>) -> Self {
        let fd = pid
            .and_then(|p| Pid::from_raw(i32::try_from(p).ok()?))
            .and_then(|p| pidfd_open(p, PidfdFlags::NONBLOCK).ok())
            .and_then(|fd| sys::register_readable(fd).ok());
        Self { pid, fd }
    }

    /// The peer's pid as the kernel reported it.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Whether a pidfd is held.
    pub fn is_watching(&self) -> bool {
        self.fd.is_some()
    }

    /// Resolves when the process has exited; never, without a watch.
    pub async fn exited(&self) {
        match &self.fd {
            Some(fd) => {
                // A pidfd polls readable once the process has exited.
                let _ = fd.readable().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A child's exit must wake the watch promptly (the killed-worker path depends on it).
    #[tokio::test]
    async fn fires_when_the_process_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let watch = PeerWatch::open(Some(child.id()));
        assert!(watch.is_watching(), "this kernel has pidfds");
        let early = tokio::time::timeout(Duration::from_millis(100), watch.exited()).await;
        assert!(early.is_err(), "fired while the process was alive");
        child.kill().expect("kill");
        tokio::time::timeout(Duration::from_secs(1), watch.exited())
            .await
            .expect("no wake-up within 1 s of the kill");
        let _ = child.wait();
    }

    /// Without a pid there is nothing to watch, and no spurious wake-up.
    #[tokio::test]
    async fn no_pid_never_fires() {
        let watch = PeerWatch::open(None);
        assert!(!watch.is_watching());
        let r = tokio::time::timeout(Duration::from_millis(50), watch.exited()).await;
        assert!(r.is_err());
    }
}
