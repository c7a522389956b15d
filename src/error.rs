//! [`GatewayError`] and the one renderer that turns it into a response.
//!
//! Every rejection a layer makes, and every upstream failure the error
//! mapper rewrites, goes through [`GatewayError::to_response`], so clients
//! see one body shape whatever failed:
//!
//! ```json
//! {"error": {"message": "…", "type": "rate_limit_error", "code": 429, "metadata": {…}}}
//! ```
//!
//! `message`, `type` and `code` satisfy OpenAI-style clients; `code` is the
//! HTTP status as a number and `metadata` is an object, which is what
//! OpenRouter-style clients read.
//!
//! ```
//! use std::time::Duration;
//! use http_body_util::Full;
//! use bytes::Bytes;
//! use modelgate::error::{GatewayError, LimitSource};
//!
//! let error = GatewayError::rate_limited(
//!     LimitSource::FreePerMinute,
//!     "free models allow 20 requests per minute; retry in 3 seconds",
//!     Duration::from_millis(2_100),
//! );
//! let response: http::Response<Full<Bytes>> = error.to_response();
//! assert_eq!(response.status(), 429);
//! assert_eq!(response.headers()["retry-after"], "3");
//! ```

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use serde_json::{Map, Value};

/// What went wrong, which fixes the status code and the `error.type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// 400: the request is malformed (bad JSON, missing field, strict-schema breach).
    InvalidRequest,
    /// 401: missing, malformed, unknown, deleted, disabled or expired key.
    Authentication,
    /// 402: the key's credit limit is reached or the account balance is negative.
    InsufficientCredits,
    /// 403: the key is valid but may not do this (a management key calling
    /// chat completions, a normal key calling the management API).
    Forbidden,
    /// 404: the gateway has no such resource (an unknown key hash, route or account).
    NotFound,
    /// 405: the route exists but not for this method.
    MethodNotAllowed,
    /// 408: the request body did not arrive in time.
    RequestTimeout,
    /// 409: the request contradicts the state it would change (a key
    /// deleting or disabling itself).
    Conflict,
    /// 413: the request body is larger than allowed.
    PayloadTooLarge,
    /// 422: a parameter is out of range or of the wrong type.
    InvalidParameter,
    /// 429: a rate limit or quota is exhausted.
    RateLimited,
    /// 500: a fault inside the gateway.
    Internal,
    /// 502: the upstream failed or answered something unusable.
    Upstream,
    /// 503: the gateway or a store it depends on is unavailable.
    ServiceUnavailable,
    /// 504: the upstream did not answer in time.
    UpstreamTimeout,
}

impl ErrorKind {
    /// Every kind, in status order.
    pub const ALL: [ErrorKind; 15] = [
        ErrorKind::InvalidRequest,
        ErrorKind::Authentication,
        ErrorKind::InsufficientCredits,
        ErrorKind::Forbidden,
        ErrorKind::NotFound,
        ErrorKind::MethodNotAllowed,
        ErrorKind::RequestTimeout,
        ErrorKind::Conflict,
        ErrorKind::PayloadTooLarge,
        ErrorKind::InvalidParameter,
        ErrorKind::RateLimited,
        ErrorKind::Internal,
        ErrorKind::Upstream,
        ErrorKind::ServiceUnavailable,
        ErrorKind::UpstreamTimeout,
    ];

    /// The HTTP status of this kind.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::InsufficientCredits => StatusCode::PAYMENT_REQUIRED,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::InvalidParameter => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Upstream => StatusCode::BAD_GATEWAY,
            ErrorKind::ServiceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The `error.type` string of this kind.
    pub fn type_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::InsufficientCredits => "insufficient_credits",
            ErrorKind::Forbidden => "permission_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::RequestTimeout => "request_timeout",
            ErrorKind::Conflict => "conflict_error",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::InvalidParameter => "invalid_parameter",
            ErrorKind::RateLimited => "rate_limit_error",
            ErrorKind::Internal => "api_error",
            ErrorKind::Upstream => "upstream_error",
            ErrorKind::ServiceUnavailable => "service_unavailable",
            ErrorKind::UpstreamTimeout => "upstream_timeout",
        }
    }

    /// The kind whose status is `status`, if the gateway has one.
    pub fn from_status(status: StatusCode) -> Option<ErrorKind> {
        ErrorKind::ALL
            .into_iter()
            .find(|kind| kind.status() == status)
    }
}

