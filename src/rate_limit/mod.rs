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
//! counts nowhere. Admitted responses carry `X-RateLimit-Limit` (the most
//! admitted at once: a GCRA rule's burst, a window's requests),
//! `X-RateLimit-Remaining`, `X-RateLimit-Reset` (seconds until the limit
//! is whole again) and `X-RateLimit-Policy` (the rule itself:
//! `600;w=60;burst=60`, `10;w=60`) of the tightest rule. Refusals are 429
//! with `Retry-After` (whole seconds, rounded up, at least 1), the same
//! four, their `X-RateLimit-Reset` equal to `Retry-After` (when a request
//! fits again), and `metadata.limit_source` (`account_rate`, `model_rate`
//! or `key`). With [`GlobalRateLimitLayer::served_routes`], a request the
//! service below does not serve (a 404) counts nowhere. When the store
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

/// [`GlobalRateLimit`]'s response future: the counter check, then the
/// inner service.
pub use crate::limiter::AdmissionFuture as ResponseFuture;
pub use crate::limiter::headers::{
    X_RATELIMIT_LIMIT, X_RATELIMIT_POLICY, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
pub use layer::{GlobalRateLimitLayer, ServedRoutes, model_calls};
pub use rules::{AccountRules, ModelRule, RateLimitRules, RateRule, RulesError};
pub use service::GlobalRateLimit;
