//! The gateway's assembly: every layer of the crate stacked in the
//! documented order over a [`GatewayConfig`], in front of an [`Upstream`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use tower::layer::layer_fn;
use tower::util::BoxCloneService;
use tower::util::MapResponseLayer;

use super::access_log::AccessLogLayer;
use super::chat_only::ChatOnly;
use super::config::{ConfigError, GatewayConfig};
use super::fallback::FallbackLayer;
use super::models::ModelCatalog;
use super::providers::Providers;
use super::upstream::Upstream;
use crate::admission::AdmissionLayers;
use crate::alerts::Alerts;
use crate::api::KeyRoutesLayer;
use crate::auth::{AuthFailures, BearerAuthLayer};
use crate::body::{BodyLimitLayer, DrainUnreadLayer};
use crate::client_addr::{ClientAddrLayer, TrustedProxies};
use crate::clock::{Clock, SystemClock};
use crate::context::CheckedStack;
use crate::credit::{CreditGuardLayer, PendingSettlements};
use crate::error_mapper::ErrorMapperLayer;
use crate::free_quota::FreeModelQuotaLayer;
use crate::in_flight::InFlightLimitLayer;
use crate::keys::{ByokDirectory, ByokProviders, KeyDirectory, SharedStore};
use crate::leaks::LeakAlertsLayer;
use crate::oauth::CodeExchangeLayer;
use crate::oauth::PlainPkce;
use crate::rate_limit::GlobalRateLimitLayer;
use crate::response_body::BoxError;
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
        .plain(layer_fn(|inner| {
            ChatOnly::new(inner, Arc::clone(&models_list))
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
