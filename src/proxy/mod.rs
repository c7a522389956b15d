//! The standalone gateway: an [`Upstream`] client at the bottom, a
//! [`RetryPolicy`] above it, and every layer of the crate stacked in front,
//! configured from one JSON document ([`GatewayConfig`]).
//! `examples/proxy.rs` serves [`gateway`] over HTTP.
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
//! has its own bounds (`unauthenticated`, [`UnauthenticatedLimits`]).
//!
//! Only `POST /api/v1/chat/completions` is forwarded; the key routes are
//! answered by [`KeyRoutes`](crate::api::KeyRoutes); anything else is a
//! canonical 404, so no other spelling of a model endpoint slips past the
//! limits.
//!
//! ```no_run
//! use std::sync::Arc;
//! use modelgate::keys::SharedStore;
//! use modelgate::proxy::{gateway, GatewayConfig, Upstream, UpstreamConfig};
//! use modelgate::store::MemoryStore;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = GatewayConfig::from_json(r#"{
//!     "upstream": {"base_url": "https://api.openai.com/v1", "api_key_env": "OPENAI_API_KEY"},
//!     "pricing": {"models": {"openai/gpt-4o": {"prompt_per_million": 2.5, "completion_per_million": 10}}}
//! }"#)?;
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let upstream = Upstream::new(&config.upstream_config(None)?)?;
//! let service = gateway::<hyper::body::Incoming>(&config, store, upstream)?;
//! // Serve `service` with hyper (see examples/proxy.rs).
//! # let _ = service;
//! # Ok(()) }
//! ```

mod access_log;
mod fallback;
mod headers;
mod model_field;
mod models;
mod providers;
mod retry;
mod upstream;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::Value;
use tower::util::BoxCloneService;
use tower::ServiceBuilder;
use tower_service::Service;

pub use crate::edit::MAX_SSE_LINE_BYTES;
pub use access_log::{AccessLog, AccessLogLayer, Annotate, AnnotateLayer};
pub use fallback::{Fallback, FallbackLayer, MODEL_HEADER};
pub use headers::{client_response_headers, request_id, upstream_request_headers, X_REQUEST_ID};
pub use model_field::{
    rewrite_model_json, rewrite_model_sse_line, BodyKind, ReportedModel, MAX_REWRITTEN_JSON_BYTES,
};
pub use models::{ModelCatalog, MAX_MODELS_PER_REQUEST};
pub use providers::{ProviderUpstream, Providers};
pub use retry::{RetryPolicy, RetryPolicyError, SkipRetries};
pub use upstream::{Upstream, UpstreamConfig, UpstreamConfigError, DEFAULT_CREDENTIAL_HEADERS};

use crate::admission::AdmissionLayers;
use crate::api::KeyRoutesLayer;
use crate::auth::{AuthFailureLimit, AuthFailures, BearerAuthLayer};
use crate::body::{BodyLimitLayer, DrainUnreadLayer};
use crate::client_addr::{ClientAddrLayer, TrustedProxies};
use crate::clock::{Clock, SystemClock};
use crate::credit::{BoundField, CreditGuardLayer, PendingSettlements, PriceTable};
use crate::error::{ErrorKind, GatewayError};
use crate::error_mapper::ErrorMapperLayer;
use crate::free_quota::{FreeModelQuotaLayer, FreeQuotaRules};
use crate::in_flight::{InFlightLimitLayer, UnauthenticatedLimits};
use crate::keys::{ByokDirectory, ByokProviders, KeyDirectory, SharedStore};
use crate::leaks::{LeakAlertsLayer, ScanningKeys};
use crate::notify::{EmailSettings, Notifier, WebhookSettings};
use crate::oauth::CodeExchangeLayer;
use crate::oauth::PlainPkce;
use crate::rate_limit::{GlobalRateLimitLayer, RateLimitRules, RateRule};
use crate::response_body::{BoxError, ResponseBody};
use crate::secrets::{ResolveLimits, Secret, SecretProviders};
use crate::settings::SettingsPageLayer;
use crate::usage::{AppRanking, Generations};
use crate::webhook::{resolve_routes, WebhookSecretLayer, WebhooksConfig};

