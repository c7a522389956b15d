//! `X-RateLimit-*` headers: what a limit layer tells the client about the
//! tightest limit it checked.

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

use crate::error::{retry_after_seconds, GatewayError};
use crate::store::CheckOutcome;

/// The limit's capacity (requests).
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Requests that may still be made now.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Whole seconds (rounded up) until the limit is fully available again.
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The three headers for `outcome`.
pub(crate) fn rate_limit_headers(outcome: &CheckOutcome) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(3);
    headers.insert(X_RATELIMIT_LIMIT.clone(), HeaderValue::from(outcome.limit));
    headers.insert(
        X_RATELIMIT_REMAINING.clone(),
        HeaderValue::from(outcome.remaining),
    );
    let reset_seconds = if outcome.reset_after.is_zero() {
        0
    } else {
        retry_after_seconds(outcome.reset_after)
    };
    headers.insert(X_RATELIMIT_RESET.clone(), HeaderValue::from(reset_seconds));
    headers
}

/// The outcome with the least remaining: the limit the client meets first.
pub(crate) fn tightest<'a>(
    outcomes: impl IntoIterator<Item = &'a CheckOutcome>,
) -> Option<&'a CheckOutcome> {
    outcomes.into_iter().min_by_key(|outcome| outcome.remaining)
}

/// Puts the headers of `outcome` on a refusal.
pub(crate) fn with_rate_limit_headers(
    mut error: GatewayError,
    outcome: &CheckOutcome,
) -> GatewayError {
    for (name, value) in &rate_limit_headers(outcome) {
        error = error.with_header(name.clone(), value.clone());
    }
    error
}

/// Adds `ours` to a response's headers. When two limit layers both report,
/// the tighter limit (fewer remaining) stays, so the client sees the limit
/// it will meet first.
pub(crate) fn merge_response_headers(target: &mut HeaderMap, ours: HeaderMap) {
    let remaining = |headers: &HeaderMap| {
        headers
            .get(&X_RATELIMIT_REMAINING)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.parse::<u64>().ok())
    };
    let keep_theirs = matches!(
        (remaining(target), remaining(&ours)),
        (Some(theirs), Some(mine)) if theirs <= mine
    );
    for (name, value) in ours {
        let Some(name) = name else { continue };
        let is_rate_limit =
            name == X_RATELIMIT_LIMIT || name == X_RATELIMIT_REMAINING || name == X_RATELIMIT_RESET;
        if !(is_rate_limit && keep_theirs) {
            target.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn outcome(limit: u64, remaining: u64, reset_millis: u64) -> CheckOutcome {
        CheckOutcome {
            admitted: true,
            limit,
            used: limit - remaining,
            remaining,
            retry_after: Duration::ZERO,
            reset_after: Duration::from_millis(reset_millis),
        }
    }

    #[test]
    fn reset_is_whole_seconds_rounded_up() {
        let headers = rate_limit_headers(&outcome(20, 3, 1_200));
        assert_eq!(headers[&X_RATELIMIT_LIMIT], "20");
        assert_eq!(headers[&X_RATELIMIT_REMAINING], "3");
        assert_eq!(headers[&X_RATELIMIT_RESET], "2");
        assert_eq!(
            rate_limit_headers(&outcome(20, 20, 0))[&X_RATELIMIT_RESET],
            "0"
        );
    }

    #[test]
    fn the_tighter_limit_wins_whichever_layer_reports_last() {
        let mut response = rate_limit_headers(&outcome(20, 3, 1_000));
        merge_response_headers(&mut response, rate_limit_headers(&outcome(600, 599, 100)));
        assert_eq!(response[&X_RATELIMIT_LIMIT], "20");
        merge_response_headers(&mut response, rate_limit_headers(&outcome(50, 1, 100)));
        assert_eq!(response[&X_RATELIMIT_LIMIT], "50");
        assert_eq!(response[&X_RATELIMIT_REMAINING], "1");
        let mut empty = HeaderMap::new();
        merge_response_headers(&mut empty, rate_limit_headers(&outcome(5, 5, 0)));
        assert_eq!(empty[&X_RATELIMIT_LIMIT], "5");
    }
}
