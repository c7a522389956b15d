//! `X-RateLimit-*` headers: what a limit layer tells the client about the
//! tightest limit it checked.

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

use crate::error::{GatewayError, retry_after_seconds};
use crate::header_number::header_number;
use crate::store::CheckOutcome;
use crate::telemetry::HandleCache;

/// The limit's capacity (requests).
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Requests that may still be made now.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Whole seconds (rounded up) until the limit is fully available again;
/// on a refusal, until a request fits again (the same as `Retry-After`).
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// The rule the other three describe, as configured, in the IETF
/// `RateLimit-Policy` form: `600;w=60;burst=60` (600 requests per 60 s,
/// at most 60 at once: `X-RateLimit-Limit` is then 60), `10;w=60` (at most
/// 10 in any 60 s).
pub static X_RATELIMIT_POLICY: HeaderName = HeaderName::from_static("x-ratelimit-policy");

/// The three headers for `outcome`.
pub(crate) fn rate_limit_headers(outcome: &CheckOutcome) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(3);
    insert_counts(
        &mut headers,
        outcome.limit,
        outcome.remaining,
        reset_seconds(outcome),
    );
    headers
}

/// `X-RateLimit-Limit`, `-Remaining` and `-Reset` set in `headers`.
fn insert_counts(headers: &mut HeaderMap, limit: u64, remaining: u64, reset_seconds: u64) {
    headers.insert(X_RATELIMIT_LIMIT.clone(), header_number(limit));
    headers.insert(X_RATELIMIT_REMAINING.clone(), header_number(remaining));
    headers.insert(X_RATELIMIT_RESET.clone(), header_number(reset_seconds));
}

/// `X-RateLimit-Reset` of `outcome`: whole seconds, rounded up.
fn reset_seconds(outcome: &CheckOutcome) -> u64 {
    if outcome.reset_after.is_zero() {
        0
    } else {
        retry_after_seconds(outcome.reset_after)
    }
}

/// The rate-limit headers a layer puts on the response of a request it
/// admitted: its tightest limit's, and the rule's policy when it has one.
/// Kept as numbers until the response starts, where the tighter of two
/// layers' limits wins ([`merge_response_headers`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct RateHeaders(Option<RateNumbers>);

#[derive(Clone, Debug)]
struct RateNumbers {
    limit: u64,
    remaining: u64,
    reset_seconds: u64,
    policy: Option<HeaderValue>,
}

impl RateHeaders {
    /// The headers of `outcome`.
    pub(crate) fn of(outcome: &CheckOutcome) -> Self {
        RateHeaders(Some(RateNumbers {
            limit: outcome.limit,
            remaining: outcome.remaining,
            reset_seconds: reset_seconds(outcome),
            policy: None,
        }))
    }

    /// With `policy` as `X-RateLimit-Policy` (when there are headers).
    pub(crate) fn with_policy(mut self, policy: HeaderValue) -> Self {
        if let Some(numbers) = &mut self.0 {
            numbers.policy = Some(policy);
        }
        self
    }
}

/// The outcome with the least remaining: the limit the client meets first.
pub(crate) fn tightest<'a>(
    outcomes: impl IntoIterator<Item = &'a CheckOutcome>,
) -> Option<&'a CheckOutcome> {
    outcomes.into_iter().min_by_key(|outcome| outcome.remaining)
}

/// Puts the headers of `outcome` on a refusal. Its `X-RateLimit-Reset`
/// is the refusal's `Retry-After`: when the client may send again, which
/// a client reading either header learns alike (the limit is full again
/// only later, which matters to no client that was refused).
pub(crate) fn with_rate_limit_headers(
    mut error: GatewayError,
    outcome: &CheckOutcome,
) -> GatewayError {
    let retry_after = error.retry_after_seconds();
    for (name, value) in &rate_limit_headers(outcome) {
        let value = match retry_after {
            Some(seconds) if name == X_RATELIMIT_RESET => header_number(seconds),
            _ => value.clone(),
        };
        error = error.with_header(name.clone(), value);
    }
    error
}

/// The `X-RateLimit-Policy` of a counter limit, when it is a rate
/// (GCRA or a rolling window): see [`X_RATELIMIT_POLICY`].
pub(crate) fn policy_value(limit: &crate::store::Limit) -> Option<HeaderValue> {
    // Made once per limit: every admitted request carries one.
    POLICIES.get(limit, || (*limit, written_policy(limit)))
}

static POLICIES: HandleCache<crate::store::Limit, Option<HeaderValue>> = HandleCache::new();