/// The gateway's configuration, as a JSON document; every section is
/// optional.
///
/// ```json
/// {
///   "upstream": {"base_url": "https://api.openai.com/v1", "api_key_env": "OPENAI_API_KEY",
///                "connect_timeout_ms": 10000, "response_header_timeout_ms": 120000},
///   "pricing": {"models": {"openai/gpt-4o": {"prompt_per_million": 2.5, "completion_per_million": 10}}},
///   "rate_limits": {"account": {"gcra": {"requests": 600, "period_seconds": 60, "burst": 60}}},
///   "free_quota": {"requests_per_minute": 20, "requests_per_day": 50},
///   "body": {"max_body_bytes": 4194304, "read_timeout_ms": 30000},
///   "retry": {"max_attempts": 3, "max_wait_ms": 10000},
///   "credit": {"default_max_tokens": 4096, "reservation_ttl_seconds": 60},
///   "secrets": {"providers": {"vault": {"source": "file", "path": "/run/secrets/modelgate.json", "mode": "json"}}},
///   "plugins": {"entries": {"webhooks": {"enabled": false}}},
///   "providers": {"openai": {"base_url": "https://api.openai.com/v1",
///                            "api_key": {"source": "file", "provider": "vault", "id": "/openai"},
///                            "headers": {}, "credential_headers": [], "byok": true,
///                            "model_prefix": "strip"}},
///   "fallbacks": {"openai/gpt-4o": ["openai/gpt-4o-mini"]},
///   "max_in_flight": 512,
///   "unauthenticated": {"max_in_flight": 64, "max_in_flight_per_address": 4,
///                       "min_body_bytes_per_second": 4096, "body_grace_ms": 1000},
///   "auth_failures": {"max_failures": 20, "window_seconds": 600},
///   "trusted_proxies": ["10.0.0.0/8"],
///   "leak_scanning": {"public_keys": {"file": "/etc/modelgate/github-secret-scanning-keys.json"},
///                     "notify_webhook": {"url": "https://ops.example.com/hooks/leaks",
///                                        "secret": {"env": "LEAK_WEBHOOK_SECRET"}}},
///   "email": {"smtp": "smtp://localhost:25", "from": "modelgate <keys@example.com>"},
///   "generations": {"retention_days": 30, "max_per_account": 100000, "public_ranking": false},
///   "oauth": {"allow_plain_pkce": false, "max_pending_codes_per_account": 100},
///   "management_rate": {"gcra": {"requests": 600, "period_seconds": 60, "burst": 60}},
///   "shutdown_grace_seconds": 30,
///   "sqlite": {"synchronous": "normal"}
/// }
/// ```
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Where the upstream is.
    pub upstream: UpstreamSection,
    /// Prices, as [`PriceTable::from_json`] reads them. Absent: the demo
    /// prices of the built-in mock.
    pub pricing: Option<Value>,
    /// Rate rules. Absent: 600 requests a minute per account, bursts of 60.
    pub rate_limits: Option<RateLimitRules>,
    /// The free-model quota. Absent: the seed's numbers.
    pub free_quota: FreeQuotaRules,
    /// Request body limits.
    pub body: BodySection,
    /// Upstream retries.
    pub retry: RetrySection,
    /// Credit accounting.
    pub credit: CreditSection,
    /// The named secrets providers every SecretRef in this config reads
    /// from (`{"providers": {"<name>": {…}}}`, see [`SecretProviders`]):
    /// route secrets, API keys, the leak webhook's secret, the SMTP URL.
    /// Absent: the built-in `default` (the environment) alone.
    pub secrets: SecretProviders,
    /// Plugin entries (the webhook routes), kept for the webhook layer.
    pub plugins: Option<Value>,
    /// Providers by name: a model `<provider>/<model>` goes to its
    /// provider. Absent: every model goes to `upstream`.
    pub providers: HashMap<String, ProviderSection>,
    /// Per model id, the models to try after it, after any the request
    /// lists in `models`. The next is tried only when this model failed:
    /// the upstream's own 429 or 5xx, a timeout, a refused connection, or
    /// a per-model rate rule; never after the gateway's refusal of the
    /// account or key (account-wide or free-model 429, 402, a failed
    /// store's 503). See [`Fallback`].
    pub fallbacks: HashMap<String, Vec<String>>,
    /// Authenticated requests the gateway works on at once, streams
    /// included until they end; past it a request is answered 503 at once
    /// with `Retry-After`. A place is taken once the key is known good, so
    /// requests without one never hold a place. Absent:
    /// [`InFlightLimitLayer::default_max_in_flight`] (256 per core).
    pub max_in_flight: Option<usize>,
    /// The bounds of each endpoint that reads a body before anyone is
    /// authenticated (the OAuth code exchange, secret-scanning alerts, the
    /// webhook routes): requests in flight in all and per client address,
    /// and the least rate a body must arrive at; and the store lookups
    /// BearerAuth makes at once for keys not found live. See
    /// [`UnauthenticatedLimits`] for the defaults.
    pub unauthenticated: UnauthenticatedLimits,
    /// Failed authentications (bearer keys and webhook secrets) one client
    /// address may make before its refusals turn into 429 with
    /// `Retry-After`; its good keys are still served. Default: 20 in 600 s.
    pub auth_failures: AuthFailureLimit,
    /// The proxies in front of the gateway (addresses or networks such as
    /// `10.0.0.0/8`) whose `X-Forwarded-For` names the client. Empty (the
    /// default): the connection's peer is the client.
    pub trusted_proxies: Vec<String>,
    /// Secret-scanning alerts (`POST /api/v1/leaks`). Absent: that route
    /// is not served; an operator can still report a key leaked.
    pub leak_scanning: Option<LeakScanningSection>,
    /// Outbound e-mail: a leaked key's owner is told. Absent: no e-mail.
    pub email: Option<EmailSection>,
    /// Generation records (`X-Generation-Id`, `GET /api/v1/generation`)
    /// and the app ranking (`GET /api/v1/apps`).
    pub generations: GenerationsSection,
    /// OAuth keys for apps: the PKCE methods approvals may use and how many
    /// codes of one account may wait for their exchange.
    pub oauth: OAuthSection,
    /// The rate of each account's management calls (every request of an
    /// account's management key to the key routes; the operator's key is
    /// not counted), as a rate rule (`{"gcra": {…}}` or `{"rolling": {…}}`).
    /// Absent: 600 a minute, in bursts of 60.
    pub management_rate: Option<RateRule>,
    /// After SIGTERM, how long the requests in flight may take to end
    /// before the gateway ends the responses still open, each charged for
    /// what it used. Absent: [`DEFAULT_SHUTDOWN_GRACE`] (30 s).
    pub shutdown_grace_seconds: Option<u64>,
    /// How a SQLite store (`--store sqlite:PATH`, the proxy's default)
    /// commits.
    pub sqlite: SqliteSection,
}

/// `sqlite` in [`GatewayConfig`].
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SqliteSection {
    /// `"normal"` (absent): a commit survives the process being killed; a
    /// power loss may lose the last ones. `"full"`: every commit is on disk
    /// before its request goes on, at a sync per transaction.
    pub synchronous: SqliteSynchronous,
}

/// [`SqliteSection::synchronous`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSynchronous {
    /// `synchronous=NORMAL`.
    #[default]
    Normal,
    /// `synchronous=FULL`.
    Full,
}

/// How long requests in flight may take to end after SIGTERM, unless
/// `shutdown_grace_seconds` says otherwise.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

impl GatewayConfig {
    /// `shutdown_grace_seconds`, or [`DEFAULT_SHUTDOWN_GRACE`].
    pub fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace_seconds
            .map_or(DEFAULT_SHUTDOWN_GRACE, Duration::from_secs)
    }
}

/// `oauth` in [`GatewayConfig`].
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OAuthSection {
    /// Whether an approval may use the `plain` PKCE method (and an approval
    /// naming no method means `plain`). Absent: `false`, S256 only; with
    /// `plain` the verifier itself travels in the consent page's URL.
    pub allow_plain_pkce: bool,
    /// The most OAuth codes of one account waiting for their exchange at
    /// once: at least 1. Absent: 100.
    pub max_pending_codes_per_account: Option<u64>,
}

