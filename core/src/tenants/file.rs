//! The tenants file: TOML, read at start-up and again on SIGHUP or `ReloadTenants`.
//!
//! ```toml
//! [admin]
//! token_hashes = ["sha256:…"]          # `modelshare token new` prints a token and its hash
//!
//! [[tenants]]
//! name = "search"
//! token_hashes = ["sha256:…", "sha256:…"]   # several, to rotate without a gap
//! uids = [1000]                         # optional: only these Unix uids, over the Unix socket
//! model_dir = "search"                  # optional: its load paths are under <model root>/search
//! weight = 2                            # optional: its share of the inference queues (default 1)
//! [tenants.quota]                       # optional; a missing or 0 limit is unlimited
//! device_bytes = 8_589_934_592
//! models = 4
//! sessions = 64
//! leases = 256
//! inflight = 32
//! requests = 128                        # inference requests queued or in flight at once
//! loads = 1
//! max_tokens = 1024                     # generation: most tokens one request may ask
//! prompt_tokens = 8192                  # generation: most prompt tokens (the worker counts)
//! stop_strings = 1                      # generation: most stop strings of one request
//! ```
//!
//! Only hashes are ever in the file; a value that is not `sha256:<64 hex digits>` is refused
//! with its position, never echoed (it may be a pasted token).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::caller::Caller;
use super::quota::Quota;
use super::token::TokenHash;
use crate::names::validate_tenant_name;
use crate::weights::path::normalize_relative;

pub use crate::error::TenantsFileError;

/// Most tenants one file may define.
pub const MAX_TENANTS: usize = 1024;
/// Most token hashes per tenant (or for the admin).
pub const MAX_TOKENS_PER_TENANT: usize = 16;
/// Largest tenants file read.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    admin: RawAdmin,
    #[serde(default)]
    tenants: Vec<RawTenant>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    #[serde(default)]
    token_hashes: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: String,
    #[serde(default)]
    token_hashes: Vec<String>,
    #[serde(default)]
    uids: Vec<u32>,
    model_dir: Option<String>,
    weight: Option<u32>,
    #[serde(default)]
    quota: RawQuota,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQuota {
    device_bytes: Option<u64>,
    models: Option<u32>,
    sessions: Option<u32>,
    leases: Option<u32>,
    inflight: Option<u32>,
    requests: Option<u32>,
    loads: Option<u32>,
    max_tokens: Option<u32>,
    prompt_tokens: Option<u32>,
    stop_strings: Option<u32>,
}

/// One tenant, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSpec {
    /// Name (`[a-z0-9][a-z0-9._-]{0,63}`).
    pub name: String,
    /// Hashes of its tokens.
    pub token_hashes: Vec<TokenHash>,
    /// Unix uids its calls must come from (empty: any, over any listener).
    pub uids: Vec<u32>,
    /// Directory under the model root that its load paths are relative to, and may not leave
    /// (none: the whole model root).
    pub model_dir: Option<String>,
    /// Its weight in the inference queues' fair share (at least 1; default 1).
    pub weight: u32,
    /// Its quota.
    pub quota: Quota,
}

/// Who holds a token, built once per table so that authenticating a call allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Who is calling.
    pub caller: Caller,
    /// Unix uids the tenant is bound to (empty: not bound).
    pub uids: Arc<[u32]>,
}

/// Every tenant and the admin tokens, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantTable {
    /// Tenants by name.
    pub tenants: BTreeMap<String, TenantSpec>,
    /// Hashes of the admin tokens.
    pub admin_hashes: Vec<TokenHash>,
    /// Every hash by its 8-byte prefix, with its holder (see [`TokenHash::prefix`]).
    index: HashMap<u64, Vec<(TokenHash, Holder)>>,
}

/// Keys of the schema, the only words a TOML error may quote back.
const SCHEMA_KEYS: &[&str] = &[
    "admin",
    "tenants",
    "name",
    "token_hashes",
    "uids",
    "model_dir",
    "weight",
    "quota",
    "device_bytes",
    "models",
    "sessions",
    "leases",
    "inflight",
    "requests",
    "loads",
    "max_tokens",
    "prompt_tokens",
    "stop_strings",
];

