//! Webhook routes for managed flows (seed 001): the `WebhookSecret` layer,
//! the route configuration and its secrets, the 13 flow actions and the
//! flows they keep in the store.
//!
//! [`WebhooksConfig::from_plugin_entry`] reads `plugins.entries.webhooks`
//! strictly, naming the route and field of every error; two routes on one
//! path are refused. Each route's secret is inline text or a
//! [`SecretRef`](crate::secrets::SecretRef) `{source, provider, id}` that
//! [`resolve_routes`] reads at start-up from the named provider of
//! [`SecretProviders`](crate::secrets::SecretProviders) (the
//! `secrets.providers` section): the environment (the built-in `default`,
//! or an allowlist), a file (a JSON pointer into it, or all of it) or a
//! command (absolute path, no shell, bounded time and output). A route
//! whose secret cannot be read, its provider not configured included, is
//! skipped with a warning and its path is not served. A
//! [`Secret`](crate::secrets::Secret) compares in constant time and never
//! prints.
//!
//! [`WebhookSecretLayer`] answers each served route's exact path. Before
//! the action it checks, in order: `POST` (405), the secret from
//! `Authorization: Bearer` or `x-gateway-webhook-secret` (401; 429
//! `auth_failures` once the client's address is past the failure limit of
//! [`WebhookSecretLayer::failure_limit`]), the
//! client's fixed rate window (429 `rate_limited`), `Content-Type:
//! application/json` (415), the client's requests in flight (429
//! `too_many_in_flight`), the body's size (413) and time to arrive (408),
//! and the payload (400 `invalid_request`, naming the field). The secret
//! is checked first so that a caller without it costs no store round trip
//! and spends neither the client's window nor its in-flight slots. The
//! window and the in-flight count live in the store, so on Redis they hold
//! across instances. All numbers are in [`WebhookLimits`].
//!
//! Answers are `{"ok": true, "routeId", "result"}` or `{"ok": false,
//! "routeId", "code", "error", "result"}`. A route sees only the flows of
//! its `sessionKey`, changes only those of its `controllerId`, and never
//! shows owner or session metadata. Mutations take `expectedRevision`; a
//! stale one is 409 `revision_conflict` with the current flow.
//!
//! Flows do not stay forever. An ended flow (succeeded, failed, cancelled,
//! lost) is removed [`ended_flow_retention`](WebhookLimits::ended_flow_retention)
//! (7 days) after it ended, and a flow that has not ended
//! [`idle_flow_retention`](WebhookLimits::idle_flow_retention) (30 days)
//! after its last change, each write starting that time again; removed,
//! it is not found, not listed and not counted. A session holds at most
//! [`max_flows_per_session`](WebhookLimits::max_flows_per_session) (1000)
//! flows, ended ones within their retention included: one more
//! `create_flow` is 409 `too_many_flows`, naming the cap and the
//! retentions. The store decides the cap in the create's own atomic write,
//! so it holds under concurrent creates and, on Redis, across instances.
//!
//! ```
//! use std::sync::Arc;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use bytes::Bytes;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use modelgate::store::MemoryStore;
//! use modelgate::secrets::{ResolveLimits, SecretProviders};
//! use modelgate::webhook::{resolve_routes, WebhookSecretLayer, WebhooksConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
// The route's secret is read from the environment: DOC_HOOK_SECRET.
//! let entry = serde_json::json!({"enabled": true, "config": {"routes": {
//!     "deploys": {"sessionKey": "agent:main", "secret": {"source": "env", "provider": "default", "id": "DOC_HOOK_SECRET"}}
//! }}});
//! let config = WebhooksConfig::from_plugin_entry(&entry).unwrap();
//! let (routes, _skipped) = resolve_routes(&config, &SecretProviders::default(), &ResolveLimits::default());
//!
//! let service = ServiceBuilder::new()
//!     .layer(WebhookSecretLayer::new(Arc::new(MemoryStore::new()), routes))
//!     .service(service_fn(|_: Request<Full<Bytes>>| async {
//!         Ok::<_, std::convert::Infallible>(Response::builder().status(404).body(Full::new(Bytes::new())).unwrap())
//!     }));
//!
//! let request = Request::post("/plugins/webhooks/deploys")
//!     .header("content-type", "application/json")
//!     .header("x-gateway-webhook-secret", "s3cret-value-for-the-doc")
//!     .body(Full::new(Bytes::from(r#"{"action": "create_flow", "goal": "Ship 1.2"}"#)))
//!     .unwrap();
//! let response = service.oneshot(request).await.unwrap();
//! assert_eq!(response.status(), StatusCode::CREATED);
//! let body: serde_json::Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
//! assert_eq!(body["ok"], true);
//! assert_eq!(body["result"]["flow"]["status"], "queued");
//! assert_eq!(body["result"]["flow"]["revision"], 1);
//! assert!(body["result"]["flow"].get("ownerKey").is_none());
//! # }
//! ```

mod actions;
mod config;
mod flow;
mod layer;
mod payload;
mod routes;
mod service;

pub use crate::answer::AnswerFuture as ResponseFuture;
/// Moved to [`secrets`](crate::secrets); kept here for existing callers.
pub use crate::secrets::secret_ref_from_json;
pub use actions::{
    ActionReply, CancelOutcome, FlowActions, RecordOnly, RouteScope, TaskLaunch, TaskRunner,
    TaskRunnerError, TaskUpdate,
};
pub use config::{MAX_FIELD_CHARS, RouteConfig, WebhookConfigError, WebhooksConfig};
pub use flow::{Flow, FlowStatus, MAX_TASKS_PER_FLOW, NotifyPolicy, Task, TaskRuntime, TaskStatus};
pub use layer::{WebhookLimits, WebhookSecretLayer};
pub use payload::{
    ACTION_NAMES, CreateFlow, DEFAULT_LIST_LIMIT, EndFlow, FindLatestFlow, FlowAction, FlowRef,
    ListFlows, MAX_ID_CHARS, MAX_LIST_LIMIT, MAX_TEXT_CHARS, PayloadError, ResolveFlow, ResumeFlow,
    RevisedFlowRef, Revision, RunTask, SetWaiting, Text,
};
pub use routes::{SkippedRoute, WebhookRoute, resolve_routes};
pub use service::{ClientAddr, SECRET_HEADER, WebhookSecret};
