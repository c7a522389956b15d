//! Errors in Anthropic's shape for the Messages API's clients: their SDKs
//! (and Claude Code) read `{"type": "error", "error": {"type", "message"}}`
//! and raise by its type, where every other client reads the canonical
//! `{"error": {"code", "type", "message", "metadata"}}`.

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::{Map, Value};

use crate::error::{GatewayError, anthropic_error_json};
use crate::routing::is_messages_path;

/// The error body a request's client reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorShape {
    /// The canonical body (OpenAI's shape, with `code` and `metadata`).
    OpenAi,
    /// Anthropic's, for the Messages API's paths.
    Anthropic,
}

impl ErrorShape {
    /// The shape for a request to `path`.
    pub(crate) fn of(path: &str) -> ErrorShape {
        if is_messages_path(path) {
            ErrorShape::Anthropic
        } else {
            ErrorShape::OpenAi
        }
    }

    /// `error` as a response in this shape.
    pub(crate) fn render<B: From<Bytes>>(self, error: &GatewayError) -> Response<B> {
        match self {
            ErrorShape::OpenAi => error.to_response(),
            ErrorShape::Anthropic => error.to_anthropic_response(),
        }
    }
}

/// Whether `body` is an error in Anthropic's shape.
pub(crate) fn is_anthropic_error(body: &[u8]) -> bool {
    let Ok(Value::Object(top)) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    top.get("type").and_then(Value::as_str) == Some("error")
        && top.get("error").is_some_and(|error| {
            error.get("type").is_some_and(Value::is_string)
                && error.get("message").is_some_and(Value::is_string)
        })
}

/// A canonical error body (which the error mapper let pass) in Anthropic's
/// shape: its message and metadata under the type Anthropic gives
/// `status`. A body in neither shape is kept as it is.
pub(crate) fn in_anthropic_shape(status: StatusCode, body: Bytes) -> Bytes {
    if is_anthropic_error(&body) {
        return body;
    }
    let Ok(canonical) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    let Some(message) = canonical.pointer("/error/message").and_then(Value::as_str) else {
        return body;
    };
    let metadata = canonical
        .pointer("/error/metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_else(Map::new);
    Bytes::from(anthropic_error_json(status, message, &metadata).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ErrorKind, LimitSource};
    use proptest::prelude::*;
    use std::time::Duration;

    #[test]
    fn the_messages_paths_and_no_others_take_anthropics_shape() {
        for path in [
            "/api/v1/messages",
            "/v1/messages",
            "/api/v1/Messages/",
            "/api/v1/messages/count_tokens",
            "/api/v1/%6Dessages",
            "/api/v1/x/../messages",
        ] {
            assert_eq!(ErrorShape::of(path), ErrorShape::Anthropic, "{path}");
        }
        for path in [
            "/api/v1/chat/completions",
            "/api/v1/messages/other",
            "/api/v1/count_tokens",
            "/",
            "",
        ] {
            assert_eq!(ErrorShape::of(path), ErrorShape::OpenAi, "{path}");
        }
    }

    #[test]
    fn a_gateway_refusal_keeps_its_status_headers_and_metadata() {
        let refusal = GatewayError::rate_limited(
            LimitSource::AccountRate,
            "slow down",
            Duration::from_millis(2500),
        );
        let response: Response<Bytes> = ErrorShape::Anthropic.render(&refusal);
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["retry-after"], "3");
        let body: Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(body["error"]["message"], "slow down");
        assert_eq!(body["error"]["metadata"]["limit_source"], "account_rate");
        // Each status gets the type Anthropic gives it.
        for (kind, expected) in [
            (ErrorKind::InvalidRequest, "invalid_request_error"),
            (ErrorKind::InvalidParameter, "invalid_request_error"),
            (ErrorKind::Authentication, "authentication_error"),
            (ErrorKind::InsufficientCredits, "billing_error"),
            (ErrorKind::Forbidden, "permission_error"),
            (ErrorKind::NotFound, "not_found_error"),
            (ErrorKind::PayloadTooLarge, "request_too_large"),
            (ErrorKind::Internal, "api_error"),
            (ErrorKind::Upstream, "api_error"),
            (ErrorKind::ServiceUnavailable, "overloaded_error"),
            (ErrorKind::UpstreamTimeout, "timeout_error"),
        ] {
            let json = GatewayError::new(kind, "m").to_anthropic_json();
            assert_eq!(json["error"]["type"], expected, "{kind:?}");
        }
    }

    #[test]
    fn canonical_bodies_are_converted_and_anthropic_ones_kept() {
        let canonical = GatewayError::insufficient_credits(LimitSource::Credits, "top up")
            .with_metadata("affordable_tokens", 12)
            .to_json()
            .to_string();
        let converted: Value = serde_json::from_slice(&in_anthropic_shape(
            StatusCode::PAYMENT_REQUIRED,
            Bytes::from(canonical),
        ))
        .unwrap();
        assert_eq!(converted["error"]["type"], "billing_error");
        assert_eq!(converted["error"]["message"], "top up");
        assert_eq!(converted["error"]["metadata"]["affordable_tokens"], 12);
        let anthropic = Bytes::from_static(
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        );
        assert!(is_anthropic_error(&anthropic));
        assert_eq!(
            in_anthropic_shape(StatusCode::from_u16(529).unwrap(), anthropic.clone()),
            anthropic
        );
        assert!(!is_anthropic_error(
            br#"{"error":{"type":"x","message":"m"}}"#
        ));
    }

    proptest! {
        #[test]
        fn any_body_is_converted_or_kept_never_lost(
            body in proptest::collection::vec(any::<u8>(), 0..256),
            status in 400u16..600,
        ) {
            let status = StatusCode::from_u16(status).unwrap();
            let out = in_anthropic_shape(status, Bytes::from(body.clone()));
            prop_assert!(out == body || is_anthropic_error(&out));
        }
    }
}
