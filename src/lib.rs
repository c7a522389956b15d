//! # modelgate
//!
//! Tower layers that give any HTTP service the policy of a model gateway:
//! bearer keys, per-key credit limits (402), account-wide rate limits (429),
//! free-model quotas, body limits, webhook secrets and one JSON error
//! format. State shared between gateway instances lives in a
//! [`store`]: in process ([`store::MemoryStore`]) for one instance, Redis
//! ([`store::RedisStore`]) for many.
//!
//! The layers go in this order, outermost first:
//!
//! ```text
//! ClientAddr -> ErrorMapper -> BearerAuth -> InFlightLimit -> BodyLimit -> KeyRoutes
//!   -> GlobalRateLimit -> FreeModelQuota -> CreditGuard -> upstream
//! ```
//!
//! Built through [`context::CheckedStack`], a stack in which a layer lacks
//! the one it reads from is refused when it is built.
//!
//! ## What the layers ask of the service behind them
//!
//! - **Report usage, or the hold is charged.** CreditGuard charges what the
//!   answer's `usage` says (chat's `prompt_tokens` / `completion_tokens`,
//!   the Messages and Responses APIs' own fields, `usage.cost` when given;
//!   a stream's last chunk). A successful answer without usage is charged
//!   its whole hold (the prompt's bound and the completion bound); an error
//!   status without usage is charged nothing.
//! - **The body arrives edited.** CreditGuard writes the completion bound
//!   (`max_tokens`, or the field [`credit::CreditGuardLayer::completion_bound_field`]
//!   names; `max_output_tokens` on the Responses API) when the client set
//!   none, and lowers it to what the key and the balance pay for; a stream
//!   is sent with `stream_options.include_usage` (the usage chunk is hidden
//!   from a client that did not ask); a Responses call gets `store: false`
//!   and `max_tool_calls` when absent. Every other byte stays as sent and
//!   `Content-Length` says the new length. The [`context::RequestContext`]
//!   holds the request as parsed, with the model id chosen by
//!   [`body::ModelNames`].
//! - **Errors are rewrapped.** [`error_mapper`] renders every failure in
//!   the one format: the service's `Err`s and 5xx answers always, its own
//!   4xx too unless it is built
//!   [`for_own_handler`](error_mapper::ErrorMapperLayer::for_own_handler)
//!   (which also names the service, never an upstream, in messages).
//! - **Money is nano-credits in Rust** ([`store::NANOS_PER_CREDIT`] to a
//!   credit: key limits, top-ups, grants) and credits in JSON (prices per
//!   million tokens, the API's amounts); [`keys::nanos_from_credits`]
//!   converts a decimal exactly.
//! - **Warnings go to [`tracing`].** A store that fails, a settlement
//!   retried, a layer missing from a stack: install a subscriber
//!   (`tracing_subscriber::fmt::init()`) to see them. Counters go through
//!   the `metrics` facade.
//! - **The client's address is [`client_addr::ClientAddr`]** in the
//!   request's extensions, which BearerAuth's limit on failed
//!   authentications counts by; a hyper server inserts it, an axum one
//!   gets it from `ConnectInfo` with
//!   [`client_addr::ClientAddrLayer::peer_from`]. Without it failures are
//!   not counted per address.
//!
//! The key is checked before the body is read, so a request without one
//! costs no buffering and no parse, and holds no place in flight. The last three are best stacked by
//! [`admission::AdmissionLayers`], so that they decide together.
//!
//! Each reads what the layers before it put into the request's
//! [`context::RequestContext`] and answers its own rejections with the one canonical error body
//! ([`error::GatewayError`]). Available so far:
//!
//! - [`client_addr`]: the client's address, from the connection or, behind
//!   trusted proxies, from `X-Forwarded-For`.
//! - [`in_flight`]: `InFlightLimit`, a bound on requests in flight; past
//!   it, 503 at once instead of a queue. `UnauthenticatedLimits`: the own
//!   bounds of the routes that read a body before authentication.
//! - [`settings`]: `SettingsPage`, the key settings page at `/settings`.
//! - [`error_mapper`]: every failure leaves in the canonical body.
//! - [`body`]: the body buffered once, size and time bounded; chat requests
//!   parsed into a [`body::ChatRequest`]; a body refused unread drained
//!   after the answer ([`body::DrainUnreadLayer`]).
//! - [`auth`]: `BearerAuth`, the strict `Authorization` parser, the
//!   `mg-v1-` key format and its hash; the caller's [`auth::Principal`];
//!   the per-address limit on failed authentications
//!   ([`auth::AuthFailures`]).
//! - [`keys`]: key and account records, their directory, and the
//!   accounts' own provider keys (BYOK).
//! - [`api`]: the JSON API as one route table (`KeyRoutes`): the key
//!   management API and the key, credits, balance and usage queries.
//! - [`leaks`]: `LeakAlerts`, which takes GitHub's secret-scanning alerts
//!   (`POST /api/v1/leaks`): the signature checked with GitHub's published
//!   keys, every live key among the tokens revoked at once on every
//!   instance, its owner told, the labels answered.
//! - [`oauth`]: OAuth keys for apps (PKCE, as OpenRouter clients expect):
//!   a person approves an app on the consent page at `/auth`, and the app
//!   exchanges its code for a key of their account (`CodeExchange`).
//! - [`rate_limit`]: `GlobalRateLimit`, account-wide and per-model rate
//!   rules that hold across instances.
//! - [`free_quota`]: `FreeModelQuota`, the per-minute and per-day quota of
//!   `:free` models.
//! - [`credit`]: `CreditGuard`, key credit limits, the account balance and
//!   the usage ledger, with the streamed usage scanner.
//! - [`proxy`]: the upstream client, the retry policy and the whole gateway
//!   stack from one JSON config (served by `examples/proxy.rs`).
//! - [`webhook`]: `WebhookSecret` and the managed-flow webhook routes:
//!   route configuration, secrets resolved at start-up, the 13 flow actions
//!   and flows kept in the store. It sits outside the chat path (before
//!   `ErrorMapper` in the proxy): its routes carry their own secret, limits
//!   and answer format.
//! - [`admission`]: [`admission::AdmissionLayers`], GlobalRateLimit,
//!   FreeModelQuota and CreditGuard deciding each request in one atomic
//!   store step (a request any of them refuses counts in none).
//! - [`settings`]: `SettingsPage`, the key settings page at `/settings`,
//!   where a person manages keys in a browser with a management key.
//! - [`notify`]: e-mail and signed-webhook notices about leaked keys,
//!   retried in the background.
//! - [`context`]: the [`context::RequestContext`], what the layers learn
//!   about a request (the caller, the parsed request, its bytes), in one
//!   value a service behind them reads too.
//! - [`store`], [`clock`], [`error`]: the shared state, time and errors the
//!   layers stand on.
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use modelgate::body::BodyLimitLayer;
//! use modelgate::context::RequestContext;
//! use modelgate::error_mapper::ErrorMapperLayer;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Stands in for the upstream; it sees the parsed request and the same bytes.
//! let upstream = service_fn(|request: Request<Full<Bytes>>| async move {
//!     let chat = RequestContext::of(&request).and_then(|context| context.chat.clone());
//!     let reply = format!("{} messages for {}", chat.as_ref().map_or(0, |c| c.messages.len()), chat.map(|c| c.model.clone()).unwrap_or_default());
//!     Ok::<_, std::io::Error>(Response::new(Full::new(Bytes::from(reply))))
//! });
//! let gateway = ServiceBuilder::new()
//!     .layer(ErrorMapperLayer::new())
//!     .layer(BodyLimitLayer::new())
//!     .service(upstream);
//!
//! let bad = Request::post("/api/v1/chat/completions")
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from_static(br#"{"model": "openai/gpt-4o", "messages": []}"#)))
//!     .unwrap();
//! let response = gateway.oneshot(bad).await.unwrap();
//! assert_eq!(response.status(), 400);
//! assert_eq!(response.headers()["content-type"], "application/json");
//! # }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admission;
#[cfg(feature = "notify")]
#[cfg_attr(docsrs, doc(cfg(feature = "notify")))]
pub mod alerts;
mod answer;
pub mod api;
pub mod auth;
pub mod body;
pub mod client_addr;
pub mod clock;
pub mod context;
pub mod credit;
mod edit;
/// The stream parse of chunks, for the fuzz targets only (`cargo fuzz`
/// sets `--cfg fuzzing`).
#[cfg(fuzzing)]
#[doc(hidden)]
pub use edit::json_fuzzing as edit_fuzzing;
pub mod error;
pub mod error_mapper;
pub mod free_quota;
mod header_number;
pub mod in_flight;
mod json_input;
pub mod keys;
#[cfg(feature = "leaks")]
#[cfg_attr(docsrs, doc(cfg(feature = "leaks")))]
pub mod leaks;
mod limiter;
mod model_id;
#[cfg(feature = "notify")]
#[cfg_attr(docsrs, doc(cfg(feature = "notify")))]
pub mod notify;
#[cfg(feature = "oauth")]
#[cfg_attr(docsrs, doc(cfg(feature = "oauth")))]
pub mod oauth;
#[cfg(feature = "proxy")]
#[cfg_attr(docsrs, doc(cfg(feature = "proxy")))]
pub mod proxy;
mod random;
pub mod rate_limit;
pub mod response_body;
mod routing;
#[cfg(any(feature = "flows", feature = "notify", feature = "proxy"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "flows", feature = "notify"))))]
pub mod secrets;
#[cfg(feature = "settings")]
#[cfg_attr(docsrs, doc(cfg(feature = "settings")))]
pub mod settings;
pub mod store;
pub mod telemetry;
pub mod usage;
#[cfg(feature = "flows")]
#[cfg_attr(docsrs, doc(cfg(feature = "flows")))]
pub mod webhook;

// The README's Rust code, compiled by `cargo test --doc` so it cannot
// drift from the API.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