fn written_policy(limit: &crate::store::Limit) -> Option<HeaderValue> {
    use crate::store::Limit;
    let (count, window, burst) = match *limit {
        Limit::Gcra {
            rate,
            period,
            burst,
        } => (rate, period, Some(burst)),
        Limit::Rolling { limit, window } | Limit::FixedWindow { limit, window } => {
            (limit, window, None)
        }
        Limit::Calendar { .. } => return None,
    };
    let mut number = itoa::Buffer::new();
    let mut text = String::with_capacity(48);
    text.push_str(number.format(count));
    text.push_str(";w=");
    text.push_str(number.format(window.as_secs()));
    if let Some(burst) = burst {
        text.push_str(";burst=");
        text.push_str(number.format(burst));
    }
    HeaderValue::from_str(&text).ok()
}

/// The remaining count of the rate-limit headers a gateway layer put on a
/// response, kept in the response's extensions: so the headers of an
/// upstream (the operator's own quota there) are always replaced, while of
/// two gateway layers the tighter limit stays.
#[derive(Clone, Copy, Debug)]
struct ReportedRemaining(u64);

/// Adds `ours` to a response's headers; see [`ReportedRemaining`].
pub(crate) fn merge_response_headers(response: &mut http::response::Parts, ours: RateHeaders) {
    let Some(ours) = ours.0 else { return };
    let reported = response
        .extensions
        .get::<ReportedRemaining>()
        .map(|reported| reported.0);
    // Another gateway layer's tighter limit stays.
    if reported.is_some_and(|theirs| theirs <= ours.remaining) {
        return;
    }
    response
        .extensions
        .insert(ReportedRemaining(ours.remaining));
    let headers = &mut response.headers;
    insert_counts(headers, ours.limit, ours.remaining, ours.reset_seconds);
    if let Some(policy) = ours.policy {
        headers.insert(X_RATELIMIT_POLICY.clone(), policy);
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
    fn a_refusals_reset_is_its_retry_after() {
        let mut refused = outcome(60, 0, 6_000);
        refused.admitted = false;
        let error = with_rate_limit_headers(
            GatewayError::rate_limited(
                crate::error::LimitSource::AccountRate,
                "full",
                Duration::from_millis(100),
            ),
            &refused,
        );
        let response: http::Response<bytes::Bytes> = error.to_response();
        assert_eq!(response.headers()[http::header::RETRY_AFTER], "1");
        assert_eq!(response.headers()[&X_RATELIMIT_RESET], "1");
        assert_eq!(response.headers()[&X_RATELIMIT_LIMIT], "60");
        assert_eq!(response.headers()[&X_RATELIMIT_REMAINING], "0");
        assert_eq!(
            response
                .headers()
                .get_all(&X_RATELIMIT_RESET)
                .iter()
                .count(),
            1
        );
    }

    #[test]
    fn the_policy_names_the_rule() {
        use crate::store::Limit;
        let gcra = Limit::Gcra {
            rate: 600,
            period: Duration::from_secs(60),
            burst: 60,
        };
        assert_eq!(policy_value(&gcra).unwrap(), "600;w=60;burst=60");
        let rolling = Limit::Rolling {
            limit: 10,
            window: Duration::from_secs(3600),
        };
        assert_eq!(policy_value(&rolling).unwrap(), "10;w=3600");
    }

    #[test]
    fn the_tighter_limit_wins_and_upstream_headers_never_do() {
        let (mut response, ()) = http::Response::new(()).into_parts();
        // The upstream's own quota, lower than ours: replaced all the same.
        response
            .headers
            .insert(X_RATELIMIT_REMAINING.clone(), HeaderValue::from(0u64));
        response
            .headers
            .insert(X_RATELIMIT_LIMIT.clone(), HeaderValue::from(1u64));
        merge_response_headers(&mut response, RateHeaders::of(&outcome(20, 3, 1_000)));
        assert_eq!(response.headers[&X_RATELIMIT_LIMIT], "20");
        merge_response_headers(&mut response, RateHeaders::of(&outcome(600, 599, 100)));
        assert_eq!(
            response.headers[&X_RATELIMIT_LIMIT], "20",
            "the looser limit does not replace"
        );
        merge_response_headers(&mut response, RateHeaders::of(&outcome(50, 1, 100)));
        assert_eq!(response.headers[&X_RATELIMIT_LIMIT], "50");
        assert_eq!(response.headers[&X_RATELIMIT_REMAINING], "1");
    }
}