/// In the extensions of every response [`GatewayError::to_response`]
/// builds: what refused the request, for access logs and metrics without
/// reading the body, and for [`Fallback`](crate::proxy::Fallback), which
/// tells the gateway's own answers from the upstream's by it (no upstream
/// can set an extension, whatever body it sends).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The error's kind.
    pub kind: ErrorKind,
    /// `metadata.limit_source`, when the error has one.
    pub limit_source: Option<String>,
}

/// Which limit rejected a request; goes into `error.metadata.limit_source`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitSource {
    /// 402: the key's own credit limit.
    KeyLimit,
    /// 402: the account balance is negative.
    Credits,
    /// 429: the account-wide rate rule.
    AccountRate,
    /// 429: a per-model rate rule.
    ModelRate,
    /// 429: the per-minute limit of `:free` models.
    FreePerMinute,
    /// 429: the per-day limit of `:free` models.
    FreePerDay,
    /// 429: the upstream's own rate limit, passed on.
    Upstream,
    /// 429: the rate of an account's calls to the JSON API's `KeyRoutes`
    /// (its management keys', and its inference keys' usage reads).
    ManagementRate,
    /// 429: the key's own request rate (its `rate_limit`).
    Key,
}

impl LimitSource {
    /// The string clients see in `metadata.limit_source`.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitSource::KeyLimit => "key_limit",
            LimitSource::Credits => "credits",
            LimitSource::AccountRate => "account_rate",
            LimitSource::ModelRate => "model_rate",
            LimitSource::FreePerMinute => "free_per_minute",
            LimitSource::FreePerDay => "free_per_day",
            LimitSource::Upstream => "upstream",
            LimitSource::ManagementRate => "management_rate",
            LimitSource::Key => "key",
        }
    }
}

/// A failure to be shown to the client in the canonical error body.
///
/// Boxed inside, so a `Result<_, GatewayError>` stays one pointer wide on
/// the happy path.
#[derive(Clone, Debug, PartialEq)]
pub struct GatewayError(Box<Inner>);

#[derive(Clone, Debug, PartialEq)]
struct Inner {
    kind: ErrorKind,
    /// Set when an upstream status outside the table is kept as it was.
    status: Option<StatusCode>,
    message: Cow<'static, str>,
    metadata: Map<String, Value>,
    retry_after: Option<Duration>,
    headers: HeaderMap,
}

