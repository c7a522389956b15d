//! The standalone gateway: an [`Upstream`] client at the bottom, a
//! [`RetryPolicy`] above it, and every layer of the crate stacked in front,
//! configured from one JSON document ([`GatewayConfig`]).
//! `examples/proxy.rs` serves [`gateway`] over HTTP.
//!
//! The stack, outermost first:
//!
//! ```text
//! DrainUnread -> AccessLog -> ClientAddr -> SettingsPage -> LeakAlerts -> CodeExchange
//!   -> WebhookSecret -> ErrorMapper -> BearerAuth -> InFlightLimit -> BodyLimit -> KeyRoutes -> Fallback
//!   -> GlobalRateLimit -> FreeModelQuota -> CreditGuard -> chat completions only
//!   -> Retry -> Providers -> Upstream
//! ```
//!
//! The webhook routes of `plugins.entries.webhooks` are answered by
//! [`WebhookSecret`](crate::webhook::WebhookSecret) before any gateway
//! layer: they carry their own secret, limits and answer format. So are
//! secret-scanning alerts (`POST /api/v1/leaks`, with `leak_scanning`), by
//! [`LeakAlerts`](crate::leaks::LeakAlerts): they are signed, not keyed.
//! So is an app's exchange of its OAuth code for a key
//! (`POST /api/v1/auth/keys`), by [`CodeExchange`](crate::oauth::CodeExchange):
//! the app has no key yet. None of these three takes one of the
//! `max_in_flight` places, which only authenticated requests hold; each
//! has its own bounds (`unauthenticated`,
//! [`UnauthenticatedLimits`](crate::in_flight::UnauthenticatedLimits)).
//!
//! Only `POST /api/v1/chat/completions` is forwarded; the key routes are
//! answered by [`KeyRoutes`](crate::api::KeyRoutes); anything else is a
//! canonical 404, so no other spelling of a model endpoint slips past the
//! limits.
//!
//! ```no_run
//! use std::sync::Arc;
//! use modelgate::keys::SharedStore;
//! use modelgate::proxy::{gateway, GatewayConfig, Upstream, UpstreamConfig};
//! use modelgate::store::MemoryStore;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = GatewayConfig::from_json(r#"{
//!     "upstream": {"base_url": "https://api.openai.com/v1", "api_key_env": "OPENAI_API_KEY"},
//!     "pricing": {"models": {"openai/gpt-4o": {"prompt_per_million": 2.5, "completion_per_million": 10}}}
//! }"#)?;
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let upstream = Upstream::new(&config.upstream_config(None)?)?;
//! let service = gateway::<hyper::body::Incoming>(&config, store, upstream)?;
//! // Serve `service` with hyper (see examples/proxy.rs).
//! # let _ = service;
//! # Ok(()) }
//! ```

mod access_log;
mod config;
mod fallback;
mod headers;
mod model_field;
mod models;
mod providers;
mod retry;
mod upstream;

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;
use tower::layer::layer_fn;
use tower::util::BoxCloneService;
use tower::util::MapResponseLayer;
use tower_service::Service;

pub use crate::edit::MAX_SSE_LINE_BYTES;
/// What config types hold a value that may be a credential in: `Debug`
/// prints it as `[redacted]`.
pub use crate::secrets::Redacted;
pub use access_log::{AccessLog, AccessLogLayer, Annotate, AnnotateLayer};
pub use config::{
    BodySection, ConfigError, CreditSection, EmailSection, GatewayConfig, GenerationsSection,
    LeakScanningSection, ModelPrefix, NotifyWebhookSection, OAuthSection, PluginEntries,
    PluginsSection, ProviderSection, RetrySection, SmtpServer, SqliteSection, SqliteSynchronous,
    UpstreamSection, DEFAULT_SHUTDOWN_GRACE, DEMO_PRICING, DEMO_RATE_LIMITS,
};
pub use fallback::{Fallback, FallbackLayer, MODEL_HEADER};
pub use headers::{client_response_headers, request_id, upstream_request_headers, X_REQUEST_ID};
pub use model_field::{
    rewrite_model_json, rewrite_model_sse_line, BodyKind, ReportedModel, MAX_REWRITTEN_JSON_BYTES,
};
pub use models::{ModelCatalog, MAX_MODELS_PER_REQUEST};
pub use providers::{ProviderUpstream, Providers};
pub use retry::{RetryPolicy, RetryPolicyError, SkipRetries};
pub use upstream::{Upstream, UpstreamConfig, UpstreamConfigError, DEFAULT_CREDENTIAL_HEADERS};