/// `generations` in [`GatewayConfig`]: how long each chat request's record
/// is kept in the store.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GenerationsSection {
    /// Days a record is kept: 1 to 3650. Absent: 30.
    pub retention_days: Option<u64>,
    /// The most records an account keeps (the oldest go first): at least
    /// 1. Absent: 100,000 (about 50 MB of Redis memory per account).
    pub max_per_account: Option<u64>,
    /// Whether every key may read the gateway-wide app ranking
    /// (`GET /api/v1/apps?account=*`), each app shown by host only (no
    /// path, no title). Absent: `false`, it is the operator's alone.
    pub public_ranking: bool,
}

impl GenerationsSection {
    /// The settings, checked.
    fn settings(&self, ranking: AppRanking) -> Result<Generations, ConfigError> {
        let mut generations = Generations::new().app_ranking(ranking);
        if let Some(days) = self.retention_days {
            if !(1..=3650).contains(&days) {
                return Err(ConfigError::new(format!(
                    "generations.retention_days must be from 1 to 3650, not {days}"
                )));
            }
            generations = generations.retention(Duration::from_secs(days * 86_400));
        }
        if let Some(most) = self.max_per_account {
            if most == 0 {
                return Err(ConfigError::new(
                    "generations.max_per_account must be at least 1",
                ));
            }
            generations = generations.max_per_account(most);
        }
        Ok(generations)
    }
}

impl std::fmt::Debug for EmailSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A URL written inline may carry a password.
        f.debug_struct("EmailSection")
            .field("smtp", &format_args!("…"))
            .field("from", &self.from)
            .finish()
    }
}

/// `leak_scanning` in [`GatewayConfig`].
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeakScanningSection {
    /// The code host's public keys alerts are signed with, in the shape
    /// GitHub publishes them (`{"public_keys": [{"key_identifier", "key",
    /// "is_current"}]}`): `{"file": "/path"}` or a SecretRef. Read at
    /// start-up; never fetched at run time.
    pub public_keys: Value,
    /// A webhook told of every leaked key, signed with HMAC-SHA256.
    pub notify_webhook: Option<NotifyWebhookSection>,
}

/// `leak_scanning.notify_webhook` in [`GatewayConfig`].
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyWebhookSection {
    /// Where the event is posted (`http` or `https`).
    pub url: String,
    /// The signing secret: `{"env": "VAR"}`, `{"file": "/path"}` or a
    /// SecretRef; at least 16 bytes.
    pub secret: Value,
}

/// `email` in [`GatewayConfig`].
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailSection {
    /// The SMTP server as a URL (`smtp://host:25`, `smtp://host:587?tls=required`,
    /// `smtps://user:pass@host`): text when it holds no password, else
    /// `{"env": "VAR"}`, `{"file": "/path"}` or a SecretRef holding it.
    pub smtp: Value,
    /// The sender, such as `modelgate <keys@example.com>`.
    pub from: String,
}

/// One provider in [`GatewayConfig`]`.providers`.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSection {
    /// Its base URL, API version included (`https://api.openai.com/v1`).
    pub base_url: String,
    /// Where its API key comes from: `{"env": "VAR"}`, `{"file": "/path"}`
    /// (the whole file, trimmed) or a SecretRef `{"source": "env"|"file"|"exec",
    /// "provider", "id"}` naming a provider of `secrets.providers`, as the
    /// webhook routes take it. A key that cannot be read stops start-up.
    pub api_key: Option<Value>,
    /// Extra headers it receives with every request (`OpenAI-Organization`, …).
    #[serde(default)]
    pub headers: HashMap<String, String>,
    /// Which of `headers` carry a credential, beside `x-api-key` and
    /// `api-key` (always): none of them is sent with an account's own key.
    #[serde(default)]
    pub credential_headers: Vec<String>,
    /// Whether accounts may bring their own key for it (BYOK): their key
    /// is then sent as `Authorization: Bearer` in place of `api_key`, and
    /// none of the credential headers goes with it. Needs `api_key`: a
    /// provider reached without one (trusted by its network, or with a
    /// credential header only) cannot take an account's key instead.
    /// Default: off.
    #[serde(default)]
    pub byok: bool,
    /// Longest wait for a connection, in ms.
    pub connect_timeout_ms: Option<u64>,
    /// Longest wait for the response headers, in ms.
    pub response_header_timeout_ms: Option<u64>,
    /// `"strip"` (the default) sends `model` without the `provider/`
    /// prefix; `"keep"` sends the gateway's whole id.
    pub model_prefix: Option<ModelPrefix>,
    /// The field the gateway writes a completion bound in when the client
    /// set none: `"max_tokens"` (the default) or `"max_completion_tokens"`
    /// (OpenAI's reasoning models take only that one).
    pub completion_bound_field: Option<BoundField>,
}

impl std::fmt::Debug for ProviderSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values may be credentials: names only.
        f.debug_struct("ProviderSection")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("credential_headers", &self.credential_headers)
            .field("byok", &self.byok)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field(
                "response_header_timeout_ms",
                &self.response_header_timeout_ms,
            )
            .field("model_prefix", &self.model_prefix)
            .field("completion_bound_field", &self.completion_bound_field)
            .finish()
    }
}

/// What a provider calls a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelPrefix {
    /// `openai/gpt-4o` reaches the provider as `gpt-4o`.
    Strip,
    /// `openai/gpt-4o` reaches the provider as `openai/gpt-4o`.
    Keep,
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `plugins` holds webhook secrets: never printed.
        f.debug_struct("GatewayConfig")
            .field("upstream", &self.upstream)
            .field("pricing", &self.pricing)
            .field("rate_limits", &self.rate_limits)
            .field("free_quota", &self.free_quota)
            .field("body", &self.body)
            .field("retry", &self.retry)
            .field("credit", &self.credit)
            .field("secrets", &self.secrets)
            .field("plugins", &self.plugins.as_ref().map(|_| "…"))
            .field("providers", &self.providers)
            .field("fallbacks", &self.fallbacks)
            .field("max_in_flight", &self.max_in_flight)
            .field("unauthenticated", &self.unauthenticated)
            .field("auth_failures", &self.auth_failures)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("leak_scanning", &self.leak_scanning)
            .field("email", &self.email)
            .field("generations", &self.generations)
            .field("oauth", &self.oauth)
            .field("management_rate", &self.management_rate)
            .field("shutdown_grace_seconds", &self.shutdown_grace_seconds)
            .field("sqlite", &self.sqlite)
            .finish()
    }
}