impl GatewayError {
    /// A failure of `kind` with a message for people: what was wrong and what to do.
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        GatewayError(Box::new(Inner {
            kind,
            status: None,
            message: message.into(),
            metadata: Map::new(),
            retry_after: None,
            headers: HeaderMap::new(),
        }))
    }

    /// An upstream failure answered with the upstream's own `status` (any
    /// 4xx or 5xx). Its `type` is that of the status when the gateway has
    /// one, else `invalid_request_error` for 4xx and `upstream_error` for 5xx.
    pub fn with_upstream_status(status: StatusCode, message: impl Into<Cow<'static, str>>) -> Self {
        let kind = ErrorKind::from_status(status).unwrap_or(if status.is_client_error() {
            ErrorKind::InvalidRequest
        } else {
            ErrorKind::Upstream
        });
        let mut error = GatewayError::new(kind, message);
        if status.is_client_error() || status.is_server_error() {
            error.0.status = Some(status);
        }
        error
    }

    /// A 429 from `source`, telling the client to wait `retry_after`.
    pub fn rate_limited(
        source: LimitSource,
        message: impl Into<Cow<'static, str>>,
        retry_after: Duration,
    ) -> Self {
        GatewayError::new(ErrorKind::RateLimited, message)
            .with_limit_source(source)
            .with_retry_after(retry_after)
    }

    /// A 402 from `source` (`KeyLimit` or `Credits`).
    pub fn insufficient_credits(
        source: LimitSource,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        GatewayError::new(ErrorKind::InsufficientCredits, message).with_limit_source(source)
    }

    /// The 500 of a layer that needs what an earlier layer adds and did
    /// not find it: a stack built in the wrong order, named plainly.
    pub fn missing_layer(layer: &'static str, needs: &'static str) -> Self {
        GatewayError::new(
            ErrorKind::Internal,
            format!("{layer} needs {needs} before it in the stack, and it did not run"),
        )
        .with_metadata("layer", layer)
    }

    /// Sets `metadata.limit_source`.
    pub fn with_limit_source(self, source: LimitSource) -> Self {
        self.with_metadata("limit_source", source.as_str())
    }

    /// Adds one entry to `error.metadata`.
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.0.metadata.insert(key.into(), value.into());
        self
    }

    /// Sets the wait announced in `Retry-After`.
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.0.retry_after = Some(retry_after);
        self
    }

    /// Adds a response header (such as `X-RateLimit-Remaining`).
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.0.headers.append(name, value);
        self
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.0.status.unwrap_or_else(|| self.0.kind.status())
    }

    /// The message shown to the client.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// The `error.metadata` object.
    pub fn metadata(&self) -> &Map<String, Value> {
        &self.0.metadata
    }

    /// The wait announced in `Retry-After`, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        self.0.retry_after
    }

    /// The `Retry-After` value: whole seconds, rounded up, at least 1. A 429
    /// always has one (1 s when no wait was given), so clients back off.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        match (self.0.retry_after, self.0.kind) {
            (Some(wait), _) => Some(retry_after_seconds(wait)),
            (None, ErrorKind::RateLimited) => Some(1),
            (None, _) => None,
        }
    }

    /// The canonical JSON body.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "error": {
                "message": self.0.message,
                "type": self.0.kind.type_str(),
                "code": self.status().as_u16(),
                "metadata": self.0.metadata,
            }
        })
    }

    /// The body in Anthropic's error shape, for clients of the Messages
    /// API: `{"type": "error", "error": {"type", "message", "metadata"}}`,
    /// the type Anthropic gives the status ([`anthropic_error_type`]) and
    /// the gateway's metadata kept.
    pub fn to_anthropic_json(&self) -> Value {
        anthropic_error_json(self.status(), &self.0.message, &self.0.metadata)
    }

    /// Renders the complete response: status, `Content-Type`, `Retry-After`,
    /// extra headers and the canonical body.
    pub fn to_response<B: From<Bytes>>(&self) -> Response<B> {
        self.response_with(&self.to_json())
    }

    /// [`to_response`](Self::to_response) with the body in Anthropic's
    /// shape ([`to_anthropic_json`](Self::to_anthropic_json)).
    pub fn to_anthropic_response<B: From<Bytes>>(&self) -> Response<B> {
        self.response_with(&self.to_anthropic_json())
    }

    fn response_with<B: From<Bytes>>(&self, body: &Value) -> Response<B> {
        let body = Bytes::from(body.to_string());
        let mut response = Response::new(B::from(body));
        *response.status_mut() = self.status();
        response.extensions_mut().insert(Refusal {
            kind: self.0.kind,
            limit_source: self
                .0
                .metadata
                .get("limit_source")
                .and_then(Value::as_str)
                .map(str::to_owned),
        });
        let headers = response.headers_mut();
        headers.extend(self.0.headers.clone());
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        // An explicit wait wins; a `Retry-After` passed on from an upstream
        // stays as it was; a 429 without either says 1 s.
        match (self.0.retry_after, headers.contains_key(RETRY_AFTER)) {
            (Some(wait), _) => {
                headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_seconds(wait)));
            }
            (None, false) if self.0.kind == ErrorKind::RateLimited => {
                headers.insert(RETRY_AFTER, HeaderValue::from(1u64));
            }
            (None, _) => {}
        }
        response
    }
}

impl fmt::Display for GatewayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status().as_u16(),
            self.0.kind.type_str(),
            self.0.message
        )
    }
}

impl std::error::Error for GatewayError {}

/// The `error.type` Anthropic's API gives `status`, so its SDKs raise the
/// exception they would (`BadRequestError`, `AuthenticationError`,
/// `PermissionDeniedError`, `NotFoundError`, `RateLimitError`, …). A 402
/// is `billing_error`, a 503 `overloaded_error`, a 504 `timeout_error`.
pub fn anthropic_error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

/// An error body in Anthropic's shape (see
/// [`GatewayError::to_anthropic_json`]).
pub(crate) fn anthropic_error_json(
    status: StatusCode,
    message: &str,
    metadata: &Map<String, Value>,
) -> Value {
    serde_json::json!({
        "type": "error",
        "error": {
            "type": anthropic_error_type(status),
            "message": message,
            "metadata": metadata,
        }
    })
}