use crate::admission::AdmissionLayers;
use crate::alerts::Alerts;
use crate::api::KeyRoutesLayer;
use crate::auth::{AuthFailures, BearerAuthLayer};
use crate::body::{BodyLimitLayer, DrainUnreadLayer};
use crate::client_addr::{ClientAddrLayer, TrustedProxies};
use crate::clock::{Clock, SystemClock};
use crate::context::{CheckedStack, RequestContext};
use crate::credit::{CreditGuardLayer, PendingSettlements};
use crate::error::{ErrorKind, GatewayError};
use crate::error_mapper::ErrorMapperLayer;
use crate::free_quota::FreeModelQuotaLayer;
use crate::in_flight::InFlightLimitLayer;
use crate::keys::{ByokDirectory, ByokProviders, KeyDirectory, SharedStore};
use crate::leaks::LeakAlertsLayer;
use crate::oauth::CodeExchangeLayer;
use crate::oauth::PlainPkce;
use crate::rate_limit::GlobalRateLimitLayer;
use crate::response_body::{BoxError, ResponseBody};
use crate::secrets::ResolveLimits;
use crate::settings::SettingsPageLayer;
use crate::usage::AppRanking;
use crate::webhook::{resolve_routes, WebhookSecretLayer};

/// The response body of the whole gateway.
pub type GatewayBody = UnsyncBoxBody<Bytes, BoxError>;

/// The whole gateway as one service.
pub type GatewayService<B> = BoxCloneService<Request<B>, Response<GatewayBody>, Infallible>;

/// The gateway: every layer over `store`, in front of `upstream`, with the
/// system clock. Refuses a configuration any layer would refuse.
pub fn gateway<B>(
    config: &GatewayConfig,
    store: SharedStore,
    upstream: Upstream,
) -> Result<GatewayService<B>, ConfigError>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    gateway_with_clock(
        config,
        store,
        upstream,
        Arc::new(SystemClock),
        KeyDirectory::DEFAULT_CACHE_TTL,
    )
}

/// [`gateway`] with a given clock (a manual one in tests) and key cache time.
pub fn gateway_with_clock<B>(
    config: &GatewayConfig,
    store: SharedStore,
    upstream: Upstream,
    clock: Arc<dyn Clock>,
    key_cache_ttl: Duration,
) -> Result<GatewayService<B>, ConfigError>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    build_gateway(config, store, upstream, clock, key_cache_ttl).map(|gateway| gateway.service)
}

/// The gateway, and what a server stopping it waits for.
pub struct Gateway<B> {
    /// The whole gateway as one service.
    pub service: GatewayService<B>,
    /// Its settlements not recorded yet: [`PendingSettlements::flush`]
    /// them once the requests in flight have ended, before exiting.
    pub settlements: PendingSettlements,
    /// Its app counts not written yet: [`AppRanking::flush`] them too.
    pub app_ranking: AppRanking,
    /// Its alerts, with an `alerts` section: [`Alerts::idle`] lets the
    /// last ones go out.
    pub alerts: Option<Alerts>,
}

