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
mod tests {
    use std::collections::HashMap;

    use tonic::service::Interceptor;

    use super::*;

    const SECRET: &str = "ms_0123456789abcdef";

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn reason(e: WorkerError) -> String {
        match e {
            WorkerError::Credentials { reason, .. } => reason,
            other => panic!("expected a credentials error, got {other:?}"),
        }
    }

    fn header_of(interceptor: &mut BearerInterceptor) -> Option<String> {
        let req = interceptor
            .call(tonic::Request::new(()))
            .expect("interceptor");
        req.metadata()
            .get("authorization")
            .map(|v| v.to_str().expect("ascii").to_owned())
    }

    /// A token with whitespace around it (a file ending in a newline) would be sent with it.
    #[test]
    fn tokens_are_trimmed() {
        let t = Token::new(format!("  {SECRET}\r\n")).expect("valid");
        assert_eq!(t.expose_secret(), SECRET);
        assert_eq!(
            t.header_value().to_str().expect("ascii"),
            format!("Bearer {SECRET}")
        );
    }

    /// Tokens that cannot be a header value, or that the server would refuse, must be refused
    /// here, with a reason that does not quote them.
    #[test]
    fn malformed_tokens_are_refused_without_echo() {
        for bad in [
            String::new(),
            " \n\t ".into(),
            "ms_has space".into(),
            "ms_tab\tinside".into(),
            "ms_two\nlines".into(),
            "ms_nön_ascii".into(),
            "ms_nul\0".into(),
            "x".repeat(MAX_TOKEN_BYTES + 1),
        ] {
            let err = Token::new(bad.clone()).expect_err(&format!("{bad:?} accepted"));
            let text = format!("{err} {err:?}");
            assert!(
                bad.trim().len() < 3 || !text.contains(bad.trim()),
                "error quotes the token: {text}"
            );
            assert!(text.contains("token"), "{text}");
        }
        assert!(Token::new("x".repeat(MAX_TOKEN_BYTES)).is_ok());
    }

    /// A token in `Debug` output would end up in logs.
    #[test]
    fn debug_never_shows_the_token() {
        let t = Token::new(SECRET.into()).expect("valid");
        let shown = format!(
            "{t:?} {:?} {:?} {:?}",
            TokenSource::Literal(t.clone()),
            ConnectOptions::default().with_token(t.clone()),
            BearerInterceptor::new(Some(t.clone())),
        );
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(!shown.contains("0123456789"), "{shown}");
        assert!(shown.contains("Token(<redacted>)"), "{shown}");
        let tls = TlsOptions {
            ca_pem: None,
            identity: Some((b"CERT".to_vec(), b"PRIVATE-KEY-BYTES".to_vec())),
            domain: None,
        };
        assert!(!format!("{tls:?}").contains("PRIVATE-KEY"), "{tls:?}");
    }

    /// The env variables are the documented way to give workers credentials; both token
    /// variables at once must be refused rather than one silently winning.
    #[test]
    fn env_precedence_and_conflicts() {
        let none = ConnectOptions::from_lookup(env(&[])).expect("empty env");
        assert!(none.token.is_none() && none.tls.is_none());

        let lit = ConnectOptions::from_lookup(env(&[(ENV_TOKEN, SECRET)])).expect("token");
        let mut i = lit.interceptor().expect("interceptor");
        assert_eq!(header_of(&mut i), Some(format!("Bearer {SECRET}")));

        let file =
            ConnectOptions::from_lookup(env(&[(ENV_TOKEN_FILE, "/some/file")])).expect("file");
        assert!(matches!(file.token, Some(TokenSource::File(p)) if p == Path::new("/some/file")));

        let both = ConnectOptions::from_lookup(env(&[(ENV_TOKEN, SECRET), (ENV_TOKEN_FILE, "/f")]))
            .expect_err("both accepted");
        let text = both.to_string();
        assert!(
            text.contains(ENV_TOKEN) && text.contains(ENV_TOKEN_FILE),
            "{text}"
        );
        assert!(!text.contains(SECRET), "{text}");

        // Empty counts as unset, so `MODELSHARE_TOKEN= cmd` turns the token off.
        let empty = ConnectOptions::from_lookup(env(&[(ENV_TOKEN, ""), (ENV_TOKEN_FILE, "/f")]))
            .expect("empty token var");
        assert!(matches!(empty.token, Some(TokenSource::File(_))));

        let bad = ConnectOptions::from_lookup(env(&[(ENV_TOKEN, "has space")])).expect_err("bad");
        assert!(bad.to_string().contains(ENV_TOKEN), "{bad}");
        assert!(!bad.to_string().contains("has space"), "{bad}");
    }

