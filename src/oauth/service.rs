use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_MAX_AGE, ALLOW, CACHE_CONTROL, CONTENT_TYPE, HeaderValue,
};
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use serde_json::json;
use tower_service::Service;

use super::code::{ExchangeError, ExchangeRefusal};
use super::input::exchange_request;
use super::layer::CodeExchangeConfig;
use crate::answer::AnswerFuture as ResponseFuture;
use crate::auth::AuthFailures;
use crate::body::ReadError;
use crate::client_addr::ClientAddr;
use crate::error::{ErrorKind, GatewayError};
use crate::response_body::{BoxError, ResponseBody};
use crate::routing::path_is;
use crate::store::FailurePolicy;

/// This layer's name in logs and 503s.
const LAYER: &str = "CodeExchange";

/// Answers `POST /api/v1/auth/keys`: an app exchanges the authorization
/// code the consent page gave it, with its PKCE verifier, for a key of
/// the account that approved it, `{"key": "<plaintext>", "user_id":
/// "<account>"}`, once. It needs no bearer key (the app has none yet), so
/// it goes before [`BearerAuth`](crate::auth::BearerAuth). Every other
/// request goes to the inner service untouched. See the
/// [module docs](super).
///
/// Ready when the inner service is: the requests it passes on call it at
/// once (a limit below it holds its own answers too).
#[derive(Clone, Debug)]
pub struct CodeExchange<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<CodeExchangeConfig>,
}

/// Whether `path` is the exchange's, read as every route check in the
/// crate reads paths.
fn is_exchange(path: &str) -> bool {
    path_is(path, &["api", "v1", "auth", "keys"])
}

impl<S, B, ResBody> Service<Request<B>> for CodeExchange<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service's readiness: a request passed on is called at
        // once, with no clone of the services below.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if !is_exchange(request.uri().path()) {
            return ResponseFuture::passing(self.inner.call(request));
        }
        let config = Arc::clone(&self.config);
        ResponseFuture::answering(Box::pin(async move {
            let mut response = match *request.method() {
                Method::OPTIONS => preflight(),
                _ => match answer(&config, request).await {
                    Ok(body) => {
                        let mut response = Response::new(Bytes::from(body.to_string()));
                        response
                            .headers_mut()
                            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                        response
                    }
                    Err(error) => error.to_response(),
                },
            };
            let headers = response.headers_mut();
            // An app in a browser exchanges from its own origin. The answer
            // goes only to whoever holds the code and its verifier, and no
            // cookie or other credential of this gateway is involved, so
            // any origin may read it.
            headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
            // The answer holds a new key.
            headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }))
    }
}

/// The answer to a browser's CORS preflight of the exchange.
fn preflight() -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    *response.status_mut() = StatusCode::NO_CONTENT;
    let headers = response.headers_mut();
    headers.insert(
        ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("POST"),
    );
    headers.insert(
        ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("content-type"),
    );
    headers.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    response
}

/// The exchange's answer, or its refusal; the cheap checks first: method,
/// body size, JSON, the code's shape, then one store read.
async fn answer<B>(
    config: &CodeExchangeConfig,
    request: Request<B>,
) -> Result<serde_json::Value, GatewayError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    if request.method() != Method::POST {
        return Err(GatewayError::new(
            ErrorKind::MethodNotAllowed,
            "this endpoint answers POST only: {\"code\", \"code_verifier\", \"code_challenge_method\"}",
        )
        .with_header(ALLOW, HeaderValue::from_static("POST, OPTIONS")));
    }
    let client = request
        .extensions()
        .get::<ClientAddr>()
        .map(|client| client.0);
    // Past its failure limit an address gets no store read and no place.
    if let Some(failures) = &config.failures
        && let Some(retry_after) = failures.blocked(client)
    {
        return Err(too_many_failures(failures, retry_after));
    }
    let _place = config.places.enter(client)?;
    let body = config
        .places
        .read_body(request, config.max_body_bytes, config.body_timeout)
        .await
        .map_err(|error| unread(error, config, client))?;
    let exchange = exchange_request(&body)?;
    match config.codes.exchange(&exchange).await {
        Ok((key, record)) => Ok(json!({
            "key": key.expose(),
            "user_id": record.account,
        })),
        Err(ExchangeError::Refused(refusal)) => Err(counted(config, client, refusal)),
        Err(ExchangeError::Store(error)) => Err(FailurePolicy::refusal(LAYER, &error)),
    }
}

