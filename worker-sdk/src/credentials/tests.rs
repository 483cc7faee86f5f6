//! Tests of the credentials: tokens from flags, variables and files, TLS settings.

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

    let file = ConnectOptions::from_lookup(env(&[(ENV_TOKEN_FILE, "/some/file")])).expect("file");
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
    assert!(matches!(by_file.token, Some(TokenSource::File(p)) if p == Path::new("/flag/file")));

    let from_env =
        ConnectOptions::from_lookup_and_flags(env(&[(ENV_TOKEN_FILE, "/env/file")]), None, None)
            .expect("the variable");
    assert!(matches!(from_env.token, Some(TokenSource::File(p)) if p == Path::new("/env/file")));
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
    let o =
        ConnectOptions::from_lookup(env(&[(ENV_TLS_CA, ca_s), (ENV_TLS_DOMAIN, "ms.internal")]))
            .expect("tls");
    let tls = o.tls.expect("tls set");
    assert!(tls.ca_pem.is_some() && tls.identity.is_none());
    assert_eq!(tls.domain.as_deref(), Some("ms.internal"));

    let only_domain = ConnectOptions::from_lookup(env(&[(ENV_TLS_DOMAIN, "x")])).expect("domain");
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
