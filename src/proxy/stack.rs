//! The gateway's assembly: every layer of the crate stacked in the
//! documented order over a [`GatewayPlan`], in front of an [`Upstream`].
//!
//! Wiring only: every value was checked, and every secret read, when the
//! plan was made, so building a gateway cannot fail.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use tower::layer::layer_fn;
use tower::util::BoxCloneService;
use tower::util::MapResponseLayer;

use super::access_log::AccessLogLayer;
use super::chat_only::{ChatOnly, WireCheck};
use super::config::GatewayPlan;
use super::fallback::FallbackLayer;
use super::providers::Providers;
use super::upstream::Upstream;
use crate::admission::AdmissionLayers;
use crate::alerts::Alerts;
use crate::api::KeyRoutesLayer;
use crate::auth::{AuthFailures, BearerAuthLayer};
use crate::body::{BodyLimitLayer, DrainUnreadLayer};
use crate::client_addr::ClientAddrLayer;
use crate::clock::{Clock, SystemClock};
use crate::context::CheckedStack;
use crate::credit::{CreditGuardLayer, PendingSettlements};
use crate::error_mapper::ErrorMapperLayer;
use crate::free_quota::FreeModelQuotaLayer;
use crate::in_flight::InFlightLimitLayer;
use crate::keys::{ByokDirectory, ByokProviders, KeyDirectory, SharedStore};
use crate::leaks::LeakAlertsLayer;
use crate::oauth::CodeExchangeLayer;
use crate::rate_limit::GlobalRateLimitLayer;
use crate::response_body::BoxError;
use crate::settings::SettingsPageLayer;
use crate::usage::AppRanking;
use crate::webhook::WebhookSecretLayer;

/// The response body of the whole gateway.
pub type GatewayBody = UnsyncBoxBody<Bytes, BoxError>;

/// The whole gateway as one service.
pub type GatewayService<B> = BoxCloneService<Request<B>, Response<GatewayBody>, Infallible>;

/// The gateway: every layer over `store`, in front of `upstream` (unused
/// when the plan has providers), with the system clock.
pub fn gateway<B>(plan: &GatewayPlan, store: SharedStore, upstream: Upstream) -> GatewayService<B>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    gateway_with_clock(
        plan,
        store,
        upstream,
        Arc::new(SystemClock),
        KeyDirectory::DEFAULT_CACHE_TTL,
    )
}

/// [`gateway`] with a given clock (a manual one in tests) and key cache time.
pub fn gateway_with_clock<B>(
    plan: &GatewayPlan,
    store: SharedStore,
    upstream: Upstream,
    clock: Arc<dyn Clock>,
    key_cache_ttl: Duration,
) -> GatewayService<B>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    build_gateway(plan, store, upstream, clock, key_cache_ttl).service
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

