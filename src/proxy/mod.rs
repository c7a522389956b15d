//! The standalone gateway: an [`Upstream`] client at the bottom, a
//! [`RetryPolicy`] above it, and every layer of the crate stacked in front,
//! configured from one JSON document ([`GatewayConfig`]), checked and
//! read once into a [`GatewayPlan`]. `examples/proxy.rs` serves [`gateway`]
//! over HTTP.
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
//! use modelgate::proxy::{gateway, GatewayConfig, GatewayPlan, Upstream};
//! use modelgate::store::MemoryStore;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = GatewayConfig::from_json(r#"{
//!     "upstream": {"base_url": "https://api.openai.com/v1", "api_key_env": "OPENAI_API_KEY"},
//!     "pricing": {"models": {"openai/gpt-4o": {"prompt_per_million": 2.5, "completion_per_million": 10}}}
//! }"#)?;
//! // Once, at start-up: the config checked, its secrets read.
//! let plan = GatewayPlan::new(&config)?;
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let upstream = Upstream::new(&config.upstream_config(None)?)?;
//! // Wiring only: it cannot fail.
//! let service = gateway::<hyper::body::Incoming>(&plan, store, upstream);
//! // Serve `service` with hyper (see examples/proxy.rs).
//! # let _ = service;
//! # Ok(()) }
//! ```

mod access_log;
mod chat_only;
mod config;
mod fallback;
mod headers;
mod model_field;
mod models;
mod providers;
mod retry;
mod stack;
mod translate;
mod upstream;

pub use crate::edit::MAX_SSE_LINE_BYTES;
pub use crate::routing::loggable_path;
/// What config types hold a value that may be a credential in: `Debug`
/// prints it as `[redacted]`.
pub use crate::secrets::Redacted;
pub use access_log::{AccessLog, AccessLogLayer, Annotate, AnnotateLayer};
pub use config::{
    AlertsSection, BodySection, ConfigError, CreditSection, DEFAULT_SHUTDOWN_GRACE, DEMO_PRICING,
    DEMO_RATE_LIMITS, EmailSection, GatewayConfig, GatewayPlan, GenerationsSection,
    LeakScanningSection, ModelPrefix, NotifyWebhookSection, OAuthSection, PluginEntries,
    PluginsSection, ProviderSection, RetrySection, SmtpServer, SqliteSection, SqliteSynchronous,
    UpstreamSection,
};
pub use fallback::{Fallback, FallbackLayer, MODEL_HEADER};
pub use headers::{X_REQUEST_ID, client_response_headers, request_id, upstream_request_headers};
pub use model_field::{
    BodyKind, MAX_REWRITTEN_JSON_BYTES, ReportedModel, rewrite_model_json, rewrite_model_sse_line,
};
pub use models::{MAX_MODELS_PER_REQUEST, ModelCatalog};
pub use providers::{ProviderUpstream, Providers};
pub use retry::{RetryPolicy, RetryPolicyError, SkipRetries};
pub use stack::{Gateway, GatewayBody, GatewayService, build_gateway, gateway, gateway_with_clock};
/// The translations between the Messages API and chat completions, for
/// the fuzz targets only (`cargo fuzz` sets `--cfg fuzzing`).
#[cfg(fuzzing)]
#[doc(hidden)]
pub use translate::fuzzing as translate_fuzzing;
pub use upstream::{
    DEFAULT_CREDENTIAL_HEADERS, ServedApis, Upstream, UpstreamConfig, UpstreamConfigError,
};
