//! What each expiry of the [timer](modelshare_core::timer) does: close an unredeemed ticket, end a
//! silent session, end the sessions that outlived an unload's drain deadline.

use tokio::time::Instant;
use tracing::warn;

use crate::app::App;
use modelshare_core::timer::Expiry;

/// Handles `expiry`; returns when to look at it again (a heartbeat renewed meanwhile).
pub fn handle(app: &App, expiry: &Expiry) -> Option<Instant> {
    match expiry {
        Expiry::Ticket { lease, ticket } => {
            app.host.registry.expire_ticket(lease, ticket);
            None
        }
        Expiry::Heartbeat { session } => {
            let deadline = app.config.heartbeat_interval * app.config.heartbeat_misses;
            crate::sessions::heartbeat_due(app, session, deadline)
        }
        Expiry::Drain {
            model,
            generation,
            versions,
        } => {
            let ended = app
                .host
                .registry
                .force_drained(model, *generation, versions);
            if ended > 0 {
                warn!(model = %model, sessions = ended, "drain deadline passed; ended the sessions still holding the model");
            }
            None
        }
    }
}