/// [`gateway_with_clock`], with the handles a server stopping it waits for.
pub fn build_gateway<B>(
    plan: &GatewayPlan,
    store: SharedStore,
    upstream: Upstream,
    clock: Arc<dyn Clock>,
    key_cache_ttl: Duration,
) -> Gateway<B>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    let checked = &plan.checked;
    let loaded = &plan.loaded;
    let directory = KeyDirectory::builder(store.clone())
        .clock(clock.clone())
        .cache_ttl(key_cache_ttl)
        .build();
    // One directory for the routes that change BYOK keys and for
    // CreditGuard that reads them: a change is seen at once here.
    let byok = ByokDirectory::builder(store.clone())
        .clock(clock.clone())
        .build();
    let auth_failures = AuthFailures::with_checked_limit(checked.auth_failures, clock.clone());
    let mut webhooks = WebhookSecretLayer::new(store.clone(), loaded.webhook_routes.clone());
    if let Some(limits) = checked.webhook_limits {
        webhooks = webhooks.limits(limits);
    }
    let webhooks = webhooks
        .clock(clock.clone())
        .failure_limit(auth_failures.clone())
        .unauthenticated_limits(checked.unauthenticated);
    let notifier = loaded.leak_notices.notifier(clock.clone());
    let leak_alerts = match &loaded.scanning_keys {
        Some(keys) => LeakAlertsLayer::new(directory.clone(), keys.clone())
            .notifier(notifier.clone())
            .failure_limit(auth_failures.clone())
            .unauthenticated_limits(checked.unauthenticated),
        None => LeakAlertsLayer::off(),
    };
    let body = BodyLimitLayer::new()
        .max_body_bytes(checked.max_body_bytes)
        .read_timeout(checked.body_read_timeout)
        .model_names(checked.model_names.clone());
    // ChatOnly answers every other route 404: those spend no rate.
    let rate_limit =
        GlobalRateLimitLayer::with_checked_rules(store.clone(), checked.rate_rules.clone())
            .clock(clock.clone())
            .served_routes(super::chat_only::serves);
    let free_quota = FreeModelQuotaLayer::new(store.clone())
        .checked_rules(checked.free_quota)
        .clock(clock.clone());
    let bottom = match &loaded.providers {
        Some(providers) => Providers::by_name(providers.clone()),
        None => Providers::single(upstream),
    };
    let models_list = Arc::new(checked.catalog.models_list().clone());
    let served_apis = bottom.clone();
    // The upstream client marks each request as it sends it: one dropped
    // before that costs nothing.
    let app_ranking = AppRanking::new(store.clone()).clock(clock.clone());
    let mut credit = CreditGuardLayer::new(store, checked.prices.clone())
        .clock(clock.clone())
        .upstream_reports_sending(true)
        .models_route("GET /api/v1/models")
        .generations(checked.generations.clone().app_ranking(app_ranking.clone()));
    // A request is BYOK only when the account's key is what gets sent in
    // place of the gateway's credentials: only to providers with `byok`.
    let byok_providers = bottom.byok_providers();
    if byok_providers != ByokProviders::SingleUpstream {
        credit = credit
            .byok_directory(byok.clone())
            .byok_providers(byok_providers.clone());
    }
    if let Some(tokens) = checked.default_max_tokens {
        credit = credit.default_max_tokens(tokens);
    }
    if let Some(ttl) = checked.reservation_ttl {
        credit = credit.reservation_ttl(ttl);
    }
    // Told after each recorded settlement; it only queues.
    let alerts = checked
        .alert_rules
        .clone()
        .zip(loaded.alert_notices.as_ref())
        .map(|(rules, notices)| {
            Alerts::new(rules, directory.clone(), notices.notifier(clock.clone()))
        });
    if let Some(alerts) = alerts.clone() {
        credit = credit.on_settled(move |account, key, limit| alerts.settled(account, key, limit));
    }
    for (name, field) in &checked.completion_bound_fields {
        credit = credit.completion_bound_field(name, *field);
    }
    // A body refused unread is read to its end after the answer (within
    // the body limit and 10 s), so the client can read the answer.
    let drain = DrainUnreadLayer::new(checked.max_body_bytes as u64, Duration::from_secs(10));
    // Checked as it is built: a layer whose reading of the request's
    // context no layer outside it adds refuses the stack here.
    let service = CheckedStack::new()
        .plain(MapResponseLayer::new(boxed_response))
        .plain(drain)
        .plain(AccessLogLayer::new(Arc::clone(&checked.catalog)))
        .plain(ClientAddrLayer::new(checked.trusted_proxies.clone()))
        .plain(SettingsPageLayer::new())
        .plain(leak_alerts)
        // Before BearerAuth: an app exchanging its code has no key yet.
        .plain(
            CodeExchangeLayer::new(directory.clone())
                .failure_limit(auth_failures.clone())
                .unauthenticated_limits(checked.unauthenticated),
        )
        .plain(webhooks)
        .plain(ErrorMapperLayer::new())
        // The key before the body: a request without one is refused
        // before anything is buffered or parsed.
        .layer(
            BearerAuthLayer::new(directory.clone())
                .failure_limit(auth_failures)
                .max_concurrent_lookups(checked.max_concurrent_key_lookups),
        )
        // The gateway's places go to authenticated requests only: a flood
        // of requests without a good key, or of bodies trickled to the
        // routes before it, cannot take them from good keys.
        .plain(InFlightLimitLayer::new(checked.max_in_flight))
        .layer(body)
        .layer(AccessLogLayer::annotate())
        .layer(
            KeyRoutesLayer::new(directory)
                .leak_notifier(notifier)
                .free_quota_rules(checked.free_quota)
                .byok_directory(byok)
                .byok_providers(byok_providers)
                .app_ranking(app_ranking.clone())
                .public_ranking(checked.public_ranking)
                .plain_pkce(checked.plain_pkce)
                .max_pending_codes_per_account(checked.max_pending_codes_per_account)
                .management_rate(Some(checked.management_rate)),
        )
        .layer(FallbackLayer::new(Arc::clone(&checked.catalog)))
        // A call no provider API can take is refused before it counts.
        .plain(layer_fn(|inner| WireCheck::new(inner, served_apis.clone())))
        .layer(AdmissionLayers::new(rate_limit, free_quota, credit.clone()))
        .plain(layer_fn(|inner| {
            ChatOnly::new(inner, Arc::clone(&models_list), served_apis.clone())
        }))
        .plain(tower::retry::RetryLayer::new(
            checked.retry.clone().clock(clock.clone()),
        ))
        .service(bottom)
        // The order above is this function's, the same for every plan: a
        // layer out of place is a bug any test building a gateway finds.
        .unwrap_or_else(|missing| panic!("the gateway's stack is out of order: {missing}"));
    Gateway {
        service: BoxCloneService::new(service),
        settlements: credit.pending_settlements(),
        app_ranking,
        alerts,
    }
}

