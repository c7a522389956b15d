//! `ErrorMapper`: the outermost layer, so a client never sees a reset
//! connection, an HTML page or an error body in a shape it cannot read.
//!
//! - An inner `Err` becomes 504 (a timeout), 503 (overload) or 502
//!   (connection refused or reset, anything else).
//! - A panic in an inner service becomes 500.
//! - An error response (4xx, 5xx) whose body is already canonical passes
//!   through byte for byte; any other (HTML, plain text, other JSON shapes,
//!   empty) is rewritten into the canonical body with the upstream's status,
//!   its `Retry-After` and `X-RateLimit-*` headers, and its own message in
//!   `metadata.upstream_message`, truncated.
//! - Successful responses stream through untouched.
//!
//! Its error type is [`Infallible`](std::convert::Infallible), so it ends
//! a stack that axum or hyper can serve directly.
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use modelgate::error_mapper::ErrorMapperLayer;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let upstream = service_fn(|_request: Request<Full<Bytes>>| async {
//!     let page = Full::new(Bytes::from_static(b"<html><h1>502 Bad Gateway</h1></html>"));
//!     Ok::<_, std::io::Error>(Response::builder().status(502).body(page).unwrap())
//! });
//! let service = ServiceBuilder::new().layer(ErrorMapperLayer::new()).service(upstream);
//!
//! let response = service.oneshot(Request::new(Full::new(Bytes::new()))).await.unwrap();
//! assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
//! let body = response.into_body().collect().await.unwrap().to_bytes();
//! let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
//! assert_eq!(json["error"]["type"], "upstream_error");
//! assert_eq!(json["error"]["metadata"]["upstream_message"], "502 Bad Gateway");
//! # }
//! ```

mod future;
mod layer;
mod service;

use std::io;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};
use http::response::Parts;
use http::{Response, StatusCode};
use serde_json::Value;

pub use future::ResponseFuture;
pub use layer::ErrorMapperLayer;
pub use service::ErrorMapper;

use crate::error::{ErrorKind, GatewayError};
use crate::response_body::{causes, BoxError, ResponseBody};
use layer::ErrorMapperConfig;

fn panicked() -> GatewayError {
    tracing::error!("an inner service panicked; answered 500");
    GatewayError::new(
        ErrorKind::Internal,
        "the gateway failed while handling this request; retry later, and report it if it persists",
    )
}

/// The response for an inner service's `Err`, by what its source chain says.
fn inner_error(error: BoxError) -> GatewayError {
    if let Some(error) = error.downcast_ref::<GatewayError>() {
        return error.clone();
    }
    for current in causes(&*error) {
        if current.is::<tower::timeout::error::Elapsed>()
            || current.is::<tokio::time::error::Elapsed>()
        {
            return GatewayError::new(
                ErrorKind::UpstreamTimeout,
                "the upstream did not answer in time; retry with backoff",
            );
        }
        if current.is::<tower::load_shed::error::Overloaded>() {
            return GatewayError::new(
                ErrorKind::ServiceUnavailable,
                "the gateway is overloaded; retry with backoff",
            );
        }
        if let Some(io_error) = current.downcast_ref::<io::Error>() {
            match io_error.kind() {
                io::ErrorKind::TimedOut => {
                    return GatewayError::new(
                        ErrorKind::UpstreamTimeout,
                        "the upstream did not answer in time; retry with backoff",
                    )
                }
                io::ErrorKind::ConnectionRefused => {
                    return GatewayError::new(
                        ErrorKind::Upstream,
                        "the upstream refused the connection; retry with backoff",
                    )
                }
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe => {
                    return GatewayError::new(
                        ErrorKind::Upstream,
                        "the connection to the upstream broke; retry with backoff",
                    )
                }
                _ => {}
            }
        }
    }
    // The details (which may name hosts or URLs) go to the log only.
    tracing::warn!(%error, "inner service failed; answered 502");
    GatewayError::new(
        ErrorKind::Upstream,
        "the upstream request failed; retry with backoff",
    )
}

/// Whether `body` already is the canonical error body for `status`.
fn is_canonical(status: StatusCode, body: &[u8]) -> bool {
    let Ok(Value::Object(top)) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    let Some(Value::Object(error)) = top.get("error") else {
        return false;
    };
    error.get("message").is_some_and(Value::is_string)
        && error.get("type").is_some_and(Value::is_string)
        && error.get("code").and_then(Value::as_u64) == Some(u64::from(status.as_u16()))
        && error.get("metadata").is_none_or(Value::is_object)
}

/// The upstream's own words: `error.message`, `message`, `detail` or
/// `error` from JSON; the text of an HTML page; otherwise the body as text.
fn upstream_message(body: &[u8], max_chars: usize) -> String {
    let text = match serde_json::from_slice::<Value>(body) {
        Ok(json) => [
            json.pointer("/error/message"),
            json.get("message"),
            json.get("detail"),
            json.get("error"),
        ]
        .into_iter()
        .flatten()
        .find_map(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| json.to_string()),
        Err(_) => strip_markup(&String::from_utf8_lossy(body)),
    };
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match collapsed.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &collapsed[..cut]),
        None => collapsed,
    }
}