/// Whether a key the file used may be shown: keys are names, not secrets, unless a token was
/// pasted as one (it starts with the tokens' prefix) or it is no plausible key.
fn key_may_be_shown(key: &str) -> bool {
    !key.starts_with(super::token::TOKEN_PREFIX)
        && (1..=64).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A TOML error without the values it quotes or the line it shows: the line may hold a token
/// pasted by mistake. Keeps the position, the message, quoted words that are schema keys, and
/// the key of an unknown field (`qouta`: a typo to fix, unless it looks like a token).
fn redacted_toml_error(text: &str, e: &toml::de::Error) -> String {
    let place = e.span().map(|span| {
        let before = &text[..span.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        format!("line {line}, column {column}: ")
    });
    let mut message = String::new();
    let mut quoted: Option<(char, String)> = None;
    // In "unknown field `k`, expected ...", the first quoted word is the file's key.
    let mut unknown_key = e.message().starts_with("unknown field");
    for c in e.message().chars() {
        match &mut quoted {
            None if c == '"' || c == '`' => quoted = Some((c, String::new())),
            None => message.push(c),
            Some((q, word)) if c == *q => {
                let is_key = std::mem::take(&mut unknown_key);
                let shown =
                    if SCHEMA_KEYS.contains(&word.as_str()) || (is_key && key_may_be_shown(word)) {
                        word.as_str()
                    } else {
                        "…"
                    };
                message.push_str(&format!("{q}{shown}{q}"));
                quoted = None;
            }
            Some((_, word)) => word.push(c),
        }
    }
    format!("{}{}", place.unwrap_or_default(), message.trim())
}

fn nonzero<T: Default + PartialEq>(v: Option<T>) -> Option<T> {
    v.filter(|x| *x != T::default())
}

/// The token hashes `list` of `owner` (`[admin]`, or a tenant's place in the file), each
/// parsed and checked to be in no other list of the file (`seen` holds those already read).
fn token_hashes(
    list: &[String],
    owner: &str,
    seen: &mut HashSet<TokenHash>,
) -> Result<Vec<TokenHash>, String> {
    if list.len() > MAX_TOKENS_PER_TENANT {
        return Err(format!(
            "{owner}: {} token hashes, more than the limit of {MAX_TOKENS_PER_TENANT}",
            list.len()
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, text)| {
            // The value is never shown: it may be a token pasted by mistake.
            let h: TokenHash = text
                .parse()
                .map_err(|e| format!("{owner}: token_hashes[{i}]: {e}"))?;
            if !seen.insert(h) {
                return Err(format!(
                    "{owner}: token_hashes[{i}] is also listed elsewhere in the file; \
                     a token must belong to one tenant"
                ));
            }
            Ok(h)
        })
        .collect()
}

/// Tenant `t`, found at `at` in the file, validated: its name, token hashes (none listed
/// elsewhere: `seen`), model directory, weight and quota.
fn tenant_spec(
    t: RawTenant,
    at: &str,
    seen: &mut HashSet<TokenHash>,
) -> Result<TenantSpec, String> {
    validate_tenant_name(&t.name).map_err(|e| format!("{at}: tenant name: {e}"))?;
    let token_hashes = token_hashes(&t.token_hashes, at, seen)?;
    let model_dir = t
        .model_dir
        .as_deref()
        .map(|d| {
            normalize_relative(d)
                .map_err(|e| format!("{at}: model_dir '{}': {e}", d.escape_debug()))
        })
        .transpose()?;
    Ok(TenantSpec {
        name: t.name,
        token_hashes,
        uids: t.uids,
        model_dir,
        weight: match t.weight {
            None => 1,
            Some(w @ 1..=1000) => w,
            Some(w) => {
                return Err(format!("{at}: weight must be between 1 and 1000, got {w}"));
            }
        },
        quota: quota(&t.quota),
    })
}

/// A tenant's quota as the file gives it, a missing or 0 limit unlimited.
fn quota(raw: &RawQuota) -> Quota {
    Quota {
        device_bytes: nonzero(raw.device_bytes),
        models: nonzero(raw.models),
        sessions: nonzero(raw.sessions),
        leases: nonzero(raw.leases),
        inflight: nonzero(raw.inflight),
        requests: nonzero(raw.requests),
        loads: nonzero(raw.loads),
        max_tokens: nonzero(raw.max_tokens),
        prompt_tokens: nonzero(raw.prompt_tokens),
        stop_strings: nonzero(raw.stop_strings),
    }
}

/// Every token hash by its prefix, with its holder: the admin's, then each tenant's.
fn holder_index(
    admin_hashes: &[TokenHash],
    tenants: &BTreeMap<String, TenantSpec>,
) -> HashMap<u64, Vec<(TokenHash, Holder)>> {
    let mut index: HashMap<u64, Vec<(TokenHash, Holder)>> = HashMap::new();
    let admin = Holder {
        caller: Caller::Admin,
        uids: Arc::from([]),
    };
    for h in admin_hashes {
        index
            .entry(h.prefix())
            .or_default()
            .push((*h, admin.clone()));
    }
    for t in tenants.values() {
        let holder = Holder {
            caller: Caller::Tenant {
                name: Arc::from(t.name.as_str()),
                quota: t.quota,
            },
            uids: Arc::from(t.uids.as_slice()),
        };
        for h in &t.token_hashes {
            index
                .entry(h.prefix())
                .or_default()
                .push((*h, holder.clone()));
        }
    }
    index
}

impl TenantTable {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Self, TenantsFileError> {
        let shown = path.display().to_string();
        let read_err = |source| TenantsFileError::Read {
            path: shown.clone(),
            source,
        };
        let len = std::fs::metadata(path).map_err(read_err)?.len();
        if len > MAX_FILE_BYTES {
            return Err(TenantsFileError::Invalid {
                path: shown,
                reason: format!("{len} bytes, more than the limit of {MAX_FILE_BYTES}"),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        Self::parse(&text).map_err(|reason| TenantsFileError::Invalid {
            path: shown,
            reason,
        })
    }

    /// Parses and validates the text of a tenants file.
    pub fn parse(text: &str) -> Result<Self, String> {
        let raw: RawFile = toml::from_str(text).map_err(|e| redacted_toml_error(text, &e))?;
        if raw.tenants.len() > MAX_TENANTS {
            return Err(format!(
                "{} tenants, more than the limit of {MAX_TENANTS}",
                raw.tenants.len()
            ));
        }
        let mut seen = HashSet::new();
        let admin_hashes = token_hashes(&raw.admin.token_hashes, "[admin]", &mut seen)?;
        let mut tenants = BTreeMap::new();
        for (i, t) in raw.tenants.into_iter().enumerate() {
            let at = format!("tenants[{i}] ('{}')", t.name.escape_debug());
            let spec = tenant_spec(t, &at, &mut seen)?;
            if tenants.insert(spec.name.clone(), spec).is_some() {
                return Err(format!("{at}: a tenant of that name is already defined"));
            }
        }
        let index = holder_index(&admin_hashes, &tenants);
        Ok(Self {
            tenants,
            admin_hashes,
            index,
        })
    }

    /// Who holds the token whose hash is `presented`: candidates by prefix, each compared in
    /// full in constant time.
    pub fn holder(&self, presented: &TokenHash) -> Option<&Holder> {
        let mut found = None;
        for (h, holder) in self.index.get(&presented.prefix()).into_iter().flatten() {
            if bool::from(presented.ct_eq(h)) {
                found = Some(holder);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(t: &str) -> String {
        TokenHash::of(t).to_string()
    }

    #[test]
    fn a_full_file_parses() {
        let text = format!(
            r#"
            [admin]
            token_hashes = ["{}"]
            [[tenants]]
            name = "search"
            token_hashes = ["{}", "{}"]
            uids = [1000]
            [tenants.quota]
            device_bytes = 1000
            leases = 0
            max_tokens = 512
            prompt_tokens = 4096
            stop_strings = 1
            [[tenants]]
            name = "ads"
            token_hashes = ["{}"]
            "#,
            hash("adm"),
            hash("s1"),
            hash("s2"),
            hash("a1")
        );
        let t = TenantTable::parse(&text).expect("valid");
        assert_eq!(t.admin_hashes, vec![TokenHash::of("adm")]);
        let s = &t.tenants["search"];
        assert_eq!(s.token_hashes.len(), 2);
        assert_eq!(s.uids, vec![1000]);
        assert_eq!(s.quota.device_bytes, Some(1000));
        assert_eq!(s.quota.leases, None, "0 means unlimited");
        assert_eq!(
            (
                s.quota.max_tokens,
                s.quota.prompt_tokens,
                s.quota.stop_strings
            ),
            (Some(512), Some(4096), Some(1))
        );
        assert_eq!(t.tenants["ads"].quota, Quota::default());
    }

    /// A plaintext token pasted where a hash belongs must be refused without being echoed.
    #[test]
    fn plaintext_tokens_are_refused_and_not_echoed() {
        let text = r#"
            [[tenants]]
            name = "search"
            token_hashes = ["ms_supersecretvalue"]
        "#;
        let err = TenantTable::parse(text).expect_err("refused");
        assert!(
            err.contains("tenants[0] ('search'): token_hashes[0]"),
            "{err}"
        );
        assert!(!err.contains("supersecret"), "{err}");
    }

    /// TOML errors quote values and show the offending line: neither may reach a log when the
    /// value is a token.
    #[test]
    fn toml_errors_do_not_echo_values() {
        for text in [
            "[[tenants]]\nname = \"a\"\ntoken_hashes = \"ms_SECRET\"\n",
            "[[tenants]]\nname = \"a\"\ntoken_hashes = [\"ms_SECRET\"\n",
            "[[tenants]]\nname = \"a\"\ntoken_hashes = [ms_SECRET]\n",
            "ms_SECRET\n",
            "ms_SECRET = 1\n",
            "[[tenants]]\nname = \"a\"\nms_SECRET = 1\n",
        ] {
            let err = TenantTable::parse(text).expect_err(text);
            assert!(!err.contains("SECRET"), "{text:?} → {err}");
            assert!(err.contains("line "), "the position is kept: {err}");
        }
    }

    #[test]
    fn bad_files_are_refused_with_their_place() {
        let h = hash("x");
        let cases = [
            (
                format!("[[tenants]]\nname = \"Bad Name\"\ntoken_hashes = [\"{h}\"]"),
                "tenant name",
            ),
            (
                format!(
                    "[[tenants]]\nname = \"a\"\ntoken_hashes = [\"{h}\"]\n[[tenants]]\nname = \"a\""
                ),
                "already defined",
            ),
            (
                format!(
                    "[admin]\ntoken_hashes = [\"{h}\"]\n[[tenants]]\nname = \"a\"\ntoken_hashes = [\"{h}\"]"
                ),
                "also listed elsewhere",
            ),
            (
                "[[tenants]]\nname = \"a\"\nqouta = 1".to_owned(),
                "unknown field `qouta`",
            ),
            (
                "[[tenants]]\nname = \"a\"\ntoken-hashes = 1".to_owned(),
                "unknown field `token-hashes`",
            ),
            (
                "[[tenants]]\nname = \"a\"\nmodel_dir = \"../x\"".to_owned(),
                "model_dir '../x'",
            ),
            (
                "[[tenants]]\nname = \"a\"\n[tenants.quota]\nleases = -1".to_owned(),
                "line 4",
            ),
        ];
        for (text, want) in cases {
            let err = TenantTable::parse(&text).expect_err(&text);
            assert!(err.contains(want), "{text}\n→ {err}");
        }
    }

    /// The example shipped in deploy/ must stay valid.
    #[test]
    fn the_shipped_example_parses() {
        let t = TenantTable::parse(include_str!("../../../deploy/tenants.example.toml"))
            .expect("deploy/tenants.example.toml");
        assert_eq!(t.admin_hashes.len(), 1);
        assert_eq!(t.tenants["search"].model_dir.as_deref(), Some("search"));
        assert_eq!(t.tenants["search"].quota.leases, Some(256));
        assert!(t.tenants.contains_key("ads"));
    }
}
