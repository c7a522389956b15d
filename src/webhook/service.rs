//! [`WebhookSecret`]: the checks before a webhook action, and the action.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::body::{ReadError, read_bounded};
use bytes::Bytes;
use http::header::{ALLOW, AUTHORIZATION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body;
use serde_json::json;
use tower_service::Service;

use super::actions::ActionReply;
use super::layer::{WebhookConfig, WebhookLimits};
use super::payload::FlowAction;
use super::routes::WebhookRoute;
use crate::answer::Answer;
use crate::answer::AnswerFuture as ResponseFuture;
use crate::response_body::BoxError;
use crate::store::SharedStore;
use crate::store::{Check, Limit, StoreError};

/// The header a caller may send the route's secret in instead of
/// `Authorization: Bearer`.
pub const SECRET_HEADER: &str = "x-gateway-webhook-secret";

// Rate windows and in-flight counts are per route and client.
pub use crate::client_addr::ClientAddr;

/// Answers the configured webhook routes (exact paths, `POST` only) after
/// checking, in order: the method (405), the address's failed
/// authentications (429 `auth_failures`, before the secret is compared),
/// the secret (401), the routes'
/// own places when set (503 `overloaded` when full, 429
/// `too_many_in_flight` past the address's share, see
/// [`WebhookSecretLayer::unauthenticated_limits`](super::WebhookSecretLayer::unauthenticated_limits)),
/// the client's rate window (429), the content type (415), the client's
/// requests in flight (429), the body's size (413) and time and pace to
/// arrive (408), and the payload (400). Every other request goes to the
/// inner service untouched.
///
/// The secret comes before everything kept in the store: a request without
/// it costs no store round trip and counts in neither the client's rate
/// window nor its in-flight requests, so a flood of wrong secrets cannot
/// lock the route's real caller out.
///
/// See the [module docs](super) for an example.
///
/// Ready when the inner service is: the requests it passes on call it at
/// once (a limit below it holds its own answers too).
#[derive(Clone, Debug)]
pub struct WebhookSecret<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<WebhookConfig>,
}

impl<S, B, ResBody> Service<Request<B>> for WebhookSecret<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    B: Body + Send + 'static,
    B::Error: Into<BoxError>,
    B::Data: Send,
{
    type Response = Response<crate::response_body::ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service's readiness: a request passed on is called at
        // once, with no clone of the services below.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let path = request.uri().path();
        let Some(index) = self
            .config
            .routes
            .iter()
            .position(|route| route.path == path)
        else {
            return ResponseFuture::passing(self.inner.call(request));
        };
        let config = Arc::clone(&self.config);
        ResponseFuture::answering(Box::pin(async move {
            let route = &config.routes[index];
            let mut slot = None;
            let answer = match checked_action(&config, route, request, &mut slot).await {
                Ok(action) => {
                    crate::telemetry::webhook_decision(None);
                    from_reply(route, config.actions.execute(&route.scope, action).await)
                }
                Err(refusal) => {
                    crate::telemetry::webhook_decision(refusal.body["code"].as_str());
                    refusal
                }
            };
            // Given back before the answer leaves, refusals included: the
            // client's next request finds its slot free.
            if let Some(slot) = slot {
                slot.release().await;
            }
            answer.into_response()
        }))
    }
}

/// A refusal before or by the action: `{ok: false, routeId, code, error, result: {}}`.
fn refused(route: &WebhookRoute, status: StatusCode, code: &str, error: &str) -> Answer {
    Answer {
        status,
        headers: Vec::new(),
        raw: None,
        body: json!({
            "ok": false,
            "routeId": route.scope.route_id,
            "code": code,
            "error": error,
            "result": {},
        }),
    }
}

/// What the action answered, in the route's envelope.
fn from_reply(route: &WebhookRoute, reply: ActionReply) -> Answer {
    let body = match &reply {
        ActionReply::Done { result, .. } => json!({
            "ok": true,
            "routeId": route.scope.route_id,
            "result": result,
        }),
        ActionReply::Refused {
            code,
            error,
            result,
            ..
        } => json!({
            "ok": false,
            "routeId": route.scope.route_id,
            "code": code,
            "error": error,
            "result": result,
        }),
    };
    Answer {
        status: reply.status(),
        headers: Vec::new(),
        raw: None,
        body,
    }
}

