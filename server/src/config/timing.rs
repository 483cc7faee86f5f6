//! The server's clocks: the workers' heartbeats, the fd-passing tickets' lifetime, the wait
//! for adoption after a restart, and the grace period at shutdown.

use std::time::Duration;

use super::args::ServeArgs;
use super::error::ConfigError;
use super::file::FileConfig;

/// The durations of the merged configuration.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    /// Grace period for in-flight requests at shutdown.
    pub(super) shutdown_grace: Duration,
    /// Heartbeat interval announced to workers.
    pub(super) heartbeat_interval: Duration,
    /// Missed heartbeats that end a session.
    pub(super) heartbeat_misses: u32,
    /// How long an fd-passing ticket stays valid.
    pub(super) ticket_ttl: Duration,
    /// How long, after a restart, to wait for workers to offer the memory of the versions.
    pub(super) adopt_wait: Duration,
}

impl Timing {
    /// Merges the flags over the file over the defaults, checking the heartbeat's interval
    /// (10 ms to 10 minutes) and misses (at least 1).
    pub(super) fn merge(args: &ServeArgs, file: &FileConfig) -> Result<Self, ConfigError> {
        let heartbeat_interval_ms = args
            .heartbeat_interval_ms
            .or(file.heartbeat_interval_ms)
            .unwrap_or(1000);
        if !(10..=600_000).contains(&heartbeat_interval_ms) {
            return Err(ConfigError::Invalid(format!(
                "heartbeat_interval_ms must be between 10 and 600000, got {heartbeat_interval_ms}"
            )));
        }
        let heartbeat_misses = args.heartbeat_misses.or(file.heartbeat_misses).unwrap_or(3);
        if heartbeat_misses == 0 {
            return Err(ConfigError::Invalid(
                "heartbeat_misses must be at least 1".into(),
            ));
        }
        Ok(Self {
            shutdown_grace: Duration::from_secs(
                args.shutdown_grace_secs
                    .or(file.shutdown_grace_secs)
                    .unwrap_or(10),
            ),
            heartbeat_interval: Duration::from_millis(u64::from(heartbeat_interval_ms)),
            heartbeat_misses,
            ticket_ttl: Duration::from_millis(file.ticket_ttl_ms.unwrap_or(30_000)),
            adopt_wait: Duration::from_millis(
                args.adopt_wait_ms.or(file.adopt_wait_ms).unwrap_or(10_000),
            ),
        })
    }
}