/// [`gateway_with_clock`], with the handle on its pending settlements.
pub fn build_gateway<B>(
    config: &GatewayConfig,
    store: SharedStore,
    upstream: Upstream,
    clock: Arc<dyn Clock>,
    key_cache_ttl: Duration,
) -> Result<Gateway<B>, ConfigError>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    let directory = KeyDirectory::builder(store.clone())
        .clock(clock.clone())
        .cache_ttl(key_cache_ttl)
        .build();
    // One directory for the routes that change BYOK keys and for
    // CreditGuard that reads them: a change is seen at once here.
    let byok = ByokDirectory::builder(store.clone())
        .clock(clock.clone())
        .build();
    // A config read by `from_json` was checked then; one built in code
    // is checked now, so what follows fails only for what is outside it.
    config.validate()?;
    let max_in_flight = config
        .max_in_flight
        .unwrap_or_else(InFlightLimitLayer::default_max_in_flight);
    let auth_failures =
        AuthFailures::with_clock(config.auth_failures, clock.clone()).map_err(ConfigError::new)?;
    let trusted_proxies =
        TrustedProxies::parse(&config.trusted_proxies).map_err(ConfigError::new)?;
    let webhooks = match config.webhooks() {
        Some(webhooks) => {
            let (routes, _skipped) =
                resolve_routes(webhooks, &config.secrets, &ResolveLimits::default());
            WebhookSecretLayer::new(store.clone(), routes).limits(webhooks.limits)
        }
        None => WebhookSecretLayer::new(store.clone(), Vec::new()),
    }
    .clock(clock.clone())
    .failure_limit(auth_failures.clone())
    .unauthenticated_limits(config.unauthenticated);
    let notifier = config.leak_notifier()?;
    let leak_alerts = match config.scanning_keys()? {
        Some(keys) => LeakAlertsLayer::new(directory.clone(), keys)
            .notifier(notifier.clone())
            .failure_limit(auth_failures.clone())
            .unauthenticated_limits(config.unauthenticated),
        None => LeakAlertsLayer::off(),
    };
    let mut body = BodyLimitLayer::new();
    if let Some(max_body_bytes) = config.body.max_body_bytes {
        body = body.max_body_bytes(max_body_bytes);
    }
    if let Some(ms) = config.body.read_timeout_ms {
        body = body.read_timeout(Duration::from_millis(ms));
    }
    let rate_limit = GlobalRateLimitLayer::new(store.clone(), config.rate_rules())
        .map_err(ConfigError::new)?
        .clock(clock.clone());
    let free_quota = FreeModelQuotaLayer::new(store.clone())
        .rules(config.free_quota)
        .map_err(ConfigError::new)?
        .clock(clock.clone());
    let prices = Arc::new(config.price_table());
    let bottom = if config.providers.is_empty() {
        Providers::single(upstream)
    } else {
        Providers::by_name(config.provider_upstreams()?)
    };
    let catalog = ModelCatalog::new(
        Arc::clone(&prices),
        bottom.names(),
        &config.fallbacks,
        &config.rate_rules(),
        &config.free_quota,
    )
    .map_err(ConfigError::new)?;
    let models_list = Arc::new(catalog.models_list().clone());
    let catalog = Arc::new(catalog);
    // The upstream client marks each request as it sends it: one dropped
    // before that costs nothing.
    let app_ranking = AppRanking::new(store.clone()).clock(clock.clone());
    let mut credit = CreditGuardLayer::new(store, prices)
        .clock(clock)
        .upstream_reports_sending(true)
        .generations(config.generations.settings(app_ranking.clone()));
    // A request is BYOK only when the account's key is what gets sent in
    // place of the gateway's credentials: only to providers with `byok`.
    let byok_providers = bottom.byok_providers();
    if byok_providers != ByokProviders::SingleUpstream {
        credit = credit
            .byok_directory(byok.clone())
            .byok_providers(byok_providers.clone());
    }
    if let Some(tokens) = config.credit.default_max_tokens {
        credit = credit.default_max_tokens(tokens);
    }
    if let Some(seconds) = config.credit.reservation_ttl_seconds {
        credit = credit.reservation_ttl(Duration::from_secs(seconds));
    }
    // Told after each recorded settlement; it only queues.
    let alerts = config
        .alerts()?
        .map(|(rules, notifier)| Alerts::new(rules, directory.clone(), notifier));
    if let Some(alerts) = alerts.clone() {
        credit = credit.on_settled(move |account, key, limit| alerts.settled(account, key, limit));
    }
    for (name, section) in &config.providers {
        if let Some(field) = section.completion_bound_field {
            credit = credit.completion_bound_field(name, field);
        }
    }
    // A body refused unread is read to its end after the answer (within
    // the body limit and 10 s), so the client can read the answer.
    let drain = DrainUnreadLayer::new(
        config
            .body
            .max_body_bytes
            .unwrap_or(BodyLimitLayer::DEFAULT_MAX_BODY_BYTES) as u64,
        Duration::from_secs(10),
    );
    let management_rate = config.management_rate_rule()?;
    let max_pending_codes = config
        .oauth
        .max_pending_codes_per_account
        .unwrap_or(crate::oauth::DEFAULT_MAX_PENDING_CODES_PER_ACCOUNT);
    let plain_pkce = if config.oauth.allow_plain_pkce {
        PlainPkce::Allowed
    } else {
        PlainPkce::Refused
    };
    // Checked as it is built: a layer whose reading of the request's
    // context no layer outside it adds refuses the stack here.
    let service = CheckedStack::new()
        .plain(MapResponseLayer::new(boxed_response))
        .plain(drain)
        .plain(AccessLogLayer::new(Arc::clone(&catalog)))
        .plain(ClientAddrLayer::new(trusted_proxies))
        .plain(SettingsPageLayer::new())
        .plain(leak_alerts)
        // Before BearerAuth: an app exchanging its code has no key yet.
        .plain(
            CodeExchangeLayer::new(directory.clone())
                .failure_limit(auth_failures.clone())
                .unauthenticated_limits(config.unauthenticated),
        )
        .plain(webhooks)
        .plain(ErrorMapperLayer::new())
        // The key before the body: a request without one is refused
        // before anything is buffered or parsed.
        .layer(
            BearerAuthLayer::new(directory.clone())
                .failure_limit(auth_failures)
                .max_concurrent_lookups(
                    config
                        .unauthenticated
                        .max_concurrent_key_lookups
                        .unwrap_or(max_in_flight),
                ),
        )
        // The gateway's places go to authenticated requests only: a flood
        // of requests without a good key, or of bodies trickled to the
        // routes before it, cannot take them from good keys.
        .plain(InFlightLimitLayer::new(max_in_flight))
        .layer(body)
        .layer(AccessLogLayer::annotate())
        .layer(
            KeyRoutesLayer::new(directory)
                .leak_notifier(notifier)
                .free_quota_rules(config.free_quota)
                .byok_directory(byok)
                .byok_providers(byok_providers)
                .app_ranking(app_ranking.clone())
                .public_ranking(config.generations.public_ranking)
                .plain_pkce(plain_pkce)
                .max_pending_codes_per_account(max_pending_codes)
                .management_rate(Some(management_rate)),
        )
        .layer(FallbackLayer::new(catalog))
        .layer(AdmissionLayers::new(rate_limit, free_quota, credit.clone()))
        .plain(layer_fn(|inner| ChatOnly {
            inner,
            models_list: Arc::clone(&models_list),
        }))
        .plain(tower::retry::RetryLayer::new(config.retry_policy()?))
        .service(bottom)
        .map_err(|missing| ConfigError::new(missing.to_string()))?;
    Ok(Gateway {
        service: BoxCloneService::new(service),
        settlements: credit.pending_settlements(),
        app_ranking,
        alerts,
    })
}