impl GatewayConfig {
    /// Whether the config enables the webhooks plugin.
    pub fn webhooks_enabled(&self) -> bool {
        self.plugins
            .as_ref()
            .and_then(|plugins| plugins.pointer("/entries/webhooks/enabled"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// The webhooks plugin entry, read strictly; `None` when there is none.
    pub fn webhooks(&self) -> Result<Option<WebhooksConfig>, ConfigError> {
        let Some(plugins) = &self.plugins else {
            return Ok(None);
        };
        let mut plugins = plugins.clone();
        let Some(entries) = plugins.get_mut("entries").and_then(Value::as_object_mut) else {
            return Err(ConfigError::new("plugins must be {\"entries\": {…}}"));
        };
        match entries.remove("webhooks") {
            None => Ok(None),
            Some(entry) => WebhooksConfig::from_plugin_entry(&entry)
                .map(Some)
                .map_err(ConfigError::new),
        }
    }
}

/// `upstream` in [`GatewayConfig`].
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamSection {
    /// The upstream's base URL, its version path included.
    pub base_url: Option<String>,
    /// The environment variable holding the upstream's API key.
    pub api_key_env: Option<String>,
    /// Longest wait for a connection, in ms.
    pub connect_timeout_ms: Option<u64>,
    /// Longest wait for the response headers, in ms.
    pub response_header_timeout_ms: Option<u64>,
}

/// `body` in [`GatewayConfig`].
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BodySection {
    /// Largest request body, in bytes.
    pub max_body_bytes: Option<usize>,
    /// Longest time to receive a body, in ms.
    pub read_timeout_ms: Option<u64>,
}

/// `retry` in [`GatewayConfig`].
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySection {
    /// Attempts in all, 1 to 5 (default 3).
    pub max_attempts: Option<u32>,
    /// Longest wait before a retry, in ms (default 10 000).
    pub max_wait_ms: Option<u64>,
}

/// `credit` in [`GatewayConfig`].
///
/// There is no `byok` here: a request is BYOK only when the account's own
/// key is what reaches the provider, so an account brings its keys through
/// the management API (`PUT /api/v1/accounts/{id}/byok/{provider}`), with a
/// `providers` section. A config that still has `credit.byok` is refused.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(try_from = "CreditSectionInput")]
pub struct CreditSection {
    /// Completion tokens assumed without `max_tokens`.
    pub default_max_tokens: Option<u64>,
    /// How long a hold lasts unless renewed, in seconds (renewed every
    /// third of it while its request is in flight).
    pub reservation_ttl_seconds: Option<u64>,
}

/// The longest hold lifetime, in seconds: [`MAX_RESERVATION_TTL`](crate::store::MAX_RESERVATION_TTL).
const MAX_RESERVATION_TTL_SECONDS: u64 = crate::store::MAX_RESERVATION_TTL.as_secs();

/// `credit` as written, so a retired field gets a message that says what
/// to do instead of serde's "unknown field".
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct CreditSectionInput {
    default_max_tokens: Option<u64>,
    reservation_ttl_seconds: Option<u64>,
    byok: Option<serde::de::IgnoredAny>,
}

impl TryFrom<CreditSectionInput> for CreditSection {
    type Error = String;

    fn try_from(input: CreditSectionInput) -> Result<Self, String> {
        if input.byok.is_some() {
            // It booked accounts as BYOK while the gateway's own key was
            // sent: the gateway paid and no balance was charged.
            return Err(
                "credit.byok is no longer accepted: it booked an account's requests as BYOK (not charged to its balance) while the gateway's own provider key was sent. Remove it; to let an account bring its own key, add a `providers` section naming the provider and set the account's key with PUT /api/v1/accounts/{id}/byok/{provider} using a management key"
                    .to_owned(),
            );
        }
        // A hold renewed every third of its lifetime, in whole seconds:
        // below 3 s renewals would come faster than a store answers under
        // load, and 0 would hold nothing.
        if let Some(seconds) = input
            .reservation_ttl_seconds
            .filter(|seconds| !(3..=MAX_RESERVATION_TTL_SECONDS).contains(seconds))
        {
            return Err(format!(
                "credit.reservation_ttl_seconds must be from 3 to {MAX_RESERVATION_TTL_SECONDS} (a year), not {seconds}: a hold lasts that long unless renewed, and is renewed every third of it while its request runs"
            ));
        }
        Ok(CreditSection {
            default_max_tokens: input.default_max_tokens,
            reservation_ttl_seconds: input.reservation_ttl_seconds,
        })
    }
}

/// Why a configuration was refused: the section and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("config: {0}")]
pub struct ConfigError(String);

impl ConfigError {
    fn new(message: impl std::fmt::Display) -> Self {
        ConfigError(message.to_string())
    }
}

/// The prices the demo uses when the config has none: paid models the
/// built-in mock serves, and the free variants it serves.
pub const DEMO_PRICING: &str = r#"{"models": {
    "openai/gpt-4o-mini": {"prompt_per_million": 0.15, "completion_per_million": 0.6, "context_length": 128000},
    "demo/paid": {"prompt_per_million": 1000, "completion_per_million": 1000, "context_length": 128000},
    "meta-llama/llama-3.1-8b-instruct:free": {"prompt_per_million": 0, "completion_per_million": 0, "context_length": 131072}
}, "free_models": ["openai/gpt-4o-mini:free"]}"#;

/// The account rule the demo uses when the config has none.
pub const DEMO_RATE_LIMITS: &str =
    r#"{"account": {"gcra": {"requests": 600, "period_seconds": 60, "burst": 60}}}"#;

impl GatewayConfig {
    /// Reads a JSON configuration; refuses unknown fields.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        serde_json::from_str(text).map_err(ConfigError::new)
    }