/// The 403 of `refusal`, counted as a failed authentication of `client`;
/// past the address's limit, the 429 instead.
fn counted(
    config: &CodeExchangeConfig,
    client: Option<IpAddr>,
    refusal: ExchangeRefusal,
) -> GatewayError {
    if let Some(failures) = &config.failures
        && let Some(retry_after) = failures.record_failure(client)
    {
        return too_many_failures(failures, retry_after);
    }
    GatewayError::new(ErrorKind::Forbidden, refusal.message())
        .with_metadata("reason", refusal.reason())
}

/// 429 `auth_failures`: this address made too many refused exchanges.
fn too_many_failures(failures: &AuthFailures, retry_after: Duration) -> GatewayError {
    let limit = failures.limit();
    GatewayError::new(
        ErrorKind::RateLimited,
        format!(
            "too many refused authorization codes or failed authentications from this address ({} in {} s); retry after the Retry-After seconds",
            limit.max_failures, limit.window_seconds
        ),
    )
    .with_metadata("reason", "auth_failures")
    .with_retry_after(retry_after.max(Duration::from_secs(1)))
}

fn unread(error: ReadError, config: &CodeExchangeConfig, client: Option<IpAddr>) -> GatewayError {
    match error {
        ReadError::TooLarge => GatewayError::new(
            ErrorKind::PayloadTooLarge,
            format!(
                "the exchange body is over {} bytes; send {{\"code\", \"code_verifier\", \"code_challenge_method\"}} only",
                config.max_body_bytes
            ),
        ),
        ReadError::TimedOut => {
            // Holding a place with a trickle is what a flood does: it
            // counts as a failed authentication.
            if let Some(failures) = &config.failures
                && let Some(retry_after) = failures.record_failure(client)
            {
                return too_many_failures(failures, retry_after);
            }
            config
                .places
                .slow_body("the exchange body", config.body_timeout)
        }
        ReadError::Broken => GatewayError::new(
            ErrorKind::InvalidRequest,
            "the exchange body could not be read to its end",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::AuthFailureLimit;
    use crate::clock::ManualClock;
    use crate::keys::{KeyDirectory, SharedStore};
    use crate::oauth::{Approval, AuthCodes, ChallengeMethod, CodeExchangeLayer, s256_challenge};
    use crate::store::MemoryStore;
    use chrono::{TimeZone, Utc};
    use http_body_util::{BodyExt, Full};
    use std::net::Ipv4Addr;
    use tower::{ServiceBuilder, ServiceExt, service_fn};

    const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";

    struct Setup {
        directory: KeyDirectory,
        layer: CodeExchangeLayer,
        clock: Arc<ManualClock>,
    }

    fn setup(max_failures: u32) -> Setup {
        let clock = Arc::new(ManualClock::new(
            Utc.with_ymd_and_hms(2026, 11, 18, 12, 0, 0).unwrap(),
        ));
        let store: SharedStore = Arc::new(MemoryStore::new());
        let directory = KeyDirectory::builder(store).clock(clock.clone()).build();
        let failures = AuthFailures::with_clock(
            AuthFailureLimit {
                max_failures,
                window_seconds: 60,
                ..AuthFailureLimit::default()
            },
            clock.clone(),
        )
        .unwrap();
        let layer = CodeExchangeLayer::new(directory.clone()).failure_limit(failures);
        Setup {
            directory,
            layer,
            clock,
        }
    }

    async fn call(
        layer: &CodeExchangeLayer,
        method: Method,
        path: &str,
        body: &str,
    ) -> (StatusCode, http::HeaderMap, serde_json::Value) {
        let service = ServiceBuilder::new()
            .layer(layer.clone())
            .service(service_fn(|_: Request<Full<Bytes>>| async {
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                    b"\"inner\"",
                ))))
            }));
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        request
            .extensions_mut()
            .insert(ClientAddr(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7))));
        let response = service.oneshot(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (
            parts.status,
            parts.headers,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        )
    }

    async fn code(directory: &KeyDirectory) -> String {
        let approval = Approval {
            account: "acme".into(),
            key_name: "app".into(),
            limit_nanos: None,
            limit_reset: None,
            key_expires_at: None,
            callback_url: "https://app.example.com/cb".into(),
            code_challenge: s256_challenge(VERIFIER),
            code_challenge_method: ChallengeMethod::S256,
        };
        let issued = AuthCodes::new(directory.clone())
            .issue(approval)
            .await
            .unwrap();
        issued.code.expose().to_owned()
    }

    #[test]
    fn the_route_is_read_as_every_route() {
        for path in [
            "/api/v1/auth/keys",
            "/API/v1/Auth/keys/",
            "//api/./v1/auth/keys",
        ] {
            assert!(is_exchange(path), "{path}");
        }
        for path in [
            "/api/v1/auth/keys/code",
            "/api/v1/keys",
            "/auth",
            "/api/v1/auth",
        ] {
            assert!(!is_exchange(path), "{path}");
        }
    }

    #[tokio::test]
    async fn an_exchange_answers_the_key_once_and_any_origin_may_read_it() {
        let setup = setup(20);
        let code = code(&setup.directory).await;
        let body =
            json!({"code": code, "code_verifier": VERIFIER, "code_challenge_method": "S256"})
                .to_string();
        let (status, headers, answer) =
            call(&setup.layer, Method::POST, "/api/v1/auth/keys", &body).await;
        assert_eq!(status, 200, "{answer}");
        assert!(answer["key"].as_str().unwrap().starts_with("mg-v1-"));
        assert_eq!(answer["user_id"], "acme");
        assert_eq!(headers["access-control-allow-origin"], "*");
        assert_eq!(headers["cache-control"], "no-store");
        let (status, headers, answer) =
            call(&setup.layer, Method::POST, "/api/v1/auth/keys", &body).await;
        assert_eq!(status, 403);
        assert_eq!(answer["error"]["metadata"]["reason"], "code_used");
        assert_eq!(answer["error"]["type"], "permission_error");
        assert_eq!(headers["access-control-allow-origin"], "*");

        let (status, headers, _) =
            call(&setup.layer, Method::OPTIONS, "/api/v1/auth/keys", "").await;
        assert_eq!(status, 204);
        assert_eq!(headers["access-control-allow-methods"], "POST");
        assert_eq!(headers["access-control-allow-headers"], "content-type");
        let (status, headers, _) = call(&setup.layer, Method::GET, "/api/v1/auth/keys", "").await;
        assert_eq!(status, 405);
        assert_eq!(headers["allow"], "POST, OPTIONS");
        let (status, _, answer) = call(&setup.layer, Method::GET, "/api/v1/key", "").await;
        assert_eq!((status, answer), (StatusCode::OK, json!("inner")));
    }

    #[tokio::test]
    async fn refusals_count_against_the_address_and_bad_input_does_not() {
        let setup = setup(3);
        let code = code(&setup.directory).await;
        let wrong = json!({"code": code, "code_verifier": "x".repeat(43)}).to_string();
        for _ in 0..3 {
            let (status, _, answer) =
                call(&setup.layer, Method::POST, "/api/v1/auth/keys", &wrong).await;
            assert_eq!(status, 403);
            assert_eq!(answer["error"]["metadata"]["reason"], "verifier_mismatch");
        }
        // Malformed input is the app's bug, not a guess: 400, not counted.
        let (status, _, _) = call(
            &setup.layer,
            Method::POST,
            "/api/v1/auth/keys",
            "{\"code\": 1}",
        )
        .await;
        assert_eq!(status, 400);
        let (status, headers, answer) =
            call(&setup.layer, Method::POST, "/api/v1/auth/keys", &wrong).await;
        assert_eq!(status, 429, "{answer}");
        assert_eq!(answer["error"]["metadata"]["reason"], "auth_failures");
        assert!(headers.contains_key("retry-after"));
        // A blocked address is refused before the store is read: even the
        // right verifier waits for the window's end, and its code is kept.
        let right = json!({"code": code, "code_verifier": VERIFIER}).to_string();
        let (status, _, answer) =
            call(&setup.layer, Method::POST, "/api/v1/auth/keys", &right).await;
        assert_eq!(status, 429, "{answer}");
        setup.clock.advance(Duration::from_secs(60));
        let (status, _, answer) =
            call(&setup.layer, Method::POST, "/api/v1/auth/keys", &right).await;
        assert_eq!(status, 200, "{answer}");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_unread() {
        let setup = setup(20);
        let layer = setup.layer.max_body_bytes(64);
        let body = json!({"code": "a".repeat(100), "code_verifier": VERIFIER}).to_string();
        let (status, _, answer) = call(&layer, Method::POST, "/api/v1/auth/keys", &body).await;
        assert_eq!(status, 413, "{answer}");
    }
}
