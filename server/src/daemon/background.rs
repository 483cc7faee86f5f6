//! The daemon's background tasks, for as long as it runs: the timer of every expiry, the
//! dispatch of model events to the live sessions, the sweep of held-memory records, and the
//! reload of the tenants file on SIGHUP.

use tracing::{info, warn};

use crate::app::App;

/// How often the held-memory records are brought in line with the registry.
const HELD_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Starts one timer for every expiry, one dispatcher of model events to the live sessions,
/// and the sweep of held-memory records.
pub(super) fn spawn(app: &App) {
    let app2 = app.clone();
    tokio::spawn(async move {
        let timer = app2.host.timer.clone();
        timer
            .run(app2.host.shutdown.clone(), |e| {
                crate::expiry::handle(&app2, e)
            })
            .await;
    });
    tokio::spawn(crate::sessions::dispatch_events(app.clone()));
    tokio::spawn(sweep_held_records(app.clone()));
}

/// Reads the tenants file again on each SIGHUP, for as long as the server runs.
pub(super) fn spawn_reload_on_sighup(app: &App, hup: std::io::Result<tokio::signal::unix::Signal>) {
    let mut hup = match hup {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot install the SIGHUP handler; reload with the ReloadTenants call");
            return;
        }
    };
    let app = app.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                got = hup.recv() => {
                    if got.is_none() {
                        return;
                    }
                    if app.host.tenants.enabled() {
                        let _ = app.reload_tenants("sighup");
                    } else {
                        info!("SIGHUP: no tenants file is configured; nothing to reload");
                    }
                }
                () = app.host.shutdown.cancelled() => return,
            }
        }
    });
}

/// Removes the records of versions whose memory is gone and drops pending records past their
/// deadline (see [`modelshare_core::held`]), until shutdown.
async fn sweep_held_records(app: App) {
    let mut tick = tokio::time::interval(HELD_SWEEP_EVERY);
    loop {
        tokio::select! {
            () = app.host.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let live = app.host.registry.live_versions();
        let (held, registry) = (app.host.held.clone(), app.host.registry.clone());
        let _ = tokio::task::spawn_blocking(move || {
            held.sweep(&live);
            // Memory revoked workers held: no longer counted once none of them lives.
            let gone: Vec<u64> = registry
                .orphans()
                .into_iter()
                .filter(|o| !o.holders.iter().any(modelshare_core::held::Holder::alive))
                .map(|o| o.id)
                .collect();
            if !gone.is_empty() {
                registry.forget_orphans(&gone);
            }
        })
        .await;
    }
}