    /// The upstream client's settings; `base_url` overrides the config's.
    pub fn upstream_config(&self, base_url: Option<&str>) -> Result<UpstreamConfig, ConfigError> {
        let base_url = base_url
            .map(str::to_owned)
            .or_else(|| self.upstream.base_url.clone())
            .ok_or_else(|| ConfigError::new("upstream.base_url is missing"))?;
        let mut config = UpstreamConfig::new(base_url);
        if let Some(variable) = &self.upstream.api_key_env {
            config.api_key = Some(std::env::var(variable).map_err(|_| {
                ConfigError::new(format!(
                    "upstream.api_key_env names {variable}, which is not set"
                ))
            })?);
        }
        if let Some(ms) = self.upstream.connect_timeout_ms {
            config.connect_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = self.upstream.response_header_timeout_ms {
            config.response_header_timeout = Duration::from_millis(ms);
        }
        Ok(config)
    }

    /// Each configured provider's upstream, its key read now.
    pub fn provider_upstreams(&self) -> Result<HashMap<String, ProviderUpstream>, ConfigError> {
        let mut upstreams = HashMap::new();
        for (name, section) in &self.providers {
            let valid_name = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'));
            if !valid_name {
                return Err(ConfigError::new(format!(
                    "providers: {name:?} must be 1 to 64 characters of A-Z a-z 0-9 - _ ."
                )));
            }
            if section.byok && section.api_key.is_none() {
                // Its credential, if any, is not the header an account's
                // key replaces: the key would ride on the gateway's access.
                return Err(ConfigError::new(format!(
                    "providers.{name}.byok needs providers.{name}.api_key: an account's own key is sent in place of the provider's api_key, and this provider has none (it is trusted by its network or by a configured header), so a request with an account's key would still be the gateway's. Remove \"byok\", or give the provider its api_key"
                )));
            }
            let mut config = UpstreamConfig::new(section.base_url.clone());
            if let Some(key) = &section.api_key {
                let secret = self.read_secret(&format!("providers.{name}.api_key"), key)?;
                config.api_key = Some(secret.expose().to_owned());
            }
            config.extra_headers = section
                .headers
                .iter()
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect();
            config.credential_headers = section.credential_headers.clone();
            if let Some(ms) = section.connect_timeout_ms {
                config.connect_timeout = Duration::from_millis(ms);
            }
            if let Some(ms) = section.response_header_timeout_ms {
                config.response_header_timeout = Duration::from_millis(ms);
            }
            let upstream = Upstream::new(&config)
                .map_err(|error| ConfigError::new(format!("providers.{name}: {error}")))?;
            upstreams.insert(
                name.clone(),
                ProviderUpstream {
                    upstream,
                    strip_prefix: section.model_prefix != Some(ModelPrefix::Keep),
                    byok: section.byok,
                },
            );
        }
        Ok(upstreams)
    }

    /// The public keys secret-scanning alerts are checked with, read now;
    /// `None` without a `leak_scanning` section.
    pub fn scanning_keys(&self) -> Result<Option<ScanningKeys>, ConfigError> {
        let Some(section) = &self.leak_scanning else {
            return Ok(None);
        };
        let text = self.read_secret("leak_scanning.public_keys", &section.public_keys)?;
        ScanningKeys::from_json(text.expose().as_bytes())
            .map(Some)
            .map_err(|error| ConfigError::new(format!("leak_scanning.public_keys: {error}")))
    }

    /// Who is told of a leaked key: the owner by e-mail (`email`) and the
    /// `leak_scanning.notify_webhook`, each when configured.
    pub fn leak_notifier(&self) -> Result<Notifier, ConfigError> {
        let email = match &self.email {
            None => None,
            Some(section) => {
                let url = match &section.smtp {
                    Value::String(url) => url.clone(),
                    reference => self
                        .read_secret("email.smtp", reference)?
                        .expose()
                        .to_owned(),
                };
                Some(
                    EmailSettings::new(&url, &section.from)
                        .map_err(|error| ConfigError::new(format!("email: {error}")))?,
                )
            }
        };
        let webhook = match self
            .leak_scanning
            .as_ref()
            .and_then(|section| section.notify_webhook.as_ref())
        {
            None => None,
            Some(section) => {
                let secret =
                    self.read_secret("leak_scanning.notify_webhook.secret", &section.secret)?;
                Some(WebhookSettings::new(&section.url, secret).map_err(|error| {
                    ConfigError::new(format!("leak_scanning.notify_webhook: {error}"))
                })?)
            }
        };
        Ok(Notifier::new(email, webhook))
    }

    fn price_table(&self) -> Result<PriceTable, ConfigError> {
        match &self.pricing {
            Some(pricing) => PriceTable::from_json(&pricing.to_string()),
            None => PriceTable::from_json(DEMO_PRICING),
        }
        .map_err(ConfigError::new)
    }

    fn rate_rules(&self) -> Result<RateLimitRules, ConfigError> {
        match &self.rate_limits {
            Some(rules) => Ok(rules.clone()),
            None => RateLimitRules::from_json(DEMO_RATE_LIMITS).map_err(ConfigError::new),
        }
    }

    /// `management_rate`, checked as an account rule is; the default when
    /// absent.
    fn management_rate_rule(&self) -> Result<RateRule, ConfigError> {
        let Some(rule) = self.management_rate else {
            return Ok(crate::api::DEFAULT_MANAGEMENT_RATE);
        };
        RateLimitRules {
            account: Some(rule),
            ..RateLimitRules::default()
        }
        .validate()
        .map_err(|error| ConfigError::new(format!("management_rate: {error}")))?;
        Ok(rule)
    }

    fn retry_policy(&self) -> Result<RetryPolicy, ConfigError> {
        let policy = RetryPolicy::new(
            self.retry
                .max_attempts
                .unwrap_or(RetryPolicy::DEFAULT_ATTEMPTS),
        )
        .map_err(ConfigError::new)?;
        Ok(match self.retry.max_wait_ms {
            Some(ms) => policy.max_wait(Duration::from_millis(ms)),
            None => policy,
        })
    }

    /// The secret `value` names (`{"env"}`, `{"file"}` or a SecretRef to
    /// one of `secrets.providers`), read now; errors name `field`.
    fn read_secret(&self, field: &str, value: &Value) -> Result<Secret, ConfigError> {
        let spec = crate::webhook::secret_ref_from_json(value)
            .map_err(|problem| ConfigError::new(format!("{field} {problem}")))?;
        crate::secrets::resolve_secret(&spec, &self.secrets, &ResolveLimits::default())
            .map_err(|error| ConfigError::new(format!("{field}: {error}")))
    }
}

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
    let max_in_flight = config
        .max_in_flight
        .unwrap_or_else(InFlightLimitLayer::default_max_in_flight);
    if max_in_flight == 0 {
        return Err(ConfigError::new("max_in_flight must be at least 1"));
    }
    config
        .unauthenticated
        .validate()
        .map_err(ConfigError::new)?;
    let auth_failures =
        AuthFailures::with_clock(config.auth_failures, clock.clone()).map_err(ConfigError::new)?;
    let trusted_proxies =
        TrustedProxies::parse(&config.trusted_proxies).map_err(ConfigError::new)?;
    let webhooks = match config.webhooks()? {
        Some(webhooks) => {
            let (routes, _skipped) =
                resolve_routes(&webhooks, &config.secrets, &ResolveLimits::default());
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
    let rate_limit = GlobalRateLimitLayer::new(store.clone(), config.rate_rules()?)
        .map_err(ConfigError::new)?
        .clock(clock.clone());
    let free_quota = FreeModelQuotaLayer::new(store.clone())
        .rules(config.free_quota)
        .map_err(ConfigError::new)?
        .clock(clock.clone());
    let prices = Arc::new(config.price_table()?);
    let bottom = if config.providers.is_empty() {
        Providers::single(upstream)
    } else {
        Providers::by_name(config.provider_upstreams()?)
    };
    let catalog = ModelCatalog::new(
        Arc::clone(&prices),
        bottom.names(),
        &config.fallbacks,
        &config.rate_rules()?,
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
        .generations(config.generations.settings(app_ranking.clone())?);
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
    let max_pending_codes = match config.oauth.max_pending_codes_per_account {
        Some(0) => {
            return Err(ConfigError::new(
                "oauth.max_pending_codes_per_account must be at least 1",
            ))
        }
        Some(most) => most,
        None => crate::oauth::DEFAULT_MAX_PENDING_CODES_PER_ACCOUNT,
    };
    let plain_pkce = if config.oauth.allow_plain_pkce {
        PlainPkce::Allowed
    } else {
        PlainPkce::Refused
    };
    let service = ServiceBuilder::new()
        .map_response(boxed_response)
        .layer(drain)
        .layer(AccessLogLayer::new(Arc::clone(&catalog)))
        .layer(ClientAddrLayer::new(trusted_proxies))
        .layer(SettingsPageLayer::new())
        .layer(leak_alerts)
        // Before BearerAuth: an app exchanging its code has no key yet.
        .layer(
            CodeExchangeLayer::new(directory.clone())
                .failure_limit(auth_failures.clone())
                .unauthenticated_limits(config.unauthenticated),
        )
        .layer(webhooks)
        .layer(ErrorMapperLayer::new())
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
        .layer(InFlightLimitLayer::new(max_in_flight))
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
        .layer_fn(|inner| ChatOnly {
            inner,
            models_list: Arc::clone(&models_list),
        })
        .layer(tower::retry::RetryLayer::new(config.retry_policy()?))
        .service(bottom);
    Ok(Gateway {
        service: BoxCloneService::new(service),
        settlements: credit.pending_settlements(),
        app_ranking,
    })
}

fn boxed_response<B>(response: Response<B>) -> Response<GatewayBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    response.map(|body| body.map_err(Into::into).boxed_unsync())
}

/// Forwards `POST /api/v1/chat/completions` only; every other path is a
/// canonical 404. Upstream failures and credential refusals become
/// complete canonical responses here, below CreditGuard, so they are
/// settled as errors (at no cost).
#[derive(Clone, Debug)]
struct ChatOnly<S> {
    inner: S,
    /// `GET /api/v1/models`, built once.
    models_list: Arc<Value>,
}

impl<S> Service<Request<Full<Bytes>>> for ChatOnly<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<Incoming>, Error = GatewayError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<ResponseBody<Incoming>>;
    type Error = GatewayError;
    type Future = BoxFuture<'static, Result<Self::Response, GatewayError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        if is_models_path(request.method(), request.uri().path()) {
            let mut response = Response::new(ResponseBody::full(Bytes::from(
                self.models_list.to_string(),
            )));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            return Box::pin(async move { Ok(response) });
        }
        if !is_chat_completions_path(request.method(), request.uri().path()) {
            let error = GatewayError::new(
                ErrorKind::NotFound,
                format!(
                    "no such endpoint: {} {}; this gateway serves POST /api/v1/chat/completions and the key routes",
                    request.method(),
                    request.uri().path()
                ),
            );
            return Box::pin(async move { Ok(error.to_response()) });
        }
        let request = provider_side(request);
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let outcome = match tower::ServiceExt::ready(&mut inner).await {
                Ok(ready) => ready.call(request).await,
                Err(error) => Err(error),
            };
            Ok(match outcome {
                // An upstream that could not be reached or did not answer
                // becomes a complete error response: CreditGuard charges
                // nothing for it.
                Err(error) => error.to_response(),
                Ok(response) if matches!(response.status().as_u16(), 401..=403) => {
                    // The upstream refused the gateway's own credentials or
                    // account, not the client's: a 502, and its words (which
                    // may name the operator's key) only in the log.
                    let status = response.status().as_u16();
                    tracing::warn!(
                        upstream_status = status,
                        "the upstream refused the gateway's credentials"
                    );
                    GatewayError::new(
                        ErrorKind::Upstream,
                        "the upstream refused this gateway's credentials; the operator must check the upstream key and account",
                    )
                    .with_metadata("upstream_status", status)
                    .to_response()
                }
                Ok(response) => response.map(ResponseBody::inner),
            })
        })
    }
}

