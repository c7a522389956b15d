//! [`CreditGuard`]: credit limits per key, the account balance, and the
//! usage ledger, from seed 000 and seed 002's 402.
//!
//! Before a chat request goes upstream, one atomic store step admits it or
//! answers 402, and admitted, holds what it can cost:
//!
//! - `limit_source: key_limit` when the key's usage in its reset period
//!   (UTC day, week from Monday, month, or all time), plus its BYOK usage
//!   when `include_byok_in_limit`, plus what its requests in flight hold,
//!   leaves too little for this request (a free request: when usage has
//!   reached the limit); the message gives the limit, when it resets, and
//!   how many completion tokens what is left pays for;
//! - `limit_source: credits` when the account balance is negative, for
//!   `:free` models too; and for a paid model, when the balance less what
//!   the account's requests in flight hold (on every key) does not cover
//!   this one: an account that bought nothing uses free models only.
//!
//! The hold is the prompt ([`estimate_prompt_tokens`]: one token per byte
//! of text, whatever the tokenizer, and for an image, a file or audio the
//! model's bound in its pricing, [`PromptBounds`]) and the completion
//! bound, at the model's [`Pricing`].
//! The bound is the client's `max_tokens` or `max_completion_tokens` (the
//! larger when both are sent), always sent in the one field the provider
//! reads ([`CreditGuardLayer::completion_bound_field`]; the other is
//! removed), so that a provider never ignores it; a client that sets none
//! gets one written ([`CreditGuardLayer::default_max_tokens`]), or, when the key's
//! limit or the balance cannot pay for that, as many tokens as they pay
//! for: such a client is served until it cannot afford its prompt and one
//! token. So the upstream never receives an unbounded request, and admitted
//! requests take the balance below zero or a key past its limit only when
//! the upstream ignores the bound (or counts an image, a file or the
//! context past the bounds its pricing states). A
//! stream whose client did not ask for usage is sent with
//! `stream_options.include_usage`, and the usage chunk that brings is kept
//! from the client, who gets the bytes it would have got.
//!
//! The response passes through unbuffered while its `usage` is read (from
//! the JSON body, or the SSE chunk before `data: [DONE]`; each event is
//! parsed once, by the one reader that also hides the usage the gateway
//! asked for and names the model the layer above asks it to). When the response ends, the real
//! cost is recorded and the hold released in one step: `usage.cost` when
//! the upstream states it, else the tokens priced; `:free` variants cost 0,
//! whatever the upstream says. A cost above the bound (an upstream that
//! ignored it) is charged in full and counted in
//! `modelgate_cost_over_hold_nanocredits_total`. A request that ends
//! without usage is charged what its bound allows (tokens may have been
//! spent), except after an error status, which is charged nothing. An
//! error the service below answered before the upstream did (a timeout, a
//! connection that failed once the request was sent) is charged on the
//! [`LateAnswer`] it leaves on the request's [`SentUpstream`]: the answer
//! still read in the background, its usage (`cost_basis` `late_answer`),
//! else the hold (`unanswered`). A
//! client that goes away, a body that breaks and an inner error are
//! settled too, in the background when no one waits; settlement is
//! idempotent per request, so retrying it never charges twice; a hold that
//! is never settled (an instance that died) expires.
//!
//! Stacked with [`GlobalRateLimit`](crate::rate_limit::GlobalRateLimit) and
//! [`FreeModelQuota`](crate::free_quota::FreeModelQuota) by
//! [`AdmissionLayers`](crate::admission::AdmissionLayers), their checks are
//! decided in the same store step: a request any of them refuses counts in
//! none.
//!
//! On a store a round trip away (Redis), settlements are grouped per
//! account so that a request costs about one ledger call, not two: a
//! settlement finding another of its account on its way to the store
//! waits, and one finding none waits about a millisecond for a carrier; an
//! admission about to be sent carries every settlement waiting for its
//! account (settled first, then decided, in one script); those still
//! waiting when the ones on their way are recorded, or when the
//! millisecond is up, go together. So a client sending one request after
//! another, as a busy account, costs one call per request, and a
//! settlement waits at most about a millisecond and one round trip more.
//! The end of a response does not wait for its
//! settlement (the hold keeps every limit exact until it lands); a
//! gateway that stops waits for them all ([`CreditGuardLayer::flush`]).
//!
//! A request for which the account has set its own key for the model's
//! provider through the management API ([`CreditGuardLayer::byok_directory`],
//! one cached lookup per request) is BYOK usage: kept in its own totals and
//! not taken from the balance; whether it counts against (and is held
//! against) the key limit follows `include_byok_in_limit`. The key goes
//! into the request's [`RequestContext`](crate::context::RequestContext) as
//! its [`ByokCredential`](crate::keys::ByokCredential) (`credential`),
//! for the upstream client to send instead of the gateway's own key. Only
//! the providers [`CreditGuardLayer::byok_providers`] names are looked up.
//!
//! Each admitted request is a call to a model: a `chat` span (target
//! [`GEN_AI_SPAN_TARGET`]) in OpenTelemetry's GenAI semantic conventions
//! lasts from its admission to its settlement, named `chat <model>`, of
//! client kind, with `gen_ai.provider.name`, `gen_ai.request.model`,
//! `gen_ai.response.model`, `gen_ai.request.max_tokens` and the charged
//! `gen_ai.usage.input_tokens` / `gen_ai.usage.output_tokens`.
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use modelgate::auth::BearerAuthLayer;
//! use modelgate::body::BodyLimitLayer;
//! use modelgate::clock::{Clock, SystemClock};
//! use modelgate::credit::{CreditGuardLayer, PriceTable};
//! use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
//! use modelgate::store::{LedgerStore, MemoryStore, NANOS_PER_CREDIT};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! store.top_up("default", 100 * NANOS_PER_CREDIT).await.unwrap();
//! let directory = KeyDirectory::new(store.clone());
//! let new = NewKey { limit_nanos: Some(NANOS_PER_CREDIT), ..NewKey::named("capped") };
//! let (key, record) = directory.create_key(new).await.unwrap();
//! let prices = PriceTable::from_json(
//!     r#"{"models": {"openai/gpt-4o": {"prompt_per_million": 0, "completion_per_million": 1000}}}"#,
//! ).unwrap();
//! let credit = CreditGuardLayer::new(store.clone(), Arc::new(prices));
//! let upstream = service_fn(|_: Request<Full<Bytes>>| async {
//!     let body = r#"{"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 600}}"#;
//!     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(body))))
//! });
//! let gateway = ServiceBuilder::new()
//!     .layer(BearerAuthLayer::new(directory))
//!     .layer(BodyLimitLayer::new())
//!     .layer(credit.clone())
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
//! first.into_body().collect().await.unwrap(); // the end of the body settles the cost…
//! credit.flush(std::time::Duration::from_secs(5)).await; // …which lands just after
//! let usage = store.key_usage("default", &record.hash.to_hex(), SystemClock.now()).await.unwrap();
//! assert_eq!(usage.total_nanos, 600_000_000); // 600 tokens at 1000 credits per million
//! // 0.6 credits used, and the next request may cost 0.8 more: past the
//! // 1-credit limit, so it is refused before it goes upstream.
//! assert_eq!(gateway.oneshot(chat()).await.unwrap().status(), 402);
//! # }
//! ```

