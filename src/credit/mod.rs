//! [`CreditGuard`]: credit limits per key, the account balance, and the
//! usage ledger, from seed 000 and seed 002's 402.
//!
//! Before a chat request goes upstream, one atomic store step admits it or
//! answers 402:
//!
//! - `limit_source: key_limit` when the key's usage in its reset period
//!   (UTC day, week from Monday, month, or all time), plus its BYOK usage
//!   when `include_byok_in_limit`, plus the credits held by its requests in
//!   flight, plus this request's estimate, would pass its limit (a free
//!   request: when usage has reached it); the message gives the limit and
//!   when it resets. So a key overspends by at most how far real costs
//!   exceed their estimates;
//! - `limit_source: credits` when the account balance is negative, for
//!   `:free` models too.
//!
//! Otherwise it holds the request's estimated maximum cost
//! ([`estimate_max_cost_nanos`]: the prompt's size, `max_tokens` or a
//! default, the model's [`Pricing`]). The response passes through
//! untouched, byte for byte and unbuffered, while a [`UsageScanner`] reads
//! the upstream's `usage` (from the JSON body, or the SSE chunk before
//! `data: [DONE]`). When the response ends, the real cost is recorded and
//! the hold released in one step: `usage.cost` when the upstream states it,
//! else the tokens priced; `:free` variants cost 0, whatever the upstream
//! says. A request that ends without usage is charged its estimate (tokens
//! may have been spent), except after an error status, which is charged
//! nothing. A client that goes away, a body that breaks and an inner error
//! are settled too, in the background when no one waits; settlement is
//! idempotent per request, so retrying it never charges twice; a hold that
//! is never settled (an instance that died) expires. The body is read as
//! its `Content-Type` says (SSE or JSON), whatever the request asked.
//!
//! On a store a round trip away (Redis), settlements are grouped per
//! account so that under load a request costs about one ledger call, not
//! two: a settlement finding another of its account on its way to the
//! store waits; a reservation about to be sent carries every settlement
//! waiting for its account (settled first, then decided, in one script);
//! those still waiting when the ones on their way are recorded go
//! together. A settlement thus waits at most one round trip more, and none
//! when it is alone; the end of a response still waits until its cost is
//! recorded.
//!
//! Requests whose model's provider is in the account's BYOK list
//! ([`CreditGuardLayer::byok_providers`]), or for which the account has set
//! its own key through the management API
//! ([`CreditGuardLayer::byok_directory`], one cached lookup per request),
//! are BYOK usage: kept in their own totals and not taken from the
//! balance; whether they count against (and are held against) the key
//! limit follows `include_byok_in_limit`. A key the account set goes into
//! the request's extensions as a [`ByokCredential`](crate::keys::ByokCredential),
//! for the upstream client to send instead of the gateway's own key.
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use modelgate::auth::BearerAuthLayer;
//! use modelgate::body::BodyLimitLayer;
//! use modelgate::credit::{CreditGuardLayer, PriceTable};
//! use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
//! use modelgate::store::{LedgerStore, MemoryStore, NANOS_PER_CREDIT};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let directory = KeyDirectory::new(store.clone());
//! let new = NewKey { limit_nanos: Some(NANOS_PER_CREDIT), ..NewKey::named("capped") };
//! let (key, record) = directory.create_key(new).await.unwrap();
//! let prices = PriceTable::from_json(
//!     r#"{"models": {"openai/gpt-4o": {"prompt_per_million": 0, "completion_per_million": 1000}}}"#,
//! ).unwrap();
//! let upstream = service_fn(|_: Request<Full<Bytes>>| async {
//!     let body = r#"{"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 600}}"#;
//!     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(body))))
//! });
//! let gateway = ServiceBuilder::new()
//!     .layer(BodyLimitLayer::new())
//!     .layer(BearerAuthLayer::new(directory))
//!     .layer(CreditGuardLayer::new(store.clone(), Arc::new(prices)))
//!     .service(upstream);
//! let chat = || {
//!     let body = r#"{"model": "openai/gpt-4o", "max_tokens": 800, "messages": [{"role": "user", "content": "Hi"}]}"#;
//!     Request::post("/api/v1/chat/completions")
//!         .header("authorization", format!("Bearer {}", key.expose()))
//!         .header("content-type", "application/json")
//!         .body(Full::new(Bytes::from(body)))
//!         .unwrap()
//! };
//! let first = gateway.clone().oneshot(chat()).await.unwrap();
//! assert_eq!(first.status(), 200);
//! first.into_body().collect().await.unwrap(); // the end of the body settles the cost
//! let usage = store.key_usage("default", &record.hash, chrono::Utc::now()).await.unwrap();
//! assert_eq!(usage.total_nanos, 600_000_000); // 600 tokens at 1000 credits per million
//! gateway.clone().oneshot(chat()).await.unwrap().into_body().collect().await.unwrap();
//! // 1.2 credits used of a 1-credit limit: the next request is refused.
//! assert_eq!(gateway.oneshot(chat()).await.unwrap().status(), 402);
//! # }
//! ```

mod body;
mod bound;
mod future;
mod group_commit;
mod hidden_usage;
mod layer;
mod meter;
mod pricing;
mod service;
mod usage;

pub use body::MeteredBody;
pub use bound::{edit_request_body, BodyEdits, BoundField};
pub use future::ResponseFuture;
pub use hidden_usage::HiddenUsage;
pub use layer::CreditGuardLayer;
pub use pricing::{PriceTable, Pricing, PricingError, TokenPrice, MAX_CREDITS_PER_MILLION_TOKENS};
pub use service::{estimate_max_cost_nanos, CreditGuard};
pub use usage::{BodyKind, Usage, UsageScanner};
