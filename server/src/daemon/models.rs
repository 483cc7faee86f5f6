//! The start-up models: each loaded in turn, as the admin, for its owner and with its access
//! and placement; the server is ready only once all are.

use tracing::info;

use super::error::ServeError;
use crate::app::App;
use crate::config::StartupModel;
use modelshare_core::error::CoreError;
use modelshare_core::registry::LoadFor;
use modelshare_core::tenants::{Access, Caller};

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
    let load = app
        .host
        .start_load(&Caller::Admin, load_for(m), &m.name, &m.path, false)
        .await
        .map_err(fail)?;
    match load.done.await {
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
