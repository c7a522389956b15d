//! [`GlobalRateLimit`]: request rates per account, across every key and
//! every gateway instance that shares the store.
//!
//! Seed 000: "rate limits are global to the account; creating more
//! accounts or keys does not raise the quota", and "different models have
//! different limits". So every counter is scoped to the account of the
//! [`Principal`](crate::auth::Principal), and the [`RateLimitRules`] hold
//!
//! - one account-wide [`RateRule`] (GCRA rate + burst, or a rolling
//!   window), counted for every request that reaches the layer;
//! - [`ModelRule`]s for chat requests, matching an exact model (all its
//!   variants), one variant, or a provider prefix (`openai/`); every rule
//!   that matches applies;
//! - per-account overrides of either.
//!
//! A key may add its own: a [`KeyRateLimit`](crate::keys::KeyRateLimit)
//! (its `rate_limit`, at most `requests` in any `window_seconds`, counted
//! for that key alone) and a model list (`allowed_models`): a model it
//! does not cover is refused 403 `model_not_allowed` before anything is
//! counted.
//!
//! All of a request's checks are one atomic store step: a refused request
//! counts nowhere. Refusals are 429 with `Retry-After` (whole seconds,
//! rounded up, at least 1), `X-RateLimit-Limit`, `X-RateLimit-Remaining`,
//! `X-RateLimit-Reset` (seconds until the limit is whole again) and
//! `metadata.limit_source` (`account_rate`, `model_rate` or `key`). When the store
//! fails the layer admits unchecked (logged and counted) unless set to fail
//! closed. A counter the store reported full is remembered until the wait
//! it reported ends, so requests that would be refused anyway cost no round
//! trip; it never admits anything.
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use modelgate::auth::BearerAuthLayer;
//! use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
//! use modelgate::rate_limit::{GlobalRateLimitLayer, RateLimitRules};
//! use modelgate::store::MemoryStore;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let directory = KeyDirectory::new(store.clone());
//! let (first, _) = directory.create_key(NewKey::named("one")).await.unwrap();
//! let (second, _) = directory.create_key(NewKey::named("two")).await.unwrap();
//! let rules = RateLimitRules::from_json(
//!     r#"{"account": {"rolling": {"requests": 2, "window_seconds": 60}}}"#,
//! ).unwrap();
//! let gateway = ServiceBuilder::new()
//!     .layer(BearerAuthLayer::new(directory))
//!     .layer(GlobalRateLimitLayer::new(store, rules).unwrap())
//!     .service(service_fn(|_: Request<Full<Bytes>>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
//!     }));
//! let call = |key: &str| {
//!     let request = Request::get("/api/v1/models")
//!         .header("authorization", format!("Bearer {key}"))
//!         .body(Full::new(Bytes::new()))
//!         .unwrap();
//!     gateway.clone().oneshot(request)
//! };
//! assert_eq!(call(first.expose()).await.unwrap().status(), 200);
//! assert_eq!(call(second.expose()).await.unwrap().status(), 200);
//! // Both keys belong to one account, which has had its two requests.
//! let refused = call(first.expose()).await.unwrap();
//! assert_eq!(refused.status(), 429);
//! assert_eq!(refused.headers()["x-ratelimit-remaining"], "0");
//! assert!(refused.headers().contains_key("retry-after"));
//! # }
//! ```

mod layer;
mod rules;
mod service;

