//! Credentials: the bearer token every call carries, and the TLS settings of `https://`
//! connections.
//!
//! A token is given literally or as a file. A file is read again at every connection and
//! reconnection, so operators rotate a worker's token by rewriting the file, without a restart.
//! A token never appears in an error message, a log line or a `Debug` output; errors about a
//! token file name the file, never its contents.

use std::ffi::OsString;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use tonic::metadata::{Ascii, MetadataValue};

use crate::WorkerError;

/// Longest token accepted, in bytes (the server refuses longer ones before hashing).
pub const MAX_TOKEN_BYTES: usize = 512;
/// Largest token file read: a token plus generous surrounding whitespace.
const MAX_TOKEN_FILE_BYTES: u64 = 64 << 10;
/// Largest PEM file read (a CA bundle may be a few hundred KiB).
const MAX_PEM_FILE_BYTES: u64 = 4 << 20;

/// Environment variable of a literal token.
pub const ENV_TOKEN: &str = "MODELSHARE_TOKEN";
/// Environment variable of a token file.
pub const ENV_TOKEN_FILE: &str = "MODELSHARE_TOKEN_FILE";
/// Environment variable of the CA certificate file (PEM).
pub const ENV_TLS_CA: &str = "MODELSHARE_TLS_CA";
/// Environment variable of the client certificate file (PEM), for mutual TLS.
pub const ENV_TLS_CERT: &str = "MODELSHARE_TLS_CERT";
/// Environment variable of the client key file (PEM), for mutual TLS.
pub const ENV_TLS_KEY: &str = "MODELSHARE_TLS_KEY";
/// Environment variable of the name to check the server's certificate against.
pub const ENV_TLS_DOMAIN: &str = "MODELSHARE_TLS_DOMAIN";

/// A bearer token, sent as `authorization: Bearer <token>`.
///
/// Validated when made: surrounding whitespace is trimmed; the rest must be 1 to
/// [`MAX_TOKEN_BYTES`] bytes of visible ASCII. `Debug` prints `Token(<redacted>)`; there is no
/// `Display`.
#[derive(Clone)]
pub struct Token {
    /// `Bearer <token>`, marked sensitive (HTTP/2 header compression never indexes it).
    header: MetadataValue<Ascii>,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A token from its text (surrounding whitespace and newlines are trimmed).
    pub fn new(token: String) -> Result<Self, WorkerError> {
        Self::parse(&token, || "token".to_owned())
    }

    /// Reads a token from `path` (the whole file, trimmed). Errors name the file, never what it
    /// holds.
    pub fn from_file(path: &Path) -> Result<Self, WorkerError> {
        let what = || format!("token file '{}'", path.display());
        let bytes = read_limited(path, MAX_TOKEN_FILE_BYTES).map_err(|reason| {
            WorkerError::Credentials {
                what: what(),
                reason,
            }
        })?;
        let text = String::from_utf8(bytes).map_err(|_| WorkerError::Credentials {
            what: what(),
            reason: "the token is not visible ASCII".into(),
        })?;
        Self::parse(&text, what)
    }

    fn parse(text: &str, what: impl FnOnce() -> String) -> Result<Self, WorkerError> {
        let fail = |reason: String| WorkerError::Credentials {
            what: what(),
            reason,
        };
        let token = text.trim();
        if token.is_empty() {
            return Err(fail("the token is empty".into()));
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(fail(format!(
                "the token is {} bytes, more than the {MAX_TOKEN_BYTES} allowed",
                token.len()
            )));
        }
        if let Some(at) = token.bytes().position(|b| !b.is_ascii_graphic()) {
            return Err(fail(format!(
                "the token has a character that is not visible ASCII at byte {at}"
            )));
        }
        let mut header = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| fail("the token is not a valid header value".into()))?;
        header.set_sensitive(true);
        Ok(Self { header })
    }

    /// The token itself, for the rare caller that must pass it on (never log it).
    pub fn expose_secret(&self) -> &str {
        // The header was built from visible ASCII, so `to_str` cannot fail; the fallback keeps
        // this free of panics all the same.
        self.header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .unwrap_or("")
    }

    /// The `authorization` header value: `Bearer <token>`.
    pub fn header_value(&self) -> &MetadataValue<Ascii> {
        &self.header
    }
}

/// A token as a command line gives it (`--token`): kept as text, and made a [`Token`] (checked)
/// only when the options are built, so that an argument parser never echoes a malformed token
/// in its error. `Debug` does not show it.
#[derive(Clone)]
pub struct TokenArg(String);

