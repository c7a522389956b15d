//! An upstream's error response in the one format: a canonical body passes
//! as it is; any other is rewritten, keeping the status, the headers that
//! say when to retry, and (cut short) the upstream's own words.

use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderName, HeaderValue};
use http::response::Parts;
use http::{Response, StatusCode};
use serde_json::Value;

use super::anthropic::{ErrorShape, in_anthropic_shape, is_anthropic_error};
use super::layer::ErrorMapperConfig;
use crate::error::GatewayError;
use crate::response_body::{BoxError, ResponseBody};

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

fn summary(status: StatusCode, inner: &str) -> String {
    let reason = status.canonical_reason().unwrap_or("error");
    match status.as_u16() {
        429 => format!(
            "{inner} answered {} {reason}: it is rate limiting; retry with backoff",
            status.as_u16()
        ),
        400..=499 => format!(
            "{inner} rejected the request with {} {reason}",
            status.as_u16()
        ),
        _ => format!(
            "{inner} answered {} {reason}; retry with backoff",
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
    canonical_error_of(status, body, max_message_chars, UPSTREAM)
}

/// How an upstream is named in the messages of its errors.
pub(super) const UPSTREAM: &str = "the upstream";

/// [`canonical_upstream_error`], the inner service named `inner`.
fn canonical_error_of(
    status: StatusCode,
    body: &[u8],
    max_message_chars: usize,
    inner: &str,
) -> Option<GatewayError> {
    if is_canonical(status, body) {
        return None;
    }
    let error = upstream_error(status, inner);
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
fn upstream_error(status: StatusCode, inner: &str) -> GatewayError {
    let error = GatewayError::with_upstream_status(status, summary(status, inner))
        .with_metadata("upstream_status", status.as_u16());
    if status == StatusCode::TOO_MANY_REQUESTS {
        error.with_limit_source(crate::error::LimitSource::Upstream)
    } else {
        error
    }
}

/// The response for an upstream error response that was read (or failed
/// to be read) in full, in the error shape its client reads.
pub(super) fn rewrite_error_response<B>(
    parts: Parts,
    body: Result<Bytes, BoxError>,
    config: &ErrorMapperConfig,
    shape: ErrorShape,
) -> Response<ResponseBody<B>> {
    let status = parts.status;
    let encoded = parts
        .headers
        .get(CONTENT_ENCODING)
        .is_some_and(|encoding| encoding != "identity");
    let rewritten = match &body {
        // Compressed bytes are neither judged nor shown as text.
        Ok(_) if encoded => Some(upstream_error(status, config.inner_name).with_metadata(
            "upstream_message",
            "(the error body was compressed and is not shown)",
        )),
        // An Anthropic upstream's own error, to an Anthropic client: as it is.
        Ok(bytes) if shape == ErrorShape::Anthropic && is_anthropic_error(bytes) => None,
        Ok(bytes) => canonical_error_of(
            status,
            bytes,
            config.max_upstream_message_chars,
            config.inner_name,
        ),
        Err(_) => Some(upstream_error(status, config.inner_name).with_metadata(
            "upstream_message",
            "(the error body was too large, too slow or broke off while being read)",
        )),
    };
    let Some(mut error) = rewritten else {
        let bytes = body.unwrap_or_default();
        let bytes = match shape {
            ErrorShape::Anthropic => in_anthropic_shape(status, bytes),
            ErrorShape::OpenAi => bytes,
        };
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
    shape.render(&error)
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