/// The request with only the extensions the provider side reads (the
/// retry policy, [`Providers`], [`Upstream`]): the retry keeps a copy of
/// every request it sends, and the layers above have their own.
fn provider_side(request: Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    let (mut parts, body) = request.into_parts();
    let mut kept = http::Extensions::new();
    move_extension::<crate::body::ChatRequest>(&mut parts.extensions, &mut kept);
    move_extension::<crate::body::BufferedBody>(&mut parts.extensions, &mut kept);
    move_extension::<crate::keys::ByokCredential>(&mut parts.extensions, &mut kept);
    move_extension::<SkipRetries>(&mut parts.extensions, &mut kept);
    move_extension::<crate::credit::SentUpstream>(&mut parts.extensions, &mut kept);
    parts.extensions = kept;
    Request::from_parts(parts, body)
}

fn move_extension<T: Clone + Send + Sync + 'static>(
    from: &mut http::Extensions,
    to: &mut http::Extensions,
) {
    if let Some(value) = from.remove::<T>() {
        to.insert(value);
    }
}

/// Exactly `POST /api/v1/chat/completions`, in any case and spelling of
/// the same segments: nothing in front of or between them.
fn is_chat_completions_path(method: &http::Method, path: &str) -> bool {
    method == http::Method::POST
        && crate::body::path_is(path, &["api", "v1", "chat", "completions"])
}