impl fmt::Debug for TokenArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenArg(<redacted>)")
    }
}

impl std::str::FromStr for TokenArg {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

impl TokenArg {
    /// The token, checked as [`Token::new`] checks it.
    pub fn token(&self) -> Result<Token, WorkerError> {
        Token::new(self.0.clone())
    }
}

/// Where the token comes from.
#[derive(Debug, Clone)]
pub enum TokenSource {
    /// A token given as is.
    Literal(Token),
    /// A file, read again at every connection (see [`Token::from_file`]).
    File(PathBuf),
}

impl TokenSource {
    /// The token now: the literal, or the file's current contents.
    pub fn current(&self) -> Result<Token, WorkerError> {
        match self {
            TokenSource::Literal(t) => Ok(t.clone()),
            TokenSource::File(path) => Token::from_file(path),
        }
    }
}

/// TLS settings of an `https://` connection.
#[derive(Clone, Default)]
pub struct TlsOptions {
    /// CA certificates (PEM) to trust instead of the built-in web PKI roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate and key (PEM), for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Name to check the server's certificate against, instead of the address's host.
    pub domain: Option<String>,
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field(
                "ca_pem",
                &self.ca_pem.as_ref().map(|c| format!("{} bytes", c.len())),
            )
            .field(
                "identity",
                &self
                    .identity
                    .as_ref()
                    .map(|(cert, _)| format!("cert {} bytes, key <redacted>", cert.len())),
            )
            .field("domain", &self.domain)
            .finish()
    }
}

impl TlsOptions {
    /// Reads the CA file and the client certificate and key (both or neither) as PEM.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        domain: Option<String>,
    ) -> Result<Self, WorkerError> {
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((
                read_pem(cert, "TLS client certificate")?,
                read_pem(key, "TLS client key")?,
            )),
            (None, None) => None,
            (Some(cert), None) => {
                return Err(WorkerError::Credentials {
                    what: format!("TLS client certificate '{}'", cert.display()),
                    reason: "a client certificate needs its key as well".into(),
                });
            }
            (None, Some(key)) => {
                return Err(WorkerError::Credentials {
                    what: format!("TLS client key '{}'", key.display()),
                    reason: "a client key needs its certificate as well".into(),
                });
            }
        };
        Ok(Self {
            ca_pem: ca.map(|p| read_pem(p, "TLS CA file")).transpose()?,
            identity,
            domain: domain.filter(|d| !d.is_empty()),
        })
    }
}

/// How to connect: the token to send and the TLS settings. The default sends no token and uses
/// TLS only for `https://` addresses, trusting the web PKI roots.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// The token sent with every call (none: no `authorization` header).
    pub token: Option<TokenSource>,
    /// TLS settings; only `https://` addresses may have them.
    pub tls: Option<TlsOptions>,
}

impl ConnectOptions {
    /// Options from the environment: `MODELSHARE_TOKEN` (a token) or `MODELSHARE_TOKEN_FILE` (a
    /// file, read at every connection), not both; `MODELSHARE_TLS_CA`, `MODELSHARE_TLS_CERT`,
    /// `MODELSHARE_TLS_KEY` (PEM files) and `MODELSHARE_TLS_DOMAIN`. Empty variables count as
    /// unset. TLS settings are present when any TLS variable is set.
    pub fn from_env() -> Result<Self, WorkerError> {
        Self::from_lookup(|name| std::env::var_os(name))
    }

