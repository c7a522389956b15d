//! [`FreeModelQuota`]: the quota of free model variants (ids ending in
//! `:free`), from seed 000: at most 20 requests in any rolling minute, and
//! per UTC day 50 requests, or 1000 once the account has bought at least
//! 10 credits in all. The numbers are [`FreeQuotaRules`], all configurable.
//!
//! The quota belongs to the account: all its keys and all free models
//! share both counters, checked and counted in one atomic store step (a
//! refused request counts in neither). The day resets at UTC midnight. A
//! refusal is 429 with `limit_source` `free_per_minute` or `free_per_day`;
//! its message says which limit was hit, when it resets and, on the
//! 50-a-day tier, that buying 10 credits raises it to 1000; its
//! `Retry-After` reaches the reset, so clients do not retry in vain.
//! Admitted free requests carry a [`FreeQuotaSnapshot`] in their
//! extensions and `X-RateLimit-*` headers on their response.
//!
//! When the store fails the layer admits unchecked (logged and counted)
//! unless set to fail closed.
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use modelgate::auth::BearerAuthLayer;
//! use modelgate::body::BodyLimitLayer;
//! use modelgate::free_quota::{FreeModelQuotaLayer, FreeQuotaRules};
//! use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
//! use modelgate::store::MemoryStore;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let directory = KeyDirectory::new(store.clone());
//! let (key, _) = directory.create_key(NewKey::named("app")).await.unwrap();
//! let rules = FreeQuotaRules { requests_per_minute: 1, ..FreeQuotaRules::default() };
//! let gateway = ServiceBuilder::new()
//!     .layer(BearerAuthLayer::new(directory))
//!     .layer(BodyLimitLayer::new())
//!     .layer(FreeModelQuotaLayer::new(store).rules(rules).unwrap())
//!     .service(service_fn(|_: Request<Full<Bytes>>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
//!     }));
//! let chat = |model: &str| {
//!     let body = format!(r#"{{"model": "{model}", "messages": [{{"role": "user", "content": "Hi"}}]}}"#);
//!     let request = Request::post("/api/v1/chat/completions")
//!         .header("authorization", format!("Bearer {}", key.expose()))
//!         .header("content-type", "application/json")
//!         .body(Full::new(Bytes::from(body)))
//!         .unwrap();
//!     gateway.clone().oneshot(request)
//! };
//! assert_eq!(chat("meta-llama/llama-3-8b:free").await.unwrap().status(), 200);
//! let refused = chat("google/gemma-2-9b:free").await.unwrap();
//! assert_eq!(refused.status(), 429);
//! let body = refused.into_body().collect().await.unwrap().to_bytes();
//! assert!(String::from_utf8_lossy(&body).contains("free_per_minute"));
//! // Paid models are not this layer's business.
//! assert_eq!(chat("openai/gpt-4o").await.unwrap().status(), 200);
//! # }
//! ```

mod layer;
mod rules;
mod service;

/// [`FreeModelQuota`]'s response future: the quota check, then the inner
/// service.
pub use crate::limiter::AdmissionFuture as ResponseFuture;
pub use layer::FreeModelQuotaLayer;
pub use rules::{FreeQuotaRules, QuotaRulesError};
pub use service::{FreeModelQuota, FreeQuotaSnapshot};
