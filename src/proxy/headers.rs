//! Header handling between client, gateway and upstream.

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

/// The request id header the proxy adds (or keeps) and echoes.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The client headers an upstream receives (an allow-list, so no
/// hop-by-hop header ever crosses): what describes the body and the
/// calling application, nothing that could pick the operator's
/// organisation, carry cookies or credentials, or compress the response
/// past the usage scanner.
const FORWARDED_REQUEST: [&str; 10] = [
    "content-type",
    "anthropic-version",
    "anthropic-beta",
    "traceparent",
    "tracestate",
    "accept",
    "user-agent",
    "http-referer",
    "x-gateway-title",
    "x-title",
];

/// The upstream headers a client receives.
const FORWARDED_RESPONSE: [&str; 6] = [
    "content-type",
    "cache-control",
    "retry-after",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
];

/// Keeps only the request headers an upstream may see, and asks for an
/// uncompressed answer (the usage is read from the bytes as they pass).
pub fn upstream_request_headers(headers: &HeaderMap) -> HeaderMap {
    let mut kept = keep(headers, &FORWARDED_REQUEST);
    kept.insert(
        http::header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    kept
}

/// Keeps only the response headers a client may see.
pub fn client_response_headers(headers: &HeaderMap) -> HeaderMap {
    keep(headers, &FORWARDED_RESPONSE)
}

fn keep(headers: &HeaderMap, allowed: &[&str]) -> HeaderMap {
    let mut kept = HeaderMap::new();
    for (name, value) in headers {
        if allowed.contains(&name.as_str()) {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}

/// The request's id: the client's when it is short and printable, else a
/// new random one.
pub fn request_id(headers: &HeaderMap) -> HeaderValue {
    headers
        .get(&X_REQUEST_ID)
        .filter(|value| {
            value.len() <= 128
                && value
                    .as_bytes()
                    .iter()
                    .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'))
        })
        .cloned()
        .unwrap_or_else(|| {
            // `mg-` and 24 hex digits (96 random bits), written without
            // the formatter.
            let mut id = *b"mg-000000000000000000000000";
            let random = (crate::random::u128() >> 32).to_be_bytes();
            // 12 bytes always fill 24 hex digits.
            let _ = hex::encode_to_slice(&random[4..], &mut id[3..]);
            HeaderValue::from_bytes(&id).expect("hex is a valid header value")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowed_headers_cross_the_gateway() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("content-type", "application/json"),
            ("cookie", "session=1"),
            ("openai-organization", "org-other"),
            ("x-api-key", "k"),
            ("accept-encoding", "gzip"),
            ("http-referer", "https://app.example"),
            ("connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
        ] {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let up = upstream_request_headers(&headers);
        let names: Vec<_> = up.keys().map(|name| name.as_str()).collect();
        assert_eq!(names, ["content-type", "http-referer", "accept-encoding"]);
        assert_eq!(up["accept-encoding"], "identity");
        let mut response = HeaderMap::new();
        response.insert("set-cookie", HeaderValue::from_static("a=1"));
        response.insert("openai-organization", HeaderValue::from_static("org"));
        response.insert("retry-after", HeaderValue::from_static("1"));
        let down = client_response_headers(&response);
        assert_eq!(
            down.keys().map(|name| name.as_str()).collect::<Vec<_>>(),
            ["retry-after"]
        );
    }

    #[test]
    fn a_clean_client_request_id_is_kept_and_anything_else_replaced() {
        let mut headers = HeaderMap::new();
        headers.insert(X_REQUEST_ID.clone(), HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&headers), "abc-123");
        headers.insert(X_REQUEST_ID.clone(), HeaderValue::from_static("a b"));
        assert!(request_id(&headers).to_str().unwrap().starts_with("mg-"));
        assert_ne!(request_id(&HeaderMap::new()), request_id(&HeaderMap::new()));
    }
}