fn boxed_response<B>(response: Response<B>) -> Response<GatewayBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    response.map(|body| body.map_err(Into::into).boxed_unsync())
}

#[cfg(test)]
mod tests {
    use http_body_util::Full;

    use super::*;
    use crate::proxy::{GatewayConfig, UpstreamConfig};
    use crate::store::MemoryStore;

    #[tokio::test]
    async fn any_plan_builds_a_gateway() {
        // MODELGATE_UNIT_STACK_KEY is set for the tests in .cargo/config.toml.
        for json in [
            "{}",
            r#"{"providers": {"p": {"base_url": "http://127.0.0.1:9/v1",
                                    "api_key": {"env": "MODELGATE_UNIT_STACK_KEY"}, "byok": true,
                                    "completion_bound_field": "max_completion_tokens"}},
                "pricing": {"default": {"prompt_per_million": 1, "completion_per_million": 1}},
                "fallbacks": {"p/a": ["p/b"]},
                "trusted_proxies": ["10.0.0.0/8"], "max_in_flight": 4,
                "body": {"max_body_bytes": 1024, "read_timeout_ms": 500},
                "credit": {"default_max_tokens": 7, "reservation_ttl_seconds": 60},
                "alerts": {"balance_below": [5],
                           "webhook": {"url": "http://127.0.0.1:9/hooks",
                                       "secret": {"env": "MODELGATE_UNIT_STACK_KEY"}}}}"#,
        ] {
            let plan = GatewayPlan::new(&GatewayConfig::from_json(json).unwrap()).unwrap();
            let upstream = Upstream::new(&UpstreamConfig::new("http://127.0.0.1:9/v1")).unwrap();
            let store: SharedStore = Arc::new(MemoryStore::new());
            let built = build_gateway::<Full<Bytes>>(
                &plan,
                store,
                upstream,
                Arc::new(SystemClock),
                Duration::from_secs(1),
            );
            assert_eq!(built.alerts.is_some(), json.contains("alerts"), "{json}");
        }
    }
}
