//! The start-up models: each loaded in turn, as the admin, for its owner and with its access
//! and placement; the server is ready only once all are.

use tracing::info;

use super::error::ServeError;
use crate::app::App;
use crate::config::StartupModel;
use modelshare_core::error::CoreError;
use modelshare_core::registry::LoadFor;
use modelshare_core::tenants::{Access, Caller};

/// How often a start-up load still running says how far it is.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// `12.3 GiB`, for the log.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// Loads every start-up model in turn, each to the end; the first failure stops it.
pub(super) async fn load_startup_models(app: &App) -> Result<(), ServeError> {
    for m in &app.config.models {
        load_startup_model(app, m).await?;
    }
    Ok(())
}

/// Loads one start-up model, its owner and the tenants it is shared with checked first.
async fn load_startup_model(app: &App, m: &StartupModel) -> Result<(), ServeError> {
    let fail = |source| ServeError::StartupModel {
        name: m.name.clone(),
        path: m.path.clone(),
        source,
    };
    let table = app.host.tenants.current();
    for t in m.tenant.iter().chain(&m.share_with) {
        if !table.tenants.contains_key(t) {
            return Err(fail(CoreError::UnknownTenant(t.clone())));
        }
    }
    let mut load = app
        .host
        .start_load(&Caller::Admin, load_for(m), &m.name, &m.path, false)
        .await
        .map_err(fail)?;
    info!(
        model = %m.name,
        version = load.version,
        path = %m.path,
        bytes = load.bytes_total,
        tensors = load.tensor_count,
        "loading start-up model {} ({}) from {}",
        m.name,
        gib(load.bytes_total),
        m.path
    );
    let done = loop {
        tokio::select! {
            done = &mut load.done => break done,
            () = tokio::time::sleep(PROGRESS_EVERY) => {
                let copied = load.progress.done.load(std::sync::atomic::Ordering::Relaxed);
                info!(
                    model = %m.name,
                    copied_bytes = copied,
                    bytes = load.bytes_total,
                    "loading start-up model {}: {} of {} copied",
                    m.name,
                    gib(copied),
                    gib(load.bytes_total)
                );
            }
        }
    };
    match done {
        Ok(Ok(v)) => {
            info!(model = %m.name, version = v.version, bytes = v.arena_bytes, tensors = v.tensor_count, "start-up model ready")
        }
        Ok(Err(e)) => return Err(fail(e)),
        Err(_) => return Err(fail(CoreError::Internal("load task vanished".into()))),
    }
    Ok(())
}

/// Whom a start-up model is loaded for: its owner, its access and its placement.
fn load_for(m: &StartupModel) -> LoadFor {
    LoadFor {
        requested_owner: m.tenant.clone(),
        default_owner: None,
        access: Some(Access {
            shared_with: m.share_with.iter().cloned().collect(),
            public: m.public,
        }),
        resume_version: None,
        only_adopted: false,
        placement: modelshare_core::placement::Wanted {
            devices: m.devices.clone(),
            replicas: m.replicas,
        },
    }
}