/// Whole seconds for `Retry-After`: rounded up, never below 1, so a client
/// that waits what it is told never arrives early and never busy-loops.
pub fn retry_after_seconds(wait: Duration) -> u64 {
    let whole = wait.as_secs();
    let rounded = if wait.subsec_nanos() > 0 {
        whole.saturating_add(1)
    } else {
        whole
    };
    rounded.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    async fn render(error: &GatewayError) -> (Response<()>, Value) {
        let response: Response<Full<Bytes>> = error.to_response();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (
            Response::from_parts(parts, ()),
            serde_json::from_slice(&bytes).unwrap(),
        )
    }

    #[tokio::test]
    async fn every_kind_renders_its_status_type_and_canonical_body() {
        let expected = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (402, "insufficient_credits"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (405, "method_not_allowed"),
            (408, "request_timeout"),
            (409, "conflict_error"),
            (413, "payload_too_large"),
            (422, "invalid_parameter"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (502, "upstream_error"),
            (503, "service_unavailable"),
            (504, "upstream_timeout"),
        ];
        assert_eq!(ErrorKind::ALL.len(), expected.len());
        for (kind, (status, type_str)) in ErrorKind::ALL.into_iter().zip(expected) {
            let error = GatewayError::new(kind, format!("message for {status}"));
            let (response, body) = render(&error).await;
            assert_eq!(response.status().as_u16(), status, "{kind:?}");
            assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
            let retry_after = response.headers().get(RETRY_AFTER);
            if kind == ErrorKind::RateLimited {
                assert_eq!(retry_after.unwrap(), "1", "a 429 always says when to retry");
            } else {
                assert!(retry_after.is_none());
            }
            assert_eq!(
                body,
                serde_json::json!({"error": {
                    "message": format!("message for {status}"),
                    "type": type_str,
                    "code": status,
                    "metadata": {},
                }})
            );
            assert_eq!(ErrorKind::from_status(response.status()), Some(kind));
        }
    }

    #[tokio::test]
    async fn rate_limited_carries_limit_source_and_retry_after() {
        let error = GatewayError::rate_limited(
            LimitSource::FreePerDay,
            "daily free-model limit reached",
            Duration::from_secs(3600),
        )
        .with_header(
            HeaderName::from_static("x-ratelimit-remaining"),
            HeaderValue::from_static("0"),
        );
        let (response, body) = render(&error).await;
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()[RETRY_AFTER], "3600");
        assert_eq!(response.headers()["x-ratelimit-remaining"], "0");
        assert_eq!(body["error"]["metadata"]["limit_source"], "free_per_day");
        assert_eq!(body["error"]["code"], 429);
    }

    #[tokio::test]
    async fn insufficient_credits_names_its_source() {
        for source in [LimitSource::KeyLimit, LimitSource::Credits] {
            let error = GatewayError::insufficient_credits(source, "no credits");
            let (response, body) = render(&error).await;
            assert_eq!(response.status(), 402);
            assert_eq!(body["error"]["metadata"]["limit_source"], source.as_str());
        }
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_at_least_one() {
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
        assert_eq!(retry_after_seconds(Duration::from_nanos(1)), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(999)), 1);
        assert_eq!(retry_after_seconds(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(1_001)), 2);
        assert_eq!(retry_after_seconds(Duration::from_secs(59)), 59);
        assert_eq!(retry_after_seconds(Duration::new(59, 1)), 60);
        assert_eq!(retry_after_seconds(Duration::MAX), u64::MAX);
    }

    #[tokio::test]
    async fn upstream_statuses_outside_the_table_are_kept() {
        let error = GatewayError::with_upstream_status(StatusCode::GONE, "no such model");
        let (response, body) = render(&error).await;
        assert_eq!(response.status(), 410);
        assert_eq!(body["error"]["code"], 410);
        assert_eq!(body["error"]["type"], "invalid_request_error");
        let error = GatewayError::with_upstream_status(StatusCode::NOT_FOUND, "no such model");
        assert_eq!(error.to_json()["error"]["type"], "not_found_error");
        let error =
            GatewayError::with_upstream_status(StatusCode::from_u16(529).unwrap(), "overloaded");
        assert_eq!(error.status(), 529);
        assert_eq!(error.to_json()["error"]["type"], "upstream_error");
        let error = GatewayError::with_upstream_status(StatusCode::SERVICE_UNAVAILABLE, "down");
        assert_eq!(error.to_json()["error"]["type"], "service_unavailable");
    }

    #[test]
    fn message_escapes_round_trip_in_json() {
        let message = "model \"x\" isn't valid: ünïcode \n line";
        let error = GatewayError::new(ErrorKind::InvalidRequest, message);
        assert_eq!(error.to_json()["error"]["message"], message);
    }

    proptest::proptest! {
        #[test]
        fn retry_after_never_shortens_the_wait(nanos in proptest::prelude::any::<u64>()) {
            let wait = Duration::from_nanos(nanos);
            let seconds = retry_after_seconds(wait);
            proptest::prop_assert!(seconds >= 1);
            proptest::prop_assert!(Duration::from_secs(seconds) >= wait);
            proptest::prop_assert!(Duration::from_secs(seconds) < wait + Duration::from_secs(1) || seconds == 1);
        }
    }
}
