//! A request's deadline: from gRPC's `grpc-timeout` header, or on HTTP from `x-request-timeout`,
//! `x-stainless-read-timeout` or `x-stainless-timeout` (seconds: openai-python sends its read
//! timeout in the first of those, other official OpenAI clients their timeout in the second),
//! bounded by the server's longest request time, which also applies when none is given.

use std::time::{Duration, Instant};

use axum::http::HeaderMap;

use modelshare_serving::InferError;

/// HTTP headers that carry a timeout in seconds (a decimal number), first found wins.
pub const HTTP_TIMEOUT_HEADERS: [&str; 3] = [
    "x-request-timeout",
    "x-stainless-read-timeout",
    "x-stainless-timeout",
];

/// Parses a `grpc-timeout` value: at most 8 digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let unit = value.chars().last()?;
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(n.checked_mul(3600)?),
        'M' => Duration::from_secs(n.checked_mul(60)?),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The deadline of a gRPC request that arrived at `now` (a malformed `grpc-timeout` is
/// INVALID_ARGUMENT). It is set a little before the header's time (a tenth of it, at most
/// 25 ms): tonic's own timer on `grpc-timeout` ends the call at that time with CANCELLED, and
/// the caller should hear DEADLINE_EXCEEDED from the request path first, also on a loaded
/// machine (5 ms was seen to lose that race on two busy cores).
pub fn grpc(
    metadata: &tonic::metadata::MetadataMap,
    now: Instant,
    longest: Duration,
) -> Result<Instant, InferError> {
    let timeout = match metadata.get("grpc-timeout") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(parse_grpc_timeout)
                .ok_or_else(|| InferError::InvalidInput("malformed grpc-timeout header".into()))?,
        ),
    };
    let timeout = timeout.map(|t| t.saturating_sub((t / 10).min(GRPC_MARGIN)));
    Ok(bounded(now, timeout, longest))
}

/// The most a gRPC deadline is set before the caller's.
const GRPC_MARGIN: Duration = Duration::from_millis(25);

/// The deadline of an HTTP request that arrived at `now` (a malformed timeout header is a bad
/// request).
pub fn http(headers: &HeaderMap, now: Instant, longest: Duration) -> Result<Instant, InferError> {
    let mut timeout = None;
    for name in HTTP_TIMEOUT_HEADERS {
        if let Some(v) = headers.get(name) {
            let secs = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s > 0.0)
                .ok_or_else(|| {
                    InferError::InvalidInput(format!(
                        "malformed {name} header: a positive number of seconds is expected"
                    ))
                })?;
            timeout = Some(Duration::try_from_secs_f64(secs).unwrap_or(longest));
            break;
        }
    }
    Ok(bounded(now, timeout, longest))
}

fn bounded(now: Instant, timeout: Option<Duration>, longest: Duration) -> Instant {
    let timeout = timeout.map_or(longest, |t| t.min(longest));
    now.checked_add(timeout).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_by_unit_and_bad_ones_do_not() {
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "S", "5", "5s", "123456789S", "-1S", "1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn timeouts_are_bounded_by_the_longest_request_time() {
        let now = Instant::now();
        let longest = Duration::from_secs(60);
        let mut h = HeaderMap::new();
        assert_eq!(http(&h, now, longest), Ok(now + longest));
        h.insert("x-stainless-timeout", "0.5".parse().unwrap());
        assert_eq!(http(&h, now, longest), Ok(now + Duration::from_millis(500)));
        // openai-python's read timeout comes before the generic one.
        h.insert("x-stainless-read-timeout", "2".parse().unwrap());
        assert_eq!(http(&h, now, longest), Ok(now + Duration::from_secs(2)));
        h.insert("x-request-timeout", "600".parse().unwrap());
        assert_eq!(http(&h, now, longest), Ok(now + longest));
        h.insert("x-request-timeout", "soon".parse().unwrap());
        assert!(http(&h, now, longest).is_err());
        let mut m = tonic::metadata::MetadataMap::new();
        m.insert("grpc-timeout", "100m".parse().unwrap());
        assert_eq!(grpc(&m, now, longest), Ok(now + Duration::from_millis(90)));
        m.insert("grpc-timeout", "10S".parse().unwrap());
        assert_eq!(
            grpc(&m, now, longest),
            Ok(now + Duration::from_millis(9975))
        );
        m.insert("grpc-timeout", "lots".parse().unwrap());
        assert!(grpc(&m, now, longest).is_err());
    }
}