    /// [`from_env`](Self::from_env) with `lookup` in place of the process environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Self, WorkerError> {
        let var = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let mut options = Self::default();
        match (var(ENV_TOKEN), var(ENV_TOKEN_FILE)) {
            (Some(_), Some(_)) => {
                return Err(WorkerError::Credentials {
                    what: "environment".into(),
                    reason: format!("both {ENV_TOKEN} and {ENV_TOKEN_FILE} are set: give one"),
                });
            }
            (Some(token), None) => {
                let token = token.into_string().map_err(|_| WorkerError::Credentials {
                    what: ENV_TOKEN.into(),
                    reason: "the token is not visible ASCII".into(),
                })?;
                let token = Token::parse(&token, || ENV_TOKEN.to_owned())?;
                options = options.with_token(token);
            }
            (None, Some(path)) => options = options.with_token_file(PathBuf::from(path)),
            (None, None) => {}
        }
        let (ca, cert, key) = (var(ENV_TLS_CA), var(ENV_TLS_CERT), var(ENV_TLS_KEY));
        let domain = var(ENV_TLS_DOMAIN);
        if ca.is_some() || cert.is_some() || key.is_some() || domain.is_some() {
            let domain = domain
                .map(|d| {
                    d.into_string().map_err(|_| WorkerError::Credentials {
                        what: ENV_TLS_DOMAIN.into(),
                        reason: "not valid UTF-8".into(),
                    })
                })
                .transpose()?;
            options = options.with_tls(TlsOptions::from_files(
                ca.as_deref().map(Path::new),
                cert.as_deref().map(Path::new),
                key.as_deref().map(Path::new),
                domain,
            )?);
        }
        Ok(options)
    }

    /// The options of a worker's command line: the token of its `--token` / `--token-file`
    /// flags when either is given ([`with_token_flags`](Self::with_token_flags)), else that of
    /// the environment; the TLS settings of the environment. [`from_env`](Self::from_env) with
    /// the flags winning over the variables.
    pub fn from_env_and_flags(
        token: Option<&TokenArg>,
        token_file: Option<PathBuf>,
    ) -> Result<Self, WorkerError> {
        Self::from_lookup_and_flags(|name| std::env::var_os(name), token, token_file)
    }

    /// [`from_env_and_flags`](Self::from_env_and_flags) with `lookup` in place of the process
    /// environment.
    pub fn from_lookup_and_flags(
        lookup: impl Fn(&str) -> Option<OsString>,
        token: Option<&TokenArg>,
        token_file: Option<PathBuf>,
    ) -> Result<Self, WorkerError> {
        if token.is_none() && token_file.is_none() {
            return Self::from_lookup(lookup);
        }
        // A flag given: the token variables are not read (neither their token nor a conflict
        // between them counts).
        let tls_only = |name: &str| match name {
            ENV_TOKEN | ENV_TOKEN_FILE => None,
            _ => lookup(name),
        };
        Self::from_lookup(tls_only)?.with_token_flags(token, token_file)
    }

    /// The token of a command line's `--token` (a literal) or `--token-file` (a file, read at
    /// every connection), not both, in place of any token these options had; neither flag
    /// leaves the options as they are.
    pub fn with_token_flags(
        self,
        token: Option<&TokenArg>,
        token_file: Option<PathBuf>,
    ) -> Result<Self, WorkerError> {
        match (token, token_file) {
            (Some(_), Some(_)) => Err(WorkerError::Credentials {
                what: "token".into(),
                reason: format!(
                    "give --token ({ENV_TOKEN}) or --token-file ({ENV_TOKEN_FILE}), not both"
                ),
            }),
            (Some(token), None) => Ok(self.with_token(token.token()?)),
            (None, Some(path)) => Ok(self.with_token_file(path)),
            (None, None) => Ok(self),
        }
    }

    /// Sends `token` with every call.
    pub fn with_token(mut self, token: Token) -> Self {
        self.token = Some(TokenSource::Literal(token));
        self
    }

    /// Sends the token held in `path`, read again at every connection.
    pub fn with_token_file(mut self, path: PathBuf) -> Self {
        self.token = Some(TokenSource::File(path));
        self
    }

    /// Uses these TLS settings (the address must be `https://`).
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The interceptor for one connection: the token as it is now (a token file is read here).
    pub fn interceptor(&self) -> Result<BearerInterceptor, WorkerError> {
        Ok(BearerInterceptor {
            token: self.token.as_ref().map(TokenSource::current).transpose()?,
        })
    }
}

/// Adds `authorization: Bearer <token>` to every request (nothing without a token).
#[derive(Debug, Clone, Default)]
pub struct BearerInterceptor {
    token: Option<Token>,
}

impl BearerInterceptor {
    /// An interceptor that sends `token` (none: sends nothing).
    pub fn new(token: Option<Token>) -> Self {
        Self { token }
    }
}

impl tonic::service::Interceptor for BearerInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", token.header.clone());
        }
        Ok(request)
    }
}

/// Reads at most `limit` bytes of `path`; the reason of a failure (naming no contents).
fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err(format!("larger than the {limit} bytes allowed"));
    }
    Ok(bytes)
}

fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, WorkerError> {
    let fail = |reason: String| WorkerError::Credentials {
        what: format!("{what} '{}'", path.display()),
        reason,
    };
    let bytes = read_limited(path, MAX_PEM_FILE_BYTES).map_err(fail)?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(fail("not a PEM file (no '-----BEGIN ' line)".into()));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests;