/// `GET /api/v1/models`, spelled the same way.
fn is_models_path(method: &http::Method, path: &str) -> bool {
    method == http::Method::GET && crate::body::path_is(path, &["api", "v1", "models"])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn providers_config(providers: Value) -> GatewayConfig {
        GatewayConfig::from_json(&serde_json::json!({ "providers": providers }).to_string())
            .unwrap()
    }

    #[test]
    fn byok_is_off_unless_a_provider_with_an_api_key_opts_in() {
        std::env::set_var("MODELGATE_UNIT_BYOK_KEY", "sk-unit-provider-0001");
        let key = serde_json::json!({"env": "MODELGATE_UNIT_BYOK_KEY"});
        let config = providers_config(serde_json::json!({
            "keyed": {"base_url": "http://127.0.0.1:9/v1", "api_key": key},
            "opted": {"base_url": "http://127.0.0.1:9/v1", "api_key": key, "byok": true,
                      "headers": {"x-api-key": "gateway-x", "x-goog-api-key": "gateway-g"},
                      "credential_headers": ["x-goog-api-key"]},
            "headed": {"base_url": "http://127.0.0.1:9/v1", "headers": {"x-api-key": "gateway-x"}},
        }));
        assert!(!config.providers["keyed"].byok, "off by default");
        let shown = format!("{config:?}");
        assert!(
            shown.contains("x-goog-api-key") && !shown.contains("gateway-g"),
            "{shown}"
        );
        let upstreams = config.provider_upstreams().unwrap();
        let byok: BTreeSet<&str> = upstreams
            .iter()
            .filter(|(_, provider)| provider.byok)
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(byok, BTreeSet::from(["opted"]));
        assert_eq!(
            Providers::by_name(upstreams).byok_providers(),
            ByokProviders::Configured {
                byok: ["opted".to_owned()].into(),
                others: ["headed".to_owned(), "keyed".to_owned()].into(),
            }
        );
        let single = Upstream::new(&UpstreamConfig::new("http://127.0.0.1:9/v1")).unwrap();
        assert_eq!(
            Providers::single(single).byok_providers(),
            ByokProviders::SingleUpstream
        );
    }

    #[test]
    fn byok_without_an_api_key_stops_start_up_naming_the_field() {
        for section in [
            // Trusted by its network.
            serde_json::json!({"base_url": "http://127.0.0.1:9/v1", "byok": true}),
            // Its credential is a configured header, not the one an
            // account's key replaces.
            serde_json::json!({"base_url": "http://127.0.0.1:9/v1", "byok": true,
                               "headers": {"x-api-key": "gateway-x"}}),
        ] {
            let error = providers_config(serde_json::json!({ "local": section }))
                .provider_upstreams()
                .expect_err("refused")
                .to_string();
            assert!(
                error.contains("providers.local.byok needs providers.local.api_key"),
                "{error}"
            );
            assert!(!error.contains("gateway-x"), "{error}");
        }
        let error = providers_config(serde_json::json!({"p": {
            "base_url": "http://127.0.0.1:9/v1",
            "headers": {"x-goog-api-key": "gateway-g"},
            "credential_headers": ["x-goog-apikey"]}}))
        .provider_upstreams()
        .expect_err("a misspelt credential header is refused")
        .to_string();
        assert!(
            error.contains("providers.p")
                && error.contains("credential_headers names x-goog-apikey"),
            "{error}"
        );
        for bad in [r#""byok": "yes""#, r#""credential_headers": "x-api-key""#] {
            let text = format!(r#"{{"providers": {{"p": {{"base_url": "http://x/v1", {bad}}}}}}}"#);
            assert!(GatewayConfig::from_json(&text).is_err(), "{text}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_provider_section_loads_or_is_refused_and_byok_always_has_an_api_key(
            byok in proptest::bool::ANY,
            with_key in proptest::bool::ANY,
            headers in proptest::collection::btree_map("[A-Za-z0-9 -]{0,10}", "[ -~]{0,10}", 0..3),
            credential_headers in proptest::collection::vec("[A-Za-z0-9 -]{0,10}", 0..3),
        ) {
            std::env::set_var("MODELGATE_UNIT_BYOK_KEY", "sk-unit-provider-0001");
            let mut section = serde_json::json!({
                "base_url": "http://127.0.0.1:9/v1", "byok": byok,
                "headers": headers, "credential_headers": credential_headers,
            });
            if with_key {
                section["api_key"] = serde_json::json!({"env": "MODELGATE_UNIT_BYOK_KEY"});
            }
            let config = providers_config(serde_json::json!({ "p": section }));
            match config.provider_upstreams() {
                Ok(upstreams) => {
                    proptest::prop_assert_eq!(upstreams["p"].byok, byok);
                    proptest::prop_assert!(!byok || with_key);
                }
                Err(error) => {
                    proptest::prop_assert!(error.to_string().starts_with("config: providers.p"), "{}", error);
                }
            }
        }
    }

    #[test]
    fn credit_byok_is_refused_with_what_to_do_instead() {
        let error = GatewayConfig::from_json(r#"{"credit": {"byok": {"acme": ["openai"]}}}"#)
            .expect_err("credit.byok is refused");
        let message = error.to_string();
        for words in [
            "credit.byok is no longer accepted",
            "`providers` section",
            "PUT /api/v1/accounts/{id}/byok/{provider}",
            "management key",
        ] {
            assert!(message.contains(words), "{words:?} missing: {message}");
        }
        // Even empty: the field itself is what is retired.
        assert!(GatewayConfig::from_json(r#"{"credit": {"byok": {}}}"#).is_err());
    }

    #[tokio::test]
    async fn api_keys_come_from_named_providers_and_an_unknown_one_stops_start_up() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys.json");
        std::fs::write(&keys, r#"{"openai": "sk-from-the-vault-0123456789"}"#).unwrap();
        let config = |api_key: Value| {
            GatewayConfig::from_json(
                &serde_json::json!({
                    "secrets": {"providers": {"vault": {"source": "file", "path": keys, "mode": "json"}}},
                    "providers": {"openai": {"base_url": "http://127.0.0.1:9/v1", "api_key": api_key}}
                })
                .to_string(),
            )
            .unwrap()
        };
        let vault =
            config(serde_json::json!({"source": "file", "provider": "vault", "id": "/openai"}));
        assert!(vault.provider_upstreams().is_ok());
        assert!(!format!("{vault:?}").contains("sk-from-the-vault"));
        for (api_key, words) in [
            // Written the old way, with the file's path as the provider.
            (
                serde_json::json!({"source": "file", "provider": "/run/keys/openai", "id": "value"}),
                ["\"/run/keys/openai\"", "a path is no longer a provider"],
            ),
            (
                serde_json::json!({"source": "file", "provider": "elsewhere", "id": "/openai"}),
                ["\"elsewhere\"", "secrets.providers"],
            ),
            (
                serde_json::json!({"source": "env", "provider": "vault", "id": "OPENAI_API_KEY"}),
                ["\"vault\"", "has source \"file\""],
            ),
        ] {
            let error = config(api_key.clone())
                .provider_upstreams()
                .expect_err("an unresolvable key stops start-up")
                .to_string();
            assert!(error.contains("providers.openai.api_key"), "{error}");
            for word in words {
                assert!(error.contains(word), "{api_key}: {word:?} missing: {error}");
            }
        }
        // A bad section is refused when the config is read, naming the field.
        for (json, field) in [
            (
                r#"{"secrets": {"providers": {"v": {"source": "file", "path": "keys.json"}}}}"#,
                "secrets.providers.v.path",
            ),
            (r#"{"secrets": {"provider": {}}}"#, "secrets.provider"),
        ] {
            let error = GatewayConfig::from_json(json).unwrap_err().to_string();
            assert!(error.contains(field), "{json}: {error}");
        }
        assert_eq!(
            GatewayConfig::from_json("{}").unwrap().secrets,
            SecretProviders::default()
        );
    }

    #[test]
    fn generations_settings_are_checked() {
        let store: SharedStore = Arc::new(crate::store::MemoryStore::new());
        let ranking = || AppRanking::new(Arc::clone(&store));
        let settings = |json: &str| {
            GatewayConfig::from_json(json)
                .unwrap()
                .generations
                .settings(ranking())
        };
        let kept =
            settings(r#"{"generations": {"retention_days": 7, "max_per_account": 10}}"#).unwrap();
        assert_eq!(kept.retention, Duration::from_secs(7 * 86_400));
        assert_eq!(kept.max_per_account, 10);
        let default = settings("{}").unwrap();
        assert_eq!(default.retention, crate::usage::DEFAULT_RETENTION);
        for (json, words) in [
            (
                r#"{"generations": {"retention_days": 0}}"#,
                "retention_days must be from 1 to 3650",
            ),
            (
                r#"{"generations": {"retention_days": 3651}}"#,
                "retention_days must be from 1 to 3650",
            ),
            (
                r#"{"generations": {"max_per_account": 0}}"#,
                "max_per_account must be at least 1",
            ),
        ] {
            let error = settings(json).unwrap_err().to_string();
            assert!(error.contains(words), "{json}: {error}");
        }
        assert!(GatewayConfig::from_json(r#"{"generations": {"days": 1}}"#).is_err());
    }

    #[test]
    fn the_shutdown_grace_is_read_and_defaults_to_30_seconds() {
        let config = GatewayConfig::from_json(r#"{"shutdown_grace_seconds": 2}"#).unwrap();
        assert_eq!(config.shutdown_grace(), Duration::from_secs(2));
        let config = GatewayConfig::from_json("{}").unwrap();
        assert_eq!(config.shutdown_grace(), Duration::from_secs(30));
        assert!(GatewayConfig::from_json(r#"{"shutdown_grace_seconds": -1}"#).is_err());
    }

    #[test]
    fn the_other_credit_fields_are_read_and_unknown_ones_refused() {
        let config = GatewayConfig::from_json(
            r#"{"credit": {"default_max_tokens": 7, "reservation_ttl_seconds": 60}}"#,
        )
        .unwrap();
        assert_eq!(config.credit.default_max_tokens, Some(7));
        assert_eq!(config.credit.reservation_ttl_seconds, Some(60));
        for bad in ["0", "2", "31536001"] {
            let error = GatewayConfig::from_json(&format!(
                r#"{{"credit": {{"reservation_ttl_seconds": {bad}}}}}"#
            ))
            .unwrap_err()
            .to_string();
            assert!(
                error.contains("credit.reservation_ttl_seconds must be from 3"),
                "{error}"
            );
        }
        let config = GatewayConfig::from_json(r#"{"credit": {}}"#).unwrap();
        assert_eq!(config.credit.default_max_tokens, None);
        let error = GatewayConfig::from_json(r#"{"credit": {"max_tokens": 7}}"#)
            .expect_err("unknown fields are refused");
        assert!(
            error.to_string().contains("unknown field `max_tokens`"),
            "{error}"
        );
    }
}