fn boxed_response<B>(response: Response<B>) -> Response<GatewayBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    response.map(|body| body.map_err(Into::into).boxed_unsync())
}

/// Forwards `POST /api/v1/chat/completions` only; every other path is a
/// canonical 404. Upstream failures and credential refusals become
/// complete canonical responses here, below CreditGuard, so they are
/// settled as errors (at no cost).
#[derive(Clone, Debug)]
struct ChatOnly<S> {
    inner: S,
    /// `GET /api/v1/models`, built once.
    models_list: Arc<Value>,
}

impl<S> Service<Request<Full<Bytes>>> for ChatOnly<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<Incoming>, Error = GatewayError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<ResponseBody<Incoming>>;
    type Error = GatewayError;
    type Future = BoxFuture<'static, Result<Self::Response, GatewayError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        if is_models_path(request.method(), request.uri().path()) {
            let principal =
                RequestContext::of(&request).and_then(|context| context.principal.as_ref());
            let list = match principal {
                Some(key) if key.allowed_models.is_some() => {
                    models::callable_by(&self.models_list, key).to_string()
                }
                _ => self.models_list.to_string(),
            };
            let mut response = Response::new(ResponseBody::full(Bytes::from(list)));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            return Box::pin(async move { Ok(response) });
        }
        if !is_chat_completions_path(request.method(), request.uri().path()) {
            let error = GatewayError::new(
                ErrorKind::NotFound,
                format!(
                    "no such endpoint: {} {}; this gateway serves POST /api/v1/chat/completions and the key routes",
                    request.method(),
                    request.uri().path()
                ),
            );
            return Box::pin(async move { Ok(error.to_response()) });
        }
        let request = provider_side(request);
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let outcome = match tower::ServiceExt::ready(&mut inner).await {
                Ok(ready) => ready.call(request).await,
                Err(error) => Err(error),
            };
            Ok(match outcome {
                // An upstream that could not be reached or did not answer
                // becomes a complete error response: CreditGuard charges
                // nothing for it.
                Err(error) => error.to_response(),
                Ok(response) if matches!(response.status().as_u16(), 401..=403) => {
                    // The upstream refused the gateway's own credentials or
                    // account, not the client's: a 502, and its words (which
                    // may name the operator's key) only in the log.
                    let status = response.status().as_u16();
                    tracing::warn!(
                        upstream_status = status,
                        "the upstream refused the gateway's credentials"
                    );
                    GatewayError::new(
                        ErrorKind::Upstream,
                        "the upstream refused this gateway's credentials; the operator must check the upstream key and account",
                    )
                    .with_metadata("upstream_status", status)
                    .to_response()
                }
                Ok(response) => response.map(ResponseBody::inner),
            })
        })
    }
}