/// Runs every check before the action, in the documented order (see
/// [`WebhookSecret`]): the action, or the refusal. The in-flight slot, once taken, is left in `slot` for the
/// caller to give back.
async fn checked_action<B>(
    config: &WebhookConfig,
    route: &WebhookRoute,
    request: Request<B>,
    slot: &mut Option<InFlightSlot>,
) -> Result<FlowAction, Answer>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let limits = &config.limits;
    if request.method() != Method::POST {
        return Err(refused(
            route,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "webhook routes accept only POST",
        )
        .with_header(ALLOW, HeaderValue::from_static("POST")));
    }
    // Counted with the bearer keys' failures from the same address.
    let address = request
        .extensions()
        .get::<ClientAddr>()
        .map(|client| client.0);
    // An address blocked for its failures is refused before its secret is
    // compared: else a right guess among many wrong ones would still pass.
    if let Some(retry_after) = config
        .auth_failures
        .as_ref()
        .and_then(|failures| failures.blocked(address))
    {
        return Err(too_many(
            route,
            "auth_failures",
            "too many requests with a missing or wrong secret from this address; \
             check the secret and retry after the Retry-After seconds",
            retry_after,
        ));
    }
    // Before anything the store counts: a caller without the secret costs
    // one constant-time comparison, no round trip, and can neither spend
    // the client's rate window nor hold its in-flight slots.
    if !presents_secret(route, request.headers()) {
        if let Some(retry_after) = config
            .auth_failures
            .as_ref()
            .and_then(|failures| failures.record_failure(address))
        {
            return Err(too_many(
                route,
                "auth_failures",
                "too many requests with a missing or wrong secret from this address; \
                 check the secret and retry after the Retry-After seconds",
                retry_after,
            ));
        }
        return Err(refused(
            route,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong secret: send it as `Authorization: Bearer <secret>` \
             or in `x-gateway-webhook-secret`",
        )
        .with_header(
            http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer"),
        ));
    }
    // The routes' own places (when set), held until the body is read: a
    // client that trickles its body holds none of the gateway's.
    let _place = match &config.places {
        Some(places) => Some(
            places
                .enter(address)
                .map_err(|refusal| crowded(route, &refusal))?,
        ),
        None => None,
    };
    let client = match address {
        Some(address) => address.to_string(),
        None => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "webhook request without a ClientAddr extension: all such requests share \
                     one rate window and one in-flight count per route"
                );
            });
            "unknown".to_owned()
        }
    };
    // One scope per route and client: on Redis both counters share a slot.
    let scope = format!("webhook:{}:{client}", route.scope.route_id);
    let now = config.clock.now();
    let window = Check::new(
        "requests",
        Limit::FixedWindow {
            limit: limits.requests_per_window,
            window: limits.rate_window,
        },
        1,
    );
    match config.store.check_and_add(&scope, &[window], now).await {
        Ok(decision) if !decision.admitted => {
            return Err(too_many(
                route,
                "rate_limited",
                &format!(
                    "more than {} requests in {} s on this route from this client; \
                     retry after the window ends",
                    limits.requests_per_window,
                    limits.rate_window.as_secs_f64()
                ),
                decision.retry_after(),
            ));
        }
        Ok(_) => {}
        Err(error) => store_failure(config, route, &error)?,
    }
    if !is_json(request.headers()) {
        return Err(refused(
            route,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as JSON with `Content-Type: application/json`",
        ));
    }
    *slot = Some(InFlightSlot::acquire(config, route, scope, now).await?);
    let body = read_body(config, route, address, request).await?;
    match FlowAction::parse(&body) {
        Ok(action) => Ok(action),
        Err(error) => Err(refused(
            route,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &error.to_string(),
        )),
    }
}

fn too_many(route: &WebhookRoute, code: &str, message: &str, retry_after: Duration) -> Answer {
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    refused(route, StatusCode::TOO_MANY_REQUESTS, code, message)
        .with_header(RETRY_AFTER, HeaderValue::from(seconds.max(1)))
}

