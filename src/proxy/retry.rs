//! [`RetryPolicy`]: seed 002's advice as a tower retry policy.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use tower::retry::Policy;

use crate::clock::{Clock, SystemClock};
use crate::context::RequestContext;
use crate::error::GatewayError;
use crate::rate_limit::X_RATELIMIT_RESET;

/// Retries what seed 002 says to retry: 429, 500, 502, 503, 504 and
/// failed connections, with exponential backoff from 1 s (1, 2, 4 s, plus
/// up to a fifth of jitter), at most `max_attempts` in all. A `Retry-After`
/// (or `X-RateLimit-Reset`) is honoured up to `max_wait`; a 429 that asks
/// for longer (a daily cap) is not retried at all, and neither is a
/// response once it is passed on, so a stream is never replayed.
///
/// While it waits it clears the request's
/// [`SentUpstream`](crate::credit::SentUpstream) mark: the request is at
/// no upstream then, so a client that leaves during the wait pays nothing.
///
/// ```
/// use std::time::Duration;
/// use modelgate::proxy::RetryPolicy;
///
/// let policy = RetryPolicy::new(3).unwrap().max_wait(Duration::from_secs(10));
/// assert!(RetryPolicy::new(6).is_err());
/// # let _ = policy;
/// ```
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    max_attempts: u32,
    attempts: u32,
    first_backoff: Duration,
    max_wait: Duration,
    /// What an HTTP date or Unix time the upstream asks to wait until is
    /// measured from.
    clock: Arc<dyn Clock>,
}

/// Why a retry policy was refused.
#[derive(Debug, thiserror::Error)]
#[error("retry policy: at most 1 to {max} attempts, not {attempts}", max = RetryPolicy::MOST_ATTEMPTS)]
pub struct RetryPolicyError {
    attempts: u32,
}

/// In a request's extensions: no retries (a fallback model is next).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkipRetries;

impl RetryPolicy {
    /// The most attempts a policy allows (seed 002: 3 to 5).
    pub const MOST_ATTEMPTS: u32 = 5;
    /// The default number of attempts, the first included.
    pub const DEFAULT_ATTEMPTS: u32 = 3;
    /// The default longest wait before a retry.
    pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(10);

    /// At most `max_attempts` attempts in all (1 never retries).
    pub fn new(max_attempts: u32) -> Result<Self, RetryPolicyError> {
        if !(1..=Self::MOST_ATTEMPTS).contains(&max_attempts) {
            return Err(RetryPolicyError {
                attempts: max_attempts,
            });
        }
        Ok(RetryPolicy {
            max_attempts,
            attempts: 1,
            first_backoff: Duration::from_secs(1),
            max_wait: Self::DEFAULT_MAX_WAIT,
            clock: Arc::new(SystemClock),
        })
    }

    /// The clock the waits an upstream asks for until a time (an HTTP
    /// date, a Unix time) are measured from; the system clock by default.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The longest wait before a retry; a 429 asking for longer is passed on.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// 1 s, 2 s, 4 s…, each plus up to a fifth more at random, so that
    /// many clients refused at once do not come back at once.
    fn backoff(&self) -> Duration {
        let doubled = self.first_backoff * 2u32.saturating_pow(self.attempts - 1);
        let jitter = doubled.mul_f64(crate::random::fraction() / 5.0);
        (doubled + jitter).min(self.max_wait)
    }

    /// How long to wait before the next attempt, or `None` to pass the
    /// outcome on.
    pub fn wait_for<B>(&self, outcome: &Result<Response<B>, GatewayError>) -> Option<Duration> {
        if self.attempts >= self.max_attempts {
            return None;
        }
        match outcome {
            Ok(response) => {
                let status = response.status();
                if !matches!(status.as_u16(), 429 | 500 | 502 | 503 | 504) {
                    return None;
                }
                match asked_wait(response.headers(), SystemTime::from(self.clock.now())) {
                    Some(wait)
                        if wait > self.max_wait && status == StatusCode::TOO_MANY_REQUESTS =>
                    {
                        None
                    }
                    Some(wait) => Some(wait.min(self.max_wait)),
                    None => Some(self.backoff()),
                }
            }
            Err(error) => (error
                .metadata()
                .get("upstream_failure")
                .and_then(|failure| failure.as_str())
                == Some("connect"))
            .then(|| self.backoff()),
        }
    }
}

/// The wait an upstream asks for: the longer of `Retry-After` (seconds or
/// an HTTP date) and `X-RateLimit-Reset` (seconds to wait, or a Unix time
/// in seconds or milliseconds), so a short `Retry-After` cannot hide a
/// daily reset.
fn asked_wait(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &http::header::HeaderName| headers.get(name)?.to_str().ok().map(str::trim);
    let retry_after = text(&RETRY_AFTER).and_then(|retry_after| {
        retry_after
            .parse::<u64>()
            .map(Duration::from_secs)
            .ok()
            .or_else(|| {
                Some(
                    httpdate_parse(retry_after)
                        .ok()?
                        .duration_since(now)
                        .unwrap_or_default(),
                )
            })
    });
    let reset = text(&X_RATELIMIT_RESET).and_then(|reset| reset_wait(reset, now));
    retry_after.max(reset)
}