    /// A worker's `--token` / `--token-file` win over the variables (whose conflict then does
    /// not count); without them the variables apply; both flags are refused, naming the flags,
    /// never the token. Fails if the flags were ignored or mixed with the variables.
    #[test]
    fn token_flags_win_over_the_variables() {
        let arg: TokenArg = SECRET.parse().expect("infallible");
        let vars = env(&[(ENV_TOKEN, "ms_from_env"), (ENV_TOKEN_FILE, "/env/file")]);
        let by_flag =
            ConnectOptions::from_lookup_and_flags(&vars, Some(&arg), None).expect("the flag wins");
        let mut i = by_flag.interceptor().expect("interceptor");
        assert_eq!(header_of(&mut i), Some(format!("Bearer {SECRET}")));
        let by_file = ConnectOptions::from_lookup_and_flags(&vars, None, Some("/flag/file".into()))
            .expect("the file flag wins");
        assert!(
            matches!(by_file.token, Some(TokenSource::File(p)) if p == Path::new("/flag/file"))
        );

        let from_env = ConnectOptions::from_lookup_and_flags(
            env(&[(ENV_TOKEN_FILE, "/env/file")]),
            None,
            None,
        )
        .expect("the variable");
        assert!(
            matches!(from_env.token, Some(TokenSource::File(p)) if p == Path::new("/env/file"))
        );
        // Without flags, the variables' own rules hold (both at once refused).
        assert!(ConnectOptions::from_lookup_and_flags(&vars, None, None).is_err());

        let both =
            ConnectOptions::from_lookup_and_flags(env(&[]), Some(&arg), Some("/flag/file".into()))
                .expect_err("both flags accepted");
        let text = both.to_string();
        assert!(
            text.contains("--token") && text.contains("--token-file"),
            "{text}"
        );
        assert!(!text.contains(SECRET), "{text}");
        assert!(!format!("{arg:?}").contains(SECRET));

        let bad: TokenArg = "has space".parse().expect("infallible");
        let err = ConnectOptions::from_lookup_and_flags(env(&[]), Some(&bad), None)
            .expect_err("a malformed token");
        assert!(!err.to_string().contains("has space"), "{err}");
    }

    /// TLS settings from the environment: files read, cert without key refused.
    #[test]
    fn env_tls_settings() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .expect("write");
        let ca_s = ca.to_str().expect("utf-8 path");
        let o = ConnectOptions::from_lookup(env(&[
            (ENV_TLS_CA, ca_s),
            (ENV_TLS_DOMAIN, "ms.internal"),
        ]))
        .expect("tls");
        let tls = o.tls.expect("tls set");
        assert!(tls.ca_pem.is_some() && tls.identity.is_none());
        assert_eq!(tls.domain.as_deref(), Some("ms.internal"));

        let only_domain =
            ConnectOptions::from_lookup(env(&[(ENV_TLS_DOMAIN, "x")])).expect("domain");
        assert!(only_domain.tls.is_some_and(|t| t.ca_pem.is_none()));

        let err = ConnectOptions::from_lookup(env(&[(ENV_TLS_CERT, ca_s)])).expect_err("no key");
        assert!(reason(err).contains("key"));
        let err = ConnectOptions::from_lookup(env(&[(ENV_TLS_KEY, ca_s)])).expect_err("no cert");
        assert!(reason(err).contains("certificate"));

        let missing = dir.path().join("missing.pem");
        let err = TlsOptions::from_files(Some(&missing), None, None, None).expect_err("missing");
        assert!(err.to_string().contains("missing.pem"), "{err}");
        let not_pem = dir.path().join("not.pem");
        std::fs::write(&not_pem, "hello").expect("write");
        let err = TlsOptions::from_files(Some(&not_pem), None, None, None).expect_err("not pem");
        assert!(reason(err).contains("PEM"));
    }

    /// Rotating a token means rewriting its file: every new connection must read it again.
    #[test]
    fn token_file_is_read_at_every_interceptor() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, "ms_first\n").expect("write");
        let options = ConnectOptions::default().with_token_file(path.clone());
        let mut first = options.interceptor().expect("first");
        std::fs::write(&path, "ms_second\n").expect("rewrite");
        let mut second = options.interceptor().expect("second");
        assert_eq!(header_of(&mut first).as_deref(), Some("Bearer ms_first"));
        assert_eq!(header_of(&mut second).as_deref(), Some("Bearer ms_second"));

        // A bad file names the file and not what it holds.
        std::fs::write(&path, "ms_leaked secret\n").expect("rewrite");
        let err = options.interceptor().expect_err("space accepted");
        let text = err.to_string();
        assert!(
            text.contains("token file") && text.contains(&*path.to_string_lossy()),
            "{text}"
        );
        assert!(!text.contains("leaked"), "{text}");
        std::fs::remove_file(&path).expect("remove");
        let err = options.interceptor().expect_err("missing file");
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    }

    /// Without a token nothing is sent (a server without tenants needs none).
    #[test]
    fn no_token_no_header() {
        let mut i = ConnectOptions::default()
            .interceptor()
            .expect("interceptor");
        assert_eq!(header_of(&mut i), None);
    }
}
