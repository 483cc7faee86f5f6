//! The tenants' commands: `reload-tenants` on the server, and `token new` and `token hash`,
//! which need no server.

use std::io::BufRead;

use modelshare_core::tenants::token::{TokenHash, generate};
use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use modelshare_worker::{AuthChannel, Token};

use super::error::rpc;
use super::output::{self, OutputFormat};

/// `modelshare reload-tenants`: prints the tenants now in force.
pub(super) async fn reload(
    admin: &mut AdminServiceClient<AuthChannel>,
    out: OutputFormat,
) -> anyhow::Result<()> {
    let r = admin
        .reload_tenants(pb::ReloadTenantsRequest {})
        .await
        .map_err(rpc("ReloadTenants"))?
        .into_inner();
    output::tenants_reloaded(&r, out);
    Ok(())
}

/// `modelshare token new`: a new random token and its hash; no server involved.
pub(super) fn new_token(out: OutputFormat) -> anyhow::Result<()> {
    let token = generate().map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    let hash = TokenHash::of(&token).to_string();
    output::new_token(&token, &hash, out);
    Ok(())
}

/// `modelshare token hash`: the hash of the token on stdin (its first line); no server
/// involved.
pub(super) fn hash_token(out: OutputFormat) -> anyhow::Result<()> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    // Validated as a worker would send it, so the hash is of what arrives.
    let token = Token::new(line)?;
    output::token_hash(&TokenHash::of(token.expose_secret()).to_string(), out);
    Ok(())
}