pub use crate::limiter::headers::{X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
/// [`GlobalRateLimit`]'s response future: the counter check, then the
/// inner service.
pub use crate::limiter::AdmissionFuture as ResponseFuture;
pub use layer::GlobalRateLimitLayer;
pub use rules::{AccountRules, ModelRule, RateLimitRules, RateRule, RulesError};
pub use service::GlobalRateLimit;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::context::RequestContext;
    use crate::keys::SharedStore;
    use crate::store::MemoryStore;
    use bytes::Bytes;
    use chrono::{DateTime, TimeZone, Utc};
    use http::{Request, Response};
    use http_body_util::Full;
    use proptest::prelude::*;
    use std::sync::Arc;
    use std::time::Duration;
    use tower::{service_fn, ServiceBuilder, ServiceExt};

    fn chat(model: &str) -> Request<Full<Bytes>> {
        let body =
            format!(r#"{{"model": "{model}", "messages": [{{"role": "user", "content": "x"}}]}}"#);
        let mut request = Request::post("/api/v1/chat/completions")
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap();
        request
            .extensions_mut()
            .insert(RequestContext::chat_for_tests("acct", body.as_bytes()));
        request
    }

    fn within(
        admitted: &[(DateTime<Utc>, bool)],
        now: DateTime<Utc>,
        seconds: i64,
        only_a: bool,
    ) -> usize {
        admitted
            .iter()
            .filter(|(at, is_a)| {
                *at > now - chrono::Duration::seconds(seconds) && (*is_a || !only_a)
            })
            .count()
    }

    #[tokio::test]
    async fn a_stack_without_the_layers_before_it_is_a_500_naming_them() {
        let store: SharedStore = Arc::new(MemoryStore::new());
        let rate = GlobalRateLimitLayer::new(store.clone(), RateLimitRules::default()).unwrap();
        let free = crate::free_quota::FreeModelQuotaLayer::new(store);
        let upstream = service_fn(|_: Request<Full<Bytes>>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
        });
        let without = |remove_principal: bool| {
            let mut request = chat("a/b:free");
            let context = RequestContext::of_mut(&mut request);
            if remove_principal {
                context.principal = None;
            } else {
                context.chat = None;
            }
            request
        };
        let cases = [
            (
                ServiceBuilder::new()
                    .layer(rate.clone())
                    .service(upstream)
                    .boxed_clone(),
                without(true),
                "GlobalRateLimit needs BearerAuth",
            ),
            (
                ServiceBuilder::new()
                    .layer(rate)
                    .service(upstream)
                    .boxed_clone(),
                without(false),
                "GlobalRateLimit needs BodyLimit",
            ),
            (
                ServiceBuilder::new()
                    .layer(free.clone())
                    .service(upstream)
                    .boxed_clone(),
                without(false),
                "FreeModelQuota needs BodyLimit",
            ),
            (
                ServiceBuilder::new()
                    .layer(free)
                    .service(upstream)
                    .boxed_clone(),
                without(true),
                "FreeModelQuota needs BearerAuth",
            ),
        ];
        for (service, request, words) in cases {
            let response = service.oneshot(request).await.unwrap();
            assert_eq!(response.status(), 500, "{words}");
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .unwrap()
                .to_bytes();
            assert!(String::from_utf8_lossy(&body).contains(words), "{words}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The account rule and the model rule hold exactly, and a request
        /// one of them refuses counts in neither.
        #[test]
        fn admits_exactly_what_every_rule_allows(
            calls in proptest::collection::vec((0u64..4_000, any::<bool>()), 1..80),
            remember in any::<bool>(),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let clock = ManualClock::new(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap());
            let store: SharedStore = Arc::new(MemoryStore::new());
            let rules = RateLimitRules::from_json(
                r#"{"account": {"rolling": {"requests": 5, "window_seconds": 10}},
                    "models": [{"match": "a/", "limit": {"rolling": {"requests": 3, "window_seconds": 5}}}]}"#,
            ).unwrap();
            let service = ServiceBuilder::new()
                .layer(
                    GlobalRateLimitLayer::new(store, rules)
                        .unwrap()
                        .clock(Arc::new(clock.clone()))
                        .remember_full_counters(remember),
                )
                .service(service_fn(|_: Request<Full<Bytes>>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
                }));
            let mut admitted = Vec::new();
            for (gap_ms, is_a) in calls {
                clock.advance(Duration::from_millis(gap_ms));
                let now = clock.now();
                let expected = within(&admitted, now, 10, false) < 5
                    && (!is_a || within(&admitted, now, 5, true) < 3);
                let model = if is_a { "a/x" } else { "b/y" };
                let response = runtime.block_on(service.clone().oneshot(chat(model))).unwrap();
                prop_assert_eq!(response.status() == 200, expected, "{} at {}", model, now);
                if response.status() == 200 {
                    admitted.push((now, is_a));
                } else {
                    prop_assert_eq!(response.status(), 429);
                    prop_assert!(response.headers().contains_key("retry-after"));
                }
            }
        }
    }
}