/// Drops `<…>` tags and the contents of `<head>`, `<style>` and `<script>`,
/// leaving a page's visible text.
fn strip_markup(text: &str) -> String {
    if !text.trim_start().starts_with('<') {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('<') {
        out.push_str(&rest[..open]);
        out.push(' ');
        rest = &rest[open..];
        let lower: String = rest
            .chars()
            .take(8)
            .collect::<String>()
            .to_ascii_lowercase();
        let skip_until = ["<head", "<style", "<script"]
            .into_iter()
            .find(|tag| {
                lower.starts_with(tag)
                    && lower[tag.len()..].starts_with(|c: char| c == '>' || c.is_ascii_whitespace())
            })
            .map(|tag| format!("</{}>", &tag[1..]));
        let end = match skip_until {
            Some(closing) => rest
                .to_ascii_lowercase()
                .find(&closing)
                .map(|at| at + closing.len()),
            None => rest.find('>').map(|at| at + 1),
        };
        match end {
            Some(end) => rest = &rest[end..],
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

fn summary(status: StatusCode) -> String {
    let reason = status.canonical_reason().unwrap_or("error");
    match status.as_u16() {
        429 => format!(
            "the upstream answered {} {reason}: it is rate limiting; retry with backoff",
            status.as_u16()
        ),
        400..=499 => format!(
            "the upstream rejected the request with {} {reason}",
            status.as_u16()
        ),
        _ => format!(
            "the upstream answered {} {reason}; retry with backoff",
            status.as_u16()
        ),
    }
}

/// The canonical error for an upstream error response with `status` and
/// `body`: `None` when `body` already is canonical (it passes through as
/// is), else the rewritten error, keeping the upstream's own message (at
/// most `max_message_chars` characters) in `metadata.upstream_message`.
///
/// ```
/// use http::StatusCode;
/// use modelgate::error_mapper::canonical_upstream_error;
///
/// let error = canonical_upstream_error(StatusCode::SERVICE_UNAVAILABLE, b"try later", 100).unwrap();
/// assert_eq!(error.status(), 503);
/// assert_eq!(error.metadata()["upstream_message"], "try later");
/// let canonical = br#"{"error":{"message":"m","type":"rate_limit_error","code":429,"metadata":{}}}"#;
/// assert!(canonical_upstream_error(StatusCode::TOO_MANY_REQUESTS, canonical, 100).is_none());
/// ```
pub fn canonical_upstream_error(
    status: StatusCode,
    body: &[u8],
    max_message_chars: usize,
) -> Option<GatewayError> {
    if is_canonical(status, body) {
        return None;
    }
    let error = upstream_error(status);
    Some(if body.is_empty() {
        error
    } else {
        error.with_metadata(
            "upstream_message",
            upstream_message(body, max_message_chars),
        )
    })
}

/// The canonical error for an upstream status, before its message is known.
fn upstream_error(status: StatusCode) -> GatewayError {
    let error = GatewayError::with_upstream_status(status, summary(status))
        .with_metadata("upstream_status", status.as_u16());
    if status == StatusCode::TOO_MANY_REQUESTS {
        error.with_limit_source(crate::error::LimitSource::Upstream)
    } else {
        error
    }
}

/// The response for an upstream error response that was read (or failed
/// to be read) in full.
fn rewrite_error_response<B>(
    parts: Parts,
    body: Result<Bytes, BoxError>,
    config: &ErrorMapperConfig,
) -> Response<ResponseBody<B>> {
    let status = parts.status;
    let encoded = parts
        .headers
        .get(CONTENT_ENCODING)
        .is_some_and(|encoding| encoding != "identity");
    let rewritten = match &body {
        // Compressed bytes are neither judged nor shown as text.
        Ok(_) if encoded => Some(upstream_error(status).with_metadata(
            "upstream_message",
            "(the error body was compressed and is not shown)",
        )),
        Ok(bytes) => canonical_upstream_error(status, bytes, config.max_upstream_message_chars),
        Err(_) => Some(upstream_error(status).with_metadata(
            "upstream_message",
            "(the error body was too large, too slow or broke off while being read)",
        )),
    };
    let Some(mut error) = rewritten else {
        let bytes = body.unwrap_or_default();
        let mut response = Response::from_parts(parts, ResponseBody::full(bytes));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return response;
    };
    for (name, value) in &parts.headers {
        if keeps_header(name) {
            error = error.with_header(name.clone(), value.clone());
        }
    }
    error.to_response()
}

/// Headers of an upstream error kept on the rewritten response: when to
/// retry, the rate-limit state, the request id, and what HTTP itself needs
/// an error to carry (`Allow` on 405, `WWW-Authenticate` on 401, CORS).
/// Framing headers (`Content-Length`, `Content-Encoding`, …) never are.
fn keeps_header(name: &HeaderName) -> bool {
    let name = name.as_str();
    matches!(
        name,
        "retry-after" | "x-request-id" | "allow" | "www-authenticate" | "vary"
    ) || name.starts_with("x-ratelimit-")
        || name.starts_with("access-control-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_bodies_are_recognised_exactly() {
        let canonical =
            br#"{"error":{"message":"m","type":"rate_limit_error","code":429,"metadata":{}}}"#;
        assert!(is_canonical(StatusCode::TOO_MANY_REQUESTS, canonical));
        assert!(
            !is_canonical(StatusCode::BAD_GATEWAY, canonical),
            "code must match the status"
        );
        let openai_style = br#"{"error":{"message":"m","type":"x","code":"rate_limit_exceeded"}}"#;
        assert!(!is_canonical(StatusCode::TOO_MANY_REQUESTS, openai_style));
        assert!(!is_canonical(StatusCode::TOO_MANY_REQUESTS, b""));
        assert!(!is_canonical(StatusCode::TOO_MANY_REQUESTS, b"[1]"));
        let bad_metadata = br#"{"error":{"message":"m","type":"t","code":429,"metadata":3}}"#;
        assert!(!is_canonical(StatusCode::TOO_MANY_REQUESTS, bad_metadata));
    }

    #[test]
    fn upstream_messages_are_extracted_and_truncated() {
        assert_eq!(
            upstream_message(br#"{"error":{"message":"quota"}}"#, 100),
            "quota"
        );
        assert_eq!(
            upstream_message(br#"{"detail":"not found"}"#, 100),
            "not found"
        );
        assert_eq!(upstream_message(br#"{"error":"boom"}"#, 100), "boom");
        assert_eq!(upstream_message(br#"{"weird":1}"#, 100), r#"{"weird":1}"#);
        assert_eq!(
            upstream_message(b"plain   text\nhere", 100),
            "plain text here"
        );
        let page = b"<html><head><title>x</title><style>p{}</style></head><body><h1>503 Service Unavailable</h1><script>alert(1)</script></body></html>";
        assert_eq!(upstream_message(page, 100), "503 Service Unavailable");
        assert_eq!(upstream_message("ééééé".as_bytes(), 3), "ééé…");
        assert_eq!(
            upstream_message(&[0xff, 0xfe, b'a'], 10),
            "\u{fffd}\u{fffd}a"
        );
    }

    #[test]
    fn inner_errors_map_by_cause() {
        let refused: BoxError = Box::new(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(inner_error(refused).status(), 502);
        let timed_out: BoxError = Box::new(io::Error::from(io::ErrorKind::TimedOut));
        assert_eq!(inner_error(timed_out).status(), 504);
        let elapsed: BoxError = Box::new(tower::timeout::error::Elapsed::new());
        assert_eq!(inner_error(elapsed).status(), 504);
        let overloaded: BoxError = Box::new(tower::load_shed::error::Overloaded::new());
        assert_eq!(inner_error(overloaded).status(), 503);
        let wrapped: BoxError = Box::new(io::Error::other(io::Error::from(
            io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(inner_error(wrapped).status(), 502);
        let gateway: BoxError = Box::new(GatewayError::new(ErrorKind::ServiceUnavailable, "x"));
        assert_eq!(inner_error(gateway).status(), 503);
        let other: BoxError = "something".into();
        assert_eq!(inner_error(other).status(), 502);
    }

    proptest::proptest! {
        #[test]
        fn any_error_body_is_rewritten_or_kept_never_panics(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512), status in 400u16..600) {
            let status = StatusCode::from_u16(status).unwrap();
            let message = upstream_message(&body, 50);
            proptest::prop_assert!(message.chars().count() <= 51);
            let _ = is_canonical(status, &body);
        }
    }
}

#[cfg(test)]
mod layer_tests {
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http::Request;
    use http_body_util::{BodyExt, Full};
    use tower::{ServiceBuilder, ServiceExt};

    use super::*;

    /// A service whose readiness fails or panics, or whose `call` panics outright.
    #[derive(Clone)]
    struct Broken {
        ready_fails: bool,
        ready_panics: bool,
    }

    impl tower::Service<Request<Full<Bytes>>> for Broken {
        type Response = Response<Full<Bytes>>;
        type Error = io::Error;
        type Future = std::future::Ready<Result<Self::Response, io::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
            if self.ready_panics {
                panic!("poll_ready panicked");
            }
            if self.ready_fails {
                Poll::Ready(Err(io::Error::from(io::ErrorKind::ConnectionRefused)))
            } else {
                Poll::Ready(Ok(()))
            }
        }

        fn call(&mut self, _: Request<Full<Bytes>>) -> Self::Future {
            panic!("call panicked before returning a future")
        }
    }

    async fn answer(service: Broken) -> (StatusCode, serde_json::Value) {
        let service = ServiceBuilder::new()
            .layer(ErrorMapperLayer::new())
            .service(service);
        let response = service
            .oneshot(Request::new(Full::new(Bytes::new())))
            .await
            .unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn a_panic_inside_call_is_500() {
        let (status, body) = answer(Broken {
            ready_fails: false,
            ready_panics: false,
        })
        .await;
        assert_eq!(status, 500);
        assert_eq!(body["error"]["type"], "api_error");
    }

    #[tokio::test]
    async fn a_readiness_error_is_answered_not_returned() {
        let (status, body) = answer(Broken {
            ready_fails: true,
            ready_panics: false,
        })
        .await;
        assert_eq!(status, 502);
        assert_eq!(body["error"]["code"], 502);
        let (status, _) = answer(Broken {
            ready_fails: false,
            ready_panics: true,
        })
        .await;
        assert_eq!(status, 500);
    }
}