mod body;
mod bound;
mod future;
mod group_commit;
mod hidden_usage;
mod late;
mod layer;
mod messages_usage;
mod meter;
mod pending;
mod pricing;
mod renewal;
mod responses_usage;
mod service;
mod stream;
mod usage;

#[cfg(all(test, feature = "proxy"))]
pub(crate) use stream::{StreamEdits, StreamReader};

pub use crate::context::{LateAnswer, LateBody, SentUpstream, UpstreamAttempt};
pub use body::MeteredBody;
pub use bound::{BodyEdits, BoundField, edit_request_body};
pub use future::ResponseFuture;
pub use hidden_usage::HiddenUsage;
pub use layer::CreditGuardLayer;
pub use messages_usage::MessagesUsage;
pub use pending::{PendingSettlements, Unrecorded};
pub use pricing::{
    MAX_BOUND_TOKENS, MAX_CREDITS_PER_MILLION_TOKENS, MAX_PRICE_OVERRIDES, PriceOverride,
    PriceTable, Pricing, PricingError, PromptBounds, TokenPrice, TokenRates,
};
pub use responses_usage::ResponsesUsage;
pub use service::{
    CreditGuard, GEN_AI_SPAN_TARGET, MESSAGE_OVERHEAD_TOKENS, estimate_max_cost_nanos,
    estimate_prompt_tokens,
};
pub use usage::{BodyKind, Usage, UsageScanner};