/// The configured policy for a store that cannot be reached: go on, or 503.
fn store_failure(
    config: &WebhookConfig,
    route: &WebhookRoute,
    error: &StoreError,
) -> Result<(), Answer> {
    config
        .failure_policy
        .on_store_error("WebhookSecret", error)
        .map_err(|_| {
            refused(
                route,
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the webhook's limits cannot be checked right now; retry shortly",
            )
        })
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

/// Whether the request carries the route's secret: the dedicated header
/// when present, `Authorization: Bearer <secret>` otherwise.
fn presents_secret(route: &WebhookRoute, headers: &HeaderMap) -> bool {
    let presented = match headers.get(SECRET_HEADER) {
        Some(value) => Some(value.as_bytes()),
        None => headers.get(AUTHORIZATION).and_then(|value| {
            let value = value.as_bytes();
            let scheme = value.get(..7)?;
            scheme.eq_ignore_ascii_case(b"bearer ").then(|| &value[7..])
        }),
    };
    presented.is_some_and(|secret| !secret.is_empty() && route.secret.matches(secret))
}

/// The 503 or 429 of a place refused, in the route's envelope.
fn crowded(route: &WebhookRoute, refusal: &crate::error::GatewayError) -> Answer {
    let message = refusal.message();
    match refusal.kind() {
        crate::error::ErrorKind::RateLimited => {
            too_many(route, "too_many_in_flight", message, Duration::from_secs(1))
        }
        _ => refused(
            route,
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            message,
        )
        .with_header(RETRY_AFTER, HeaderValue::from_static("1")),
    }
}

async fn read_body<B>(
    config: &WebhookConfig,
    route: &WebhookRoute,
    address: Option<std::net::IpAddr>,
    request: Request<B>,
) -> Result<Bytes, Answer>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let WebhookLimits {
        max_body_bytes,
        body_timeout,
        ..
    } = config.limits;
    let too_large = || {
        refused(
            route,
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            &format!("the body is over {max_body_bytes} bytes"),
        )
    };
    let pace = config
        .places
        .as_ref()
        .map(|places| places.limits().body_pace());
    match read_bounded(request, max_body_bytes, body_timeout, pace).await {
        Ok(body) => Ok(body),
        Err(ReadError::TooLarge) => Err(too_large()),
        Err(ReadError::TimedOut) => {
            // A trickled body holds a place as a flood does: it counts with
            // the address's failed authentications.
            if let Some(retry_after) = config
                .auth_failures
                .as_ref()
                .and_then(|failures| failures.record_failure(address))
            {
                return Err(too_many(
                    route,
                    "auth_failures",
                    "too many failed authentications or bodies too slow from this address; \
                     retry after the Retry-After seconds",
                    retry_after,
                ));
            }
            Err(refused(
                route,
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                &match pace {
                    Some(pace) => format!(
                        "the body did not arrive in time: send it whole within {} s, {}",
                        body_timeout.as_secs_f64(),
                        pace.describe()
                    ),
                    None => format!(
                        "the body did not arrive within {} s",
                        body_timeout.as_secs_f64()
                    ),
                },
            ))
        }
        Err(ReadError::Broken) => Err(refused(
            route,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "the body could not be read to its end",
        )),
    }
}

/// One of the client's in-flight slots on a route, given back when the
/// request ends — also when it is dropped half-way (client gone).
pub(crate) struct InFlightSlot {
    held: Option<(SharedStore, String, String)>,
}

const IN_FLIGHT: &str = "in_flight";

impl InFlightSlot {
    async fn acquire(
        config: &WebhookConfig,
        route: &WebhookRoute,
        scope: String,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Self, Answer> {
        let holder = crate::random::alphanumeric(20);
        let limits = &config.limits;
        match config
            .store
            .acquire_slot(
                &scope,
                IN_FLIGHT,
                &holder,
                limits.max_in_flight,
                limits.in_flight_lease,
                now,
            )
            .await
        {
            Ok(outcome) if outcome.acquired => Ok(InFlightSlot {
                held: Some((Arc::clone(&config.store), scope, holder)),
            }),
            Ok(_) => Err(too_many(
                route,
                "too_many_in_flight",
                &format!(
                    "this client already has {} requests in flight on this route; \
                     wait for one to finish",
                    limits.max_in_flight
                ),
                Duration::from_secs(1),
            )),
            Err(error) => {
                store_failure(config, route, &error)?;
                Ok(InFlightSlot { held: None })
            }
        }
    }

    async fn release(mut self) {
        if let Some((store, scope, holder)) = self.held.take() {
            release(store, scope, holder).await;
        }
    }
}

impl Drop for InFlightSlot {
    fn drop(&mut self) {
        if let Some((store, scope, holder)) = self.held.take() {
            // Dropped mid-request: give the slot back in the background
            // (its lease frees it anyway if there is no runtime).
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(release(store, scope, holder));
            }
        }
    }
}

async fn release(store: SharedStore, scope: String, holder: String) {
    if let Err(error) = store.release_slot(&scope, IN_FLIGHT, &holder).await {
        tracing::warn!(%error, "webhook in-flight slot not released; its lease will free it");
    }
}