/// The request with only the extensions the provider side reads (the
/// retry policy, [`Providers`], [`Upstream`]): the retry keeps a copy of
/// every request it sends, and the layers above have their own.
fn provider_side(request: Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    let (mut parts, body) = request.into_parts();
    let mut kept = http::Extensions::new();
    move_extension::<crate::context::RequestContext>(&mut parts.extensions, &mut kept);
    move_extension::<SkipRetries>(&mut parts.extensions, &mut kept);
    parts.extensions = kept;
    Request::from_parts(parts, body)
}

fn move_extension<T: Clone + Send + Sync + 'static>(
    from: &mut http::Extensions,
    to: &mut http::Extensions,
) {
    if let Some(value) = from.remove::<T>() {
        to.insert(value);
    }
}

/// Exactly `POST /api/v1/chat/completions`, in any case and spelling of
/// the same segments: nothing in front of or between them.
fn is_chat_completions_path(method: &http::Method, path: &str) -> bool {
    method == http::Method::POST
        && crate::body::path_is(path, &["api", "v1", "chat", "completions"])
}

/// `GET /api/v1/models`, spelled the same way.
fn is_models_path(method: &http::Method, path: &str) -> bool {
    method == http::Method::GET && crate::body::path_is(path, &["api", "v1", "models"])
}
