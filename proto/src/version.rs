//! The protocol version: which contract a worker and a server speak on a session.
//!
//! The worker says the newest version it speaks in `Hello.protocol_version`; the server answers
//! the version the session speaks in `Welcome.protocol_version` ([`negotiate`]): the worker's,
//! or the server's newest when the worker's is newer (the worker then decides whether it can go
//! on: [`accept`]). A worker older than the server's oldest version is refused with
//! FAILED_PRECONDITION. A field of 0 is a peer built before the field existed: version 1.
//!
//! The version counts changes of meaning the wire cannot show (a field that must now be set, a
//! rule of a stream); a wire-incompatible change of the `.proto` files is refused by the
//! wire check whatever the version (see the crate's documentation).

/// The version of the contract this crate describes.
pub const PROTOCOL_VERSION: u32 = 1;

/// The oldest version a peer built from this crate still speaks.
pub const MIN_PROTOCOL_VERSION: u32 = 1;

// An empty range would refuse every session.
const _: () = assert!(MIN_PROTOCOL_VERSION >= 1 && MIN_PROTOCOL_VERSION <= PROTOCOL_VERSION);

/// Why a session cannot go on: the two sides share no version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// The worker speaks only versions older than the server's oldest.
    #[error(
        "the worker speaks protocol version {worker}, older than the oldest this server speaks \
         ({min}; it speaks {min} to {current}): upgrade the worker's modelshare SDK"
    )]
    WorkerTooOld {
        /// The worker's version (0 already read as 1).
        worker: u32,
        /// The server's oldest version.
        min: u32,
        /// The server's newest version.
        current: u32,
    },
    /// The server answered a version older than the worker's oldest.
    #[error(
        "the server speaks protocol version {server}, older than the oldest this worker speaks \
         ({min}; it speaks {min} to {current}): upgrade the server, or use a worker built with \
         an older modelshare SDK"
    )]
    ServerTooOld {
        /// The server's answer (0 already read as 1).
        server: u32,
        /// The worker's oldest version.
        min: u32,
        /// The worker's newest version.
        current: u32,
    },
    /// The server answered a version newer than the worker said it speaks: a faulty server
    /// (it must answer at most the hello's version).
    #[error(
        "the server answered protocol version {server}, newer than the newest this worker \
         speaks ({current}), which its hello said"
    )]
    ServerTooNew {
        /// The server's answer.
        server: u32,
        /// The worker's newest version.
        current: u32,
    },
}

/// The version a `protocol_version` field stands for: 0 (the field absent, a peer built before
/// it existed) is version 1.
pub fn effective(field: u32) -> u32 {
    field.max(1)
}

/// The server's answer to a hello saying `worker`, for a server that speaks `min` to `current`:
/// the session's version, or why the worker is refused.
pub fn negotiate(worker: u32, min: u32, current: u32) -> Result<u32, VersionError> {
    let worker = effective(worker);
    if worker < min {
        return Err(VersionError::WorkerTooOld {
            worker,
            min,
            current,
        });
    }
    Ok(worker.min(current))
}

/// [`negotiate`] for a server built from this crate ([`MIN_PROTOCOL_VERSION`] to
/// [`PROTOCOL_VERSION`]).
pub fn negotiate_hello(worker: u32) -> Result<u32, VersionError> {
    negotiate(worker, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION)
}

/// Whether a worker that speaks `min` to `current` (and said `current` in its hello) can go on
/// with the version the server's welcome answered: the session's version, or why not.
pub fn accept(server: u32, min: u32, current: u32) -> Result<u32, VersionError> {
    let server = effective(server);
    if server < min {
        return Err(VersionError::ServerTooOld {
            server,
            min,
            current,
        });
    }
    if server > current {
        return Err(VersionError::ServerTooNew { server, current });
    }
    Ok(server)
}

/// [`accept`] for a worker built from this crate ([`MIN_PROTOCOL_VERSION`] to
/// [`PROTOCOL_VERSION`]).
pub fn accept_welcome(server: u32) -> Result<u32, VersionError> {
    accept(server, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server would not answer the session's version: a worker's own when the server speaks
    /// it, the server's newest when the worker is newer, 1 for a worker that sends nothing.
    #[test]
    fn negotiate_answers_the_version_both_speak() {
        assert_eq!(negotiate(3, 2, 5), Ok(3));
        assert_eq!(negotiate(2, 2, 5), Ok(2));
        assert_eq!(negotiate(5, 2, 5), Ok(5));
        assert_eq!(negotiate(99, 2, 5), Ok(5));
        assert_eq!(negotiate(0, 1, 5), Ok(1));
        assert_eq!(negotiate_hello(0), Ok(1));
        assert_eq!(negotiate_hello(PROTOCOL_VERSION), Ok(PROTOCOL_VERSION));
        assert_eq!(negotiate_hello(99), Ok(PROTOCOL_VERSION));
    }

    /// A worker older than the server's oldest would be let in (and misread), or refused with a
    /// message that does not say what to do.
    #[test]
    fn negotiate_refuses_a_worker_older_than_the_minimum() {
        let refused = negotiate(2, 3, 4).unwrap_err();
        assert_eq!(
            refused,
            VersionError::WorkerTooOld {
                worker: 2,
                min: 3,
                current: 4
            }
        );
        assert_eq!(
            refused.to_string(),
            "the worker speaks protocol version 2, older than the oldest this server speaks \
             (3; it speaks 3 to 4): upgrade the worker's modelshare SDK"
        );
        // An old worker's absent field is version 1: refused once the minimum passes 1.
        assert_eq!(
            negotiate(0, 2, 2),
            Err(VersionError::WorkerTooOld {
                worker: 1,
                min: 2,
                current: 2
            })
        );
    }

    /// A worker would go on with a server whose version it does not speak, or refuse an old
    /// server (0: before the field) that it does speak.
    #[test]
    fn accept_takes_only_versions_the_worker_speaks() {
        assert_eq!(accept(0, 1, 1), Ok(1));
        assert_eq!(accept_welcome(0), Ok(1));
        assert_eq!(accept_welcome(PROTOCOL_VERSION), Ok(PROTOCOL_VERSION));
        assert_eq!(accept(2, 2, 3), Ok(2));
        let old = accept(1, 2, 3).unwrap_err();
        assert_eq!(
            old,
            VersionError::ServerTooOld {
                server: 1,
                min: 2,
                current: 3
            }
        );
        assert!(old.to_string().contains("upgrade the server"), "{old}");
        assert_eq!(
            accept(0, 2, 3),
            Err(VersionError::ServerTooOld {
                server: 1,
                min: 2,
                current: 3
            })
        );
        assert_eq!(
            accept(4, 2, 3),
            Err(VersionError::ServerTooNew {
                server: 4,
                current: 3
            })
        );
    }
}