fn reset_wait(reset: &str, now: SystemTime) -> Option<Duration> {
    let reset: u64 = reset.parse().ok()?;
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let at = match reset {
        // Milliseconds since the epoch (OpenRouter).
        reset if reset >= 1_000_000_000_000 => Duration::from_millis(reset),
        // Seconds since the epoch.
        reset if reset >= 1_000_000_000 => Duration::from_secs(reset),
        // Seconds to wait.
        reset => return Some(Duration::from_secs(reset)),
    };
    Some(at.saturating_sub(since_epoch))
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form HTTP sends.
fn httpdate_parse(text: &str) -> Result<SystemTime, ()> {
    let date = chrono::DateTime::parse_from_rfc2822(text).map_err(|_| ())?;
    let seconds = u64::try_from(date.timestamp()).map_err(|_| ())?;
    Ok(UNIX_EPOCH + Duration::from_secs(seconds))
}

impl<B> Policy<Request<Full<Bytes>>, Response<B>, GatewayError> for RetryPolicy {
    type Future = Pin<Box<tokio::time::Sleep>>;

    fn retry(
        &mut self,
        request: &mut Request<Full<Bytes>>,
        outcome: &mut Result<Response<B>, GatewayError>,
    ) -> Option<Self::Future> {
        if request.extensions().get::<SkipRetries>().is_some() {
            return None;
        }
        let wait = self.wait_for(outcome)?;
        // While it waits the request is at no upstream (the last attempt
        // failed to connect, or was answered with an error and no usage):
        // a client that leaves now owes nothing. The next attempt marks it
        // again once sent.
        if let Some(sent) = RequestContext::of(request).and_then(|context| context.sent.as_ref()) {
            sent.clear();
        }
        self.attempts += 1;
        metrics::counter!(crate::telemetry::UPSTREAM_RETRIES_TOTAL).increment(1);
        tracing::info!(
            attempt = self.attempts,
            wait_ms = wait.as_millis() as u64,
            "retrying the upstream"
        );
        Some(Box::pin(tokio::time::sleep(wait)))
    }

    fn clone_request(&mut self, request: &Request<Full<Bytes>>) -> Option<Request<Full<Bytes>>> {
        let mut clone = Request::new(request.body().clone());
        *clone.method_mut() = request.method().clone();
        *clone.uri_mut() = request.uri().clone();
        *clone.version_mut() = request.version();
        *clone.headers_mut() = request.headers().clone();
        *clone.extensions_mut() = request.extensions().clone();
        Some(clone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::context::SentUpstream;
    use crate::error::ErrorKind;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tower::{ServiceBuilder, ServiceExt, service_fn};

    fn response(status: u16, headers: &[(&str, &str)]) -> Response<()> {
        let mut response = Response::builder().status(status);
        for (name, value) in headers {
            response = response.header(*name, *value);
        }
        response.body(()).unwrap()
    }

    #[test]
    fn only_the_seed_statuses_and_connect_failures_retry() {
        let policy = RetryPolicy::new(3).unwrap();
        for status in [429, 500, 502, 503, 504] {
            assert!(
                policy.wait_for(&Ok(response(status, &[]))).is_some(),
                "{status}"
            );
        }
        for status in [200, 400, 401, 402, 404, 422, 501] {
            assert!(
                policy.wait_for(&Ok(response(status, &[]))).is_none(),
                "{status}"
            );
        }
        let connect = GatewayError::new(ErrorKind::Upstream, "x")
            .with_metadata("upstream_failure", "connect");
        assert!(policy.wait_for::<()>(&Err(connect)).is_some());
        let timeout = GatewayError::new(ErrorKind::UpstreamTimeout, "x")
            .with_metadata("upstream_failure", "timeout");
        assert!(
            policy.wait_for::<()>(&Err(timeout)).is_none(),
            "a request that may have run is not replayed"
        );
    }

    #[test]
    fn waits_honour_retry_after_up_to_the_cap_and_a_daily_429_is_passed_on() {
        let now = UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        let policy = RetryPolicy::new(5)
            .unwrap()
            .max_wait(Duration::from_secs(10))
            .clock(Arc::new(ManualClock::new(now.into())));
        assert_eq!(
            policy.wait_for(&Ok(response(503, &[("retry-after", "3")]))),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            policy.wait_for(&Ok(response(503, &[("retry-after", "60")]))),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            policy.wait_for(&Ok(response(429, &[("retry-after", "60")]))),
            None
        );
        assert_eq!(
            policy.wait_for(&Ok(response(429, &[("x-ratelimit-reset", "86400")]))),
            None
        );
        let in_a_day_ms = (now + Duration::from_secs(86_400))
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
            .to_string();
        assert_eq!(
            policy.wait_for(&Ok(response(429, &[("x-ratelimit-reset", &in_a_day_ms)]))),
            None
        );
        let wait = policy
            .wait_for(&Ok(response(429, &[("x-ratelimit-reset", "2")])))
            .unwrap();
        assert_eq!(wait, Duration::from_secs(2));
        assert_eq!(
            policy.wait_for(&Ok(response(
                429,
                &[("retry-after", "5"), ("x-ratelimit-reset", "86400")]
            ))),
            None,
            "a short Retry-After does not hide a daily reset"
        );
        assert_eq!(
            asked_wait(
                &response(503, &[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")])
                    .headers()
                    .clone(),
                UNIX_EPOCH + Duration::from_secs(784_111_770)
            ),
            Some(Duration::from_secs(7))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_from_one_second_and_stops_at_the_attempt_limit() {
        let calls = Arc::new(AtomicU32::new(0));
        let started = tokio::time::Instant::now();
        let seen = calls.clone();
        let service = ServiceBuilder::new()
            .layer(tower::retry::RetryLayer::new(RetryPolicy::new(3).unwrap()))
            .service(service_fn(move |_: Request<Full<Bytes>>| {
                let seen = seen.clone();
                async move {
                    let call = seen.fetch_add(1, Ordering::SeqCst);
                    let elapsed = started.elapsed();
                    // The first attempt at once; the second after 1–1.2 s;
                    // the third 2–2.4 s after that.
                    match call {
                        0 => assert!(elapsed < Duration::from_millis(1)),
                        1 => assert!(
                            (Duration::from_secs(1)..Duration::from_millis(1_200))
                                .contains(&elapsed),
                            "{elapsed:?}"
                        ),
                        _ => assert!(
                            (Duration::from_secs(3)..Duration::from_millis(3_600))
                                .contains(&elapsed),
                            "{elapsed:?}"
                        ),
                    }
                    Ok::<_, GatewayError>(response(503, &[]))
                }
            }));
        let request = Request::post("/")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let outcome = service.oneshot(request).await.unwrap();
        assert_eq!(
            outcome.status(),
            503,
            "after the last attempt the 503 is passed on"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_sent_mark_is_cleared_while_waiting_and_set_again_by_the_next_attempt() {
        let sent = SentUpstream::default();
        let calls = Arc::new(AtomicU32::new(0));
        let seen = calls.clone();
        let service = ServiceBuilder::new()
            .layer(tower::retry::RetryLayer::new(RetryPolicy::new(3).unwrap()))
            .service(service_fn(move |request: Request<Full<Bytes>>| {
                let seen = seen.clone();
                async move {
                    let sent = RequestContext::of(&request)
                        .and_then(|context| context.sent.as_ref())
                        .unwrap();
                    assert!(!sent.is_marked(), "each attempt starts unsent");
                    match seen.fetch_add(1, Ordering::SeqCst) {
                        // Sent, and answered with an error status.
                        0 => {
                            sent.attempt().mark();
                            Ok(response(503, &[]))
                        }
                        // Never connected.
                        1 => Err(GatewayError::new(ErrorKind::Upstream, "x")
                            .with_metadata("upstream_failure", "connect")),
                        _ => {
                            sent.attempt().mark();
                            Ok(response(200, &[]))
                        }
                    }
                }
            }));
        let mut request = Request::post("/")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        RequestContext::of_mut(&mut request).sent = Some(sent.clone());
        let calling = tokio::spawn(service.oneshot(request));
        for (after, attempts) in [(500, 1), (1_000 + 500, 2)] {
            tokio::time::sleep(Duration::from_millis(after)).await;
            assert_eq!(calls.load(Ordering::SeqCst), attempts);
            assert!(!sent.is_marked(), "waiting after attempt {attempts}");
        }
        assert_eq!(calling.await.unwrap().unwrap().status(), 200);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert!(sent.is_marked(), "the last attempt reached the upstream");
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_503_then_success_returns_the_success_with_the_same_body() {
        let calls = Arc::new(AtomicU32::new(0));
        let seen = calls.clone();
        let service = ServiceBuilder::new()
            .layer(tower::retry::RetryLayer::new(RetryPolicy::new(3).unwrap()))
            .service(service_fn(move |request: Request<Full<Bytes>>| {
                let seen = seen.clone();
                async move {
                    let body = http_body_util::BodyExt::collect(request.into_body())
                        .await
                        .unwrap()
                        .to_bytes();
                    assert_eq!(body, "payload", "every attempt sends the same body");
                    let status = if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                        503
                    } else {
                        200
                    };
                    Ok::<_, GatewayError>(response(status, &[("retry-after", "1")]))
                }
            }));
        let request = Request::post("/")
            .body(Full::new(Bytes::from_static(b"payload")))
            .unwrap();
        assert_eq!(service.oneshot(request).await.unwrap().status(), 200);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
