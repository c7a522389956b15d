//! [`GatewayConfig`]: the gateway's JSON configuration, typed and checked
//! when it is read.
//!
//! [`GatewayConfig::from_json`] reads every section into its own type
//! (prices, secret references, the webhook routes, the SMTP server) and
//! checks each value, so a gateway built from a config it accepted fails
//! only for what is outside the text: a secret that cannot be read, a
//! public-keys file that is missing. Errors name the value's path and what
//! is expected:
//!
//! ```
//! use modelgate::proxy::GatewayConfig;
//!
//! let error = GatewayConfig::from_json(
//!     r#"{"pricing": {"models": {"openai/gpt-4o": {"prompt_per_million": -1, "completion_per_million": 10}}}}"#,
//! )
//! .unwrap_err();
//! assert!(error.to_string().starts_with(
//!     r#"config: pricing.models["openai/gpt-4o"].prompt_per_million must be a number of credits from 0 to 1000000"#
//! ));
//! ```
//!
//! Every type here derives `Debug`; what may be a credential is a
//! [`Redacted`] or a [`Secret`](crate::secrets::Secret), printed as
//! neither, so a new field is always shown and never leaks.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::models::ModelCatalog;
use super::providers::ProviderUpstream;
use super::retry::RetryPolicy;
use super::upstream::{Upstream, UpstreamConfig};
use crate::alerts::AlertRules;
use crate::auth::AuthFailureLimit;
use crate::client_addr::TrustedProxies;
use crate::credit::{BoundField, PriceTable};
use crate::free_quota::FreeQuotaRules;
use crate::in_flight::UnauthenticatedLimits;
use crate::leaks::ScanningKeys;
use crate::notify::{EmailSettings, Notifier, WebhookSettings};
use crate::rate_limit::{RateLimitRules, RateRule};
use crate::secrets::{
    resolve_secret, secret_ref_from_json, Redacted, ResolveLimits, Secret, SecretProviders,
    SecretSpec,
};
use crate::usage::{AppRanking, Generations};
use crate::webhook::WebhooksConfig;

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
///   "alerts": {"balance_below": [5, 1], "key_limit_percent": [80, 100],
///              "webhook": {"url": "https://ops.example.com/hooks/alerts",
///                          "secret": {"env": "ALERT_WEBHOOK_SECRET"}}},
///   "generations": {"retention_days": 30, "max_per_account": 100000, "public_ranking": false},
///   "oauth": {"allow_plain_pkce": false, "max_pending_codes_per_account": 100},
///   "management_rate": {"gcra": {"requests": 600, "period_seconds": 60, "burst": 60}},
///   "shutdown_grace_seconds": 30,
///   "sqlite": {"synchronous": "normal"}
/// }
/// ```
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Where the upstream is.
    pub upstream: UpstreamSection,
    /// Prices, as [`PriceTable::from_json`] reads them, checked at load.
    /// Absent: the demo prices of the built-in mock ([`DEMO_PRICING`]).
    pub pricing: Option<PriceTable>,
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
    /// Plugin entries: the webhook routes (`{"entries": {"webhooks": {…}}}`).
    pub plugins: Option<PluginsSection>,
    /// Providers by name: a model `<provider>/<model>` goes to its
    /// provider. Absent: every model goes to `upstream`.
    pub providers: HashMap<String, ProviderSection>,
    /// Per model id, the models to try after it, after any the request
    /// lists in `models`. The next is tried only when this model failed:
    /// the upstream's own 429 or 5xx, a timeout, a refused connection, or
    /// a per-model rate rule; never after the gateway's refusal of the
    /// account or key (account-wide or free-model 429, 402, a failed
    /// store's 503). See [`Fallback`](super::Fallback).
    pub fallbacks: HashMap<String, Vec<String>>,
    /// Authenticated requests the gateway works on at once, streams
    /// included until they end; past it a request is answered 503 at once
    /// with `Retry-After`. A place is taken once the key is known good, so
    /// requests without one never hold a place. Absent:
    /// [`InFlightLimitLayer::default_max_in_flight`](crate::in_flight::InFlightLimitLayer::default_max_in_flight)
    /// (256 per core).
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
    /// Outbound e-mail: a leaked key's owner is told, and alerts go out.
    /// Absent: no e-mail.
    pub email: Option<EmailSection>,
    /// Alerts to an account's owner (by `email`) and to `alerts.webhook`:
    /// a balance below each of `balance_below`, a key past each share of
    /// its limit in `key_limit_percent`, once per crossing across
    /// instances (see [`crate::alerts`]). Absent: none.
    pub alerts: Option<AlertsSection>,
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

/// `leak_scanning` in [`GatewayConfig`].
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeakScanningSection {
    /// The code host's public keys alerts are signed with, in the shape
    /// GitHub publishes them (`{"public_keys": [{"key_identifier", "key",
    /// "is_current"}]}`): `{"file": "/path"}` or a SecretRef. Read at
    /// start-up; never fetched at run time.
    #[serde(deserialize_with = "secret_spec")]
    pub public_keys: SecretSpec,
    /// A webhook told of every leaked key, signed with HMAC-SHA256.
    pub notify_webhook: Option<NotifyWebhookSection>,
}

/// `leak_scanning.notify_webhook` in [`GatewayConfig`].
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyWebhookSection {
    /// Where the event is posted (`http` or `https`); its path may hold
    /// a token, so it is never printed.
    pub url: Redacted<String>,
    /// The signing secret: `{"env": "VAR"}`, `{"file": "/path"}` or a
    /// SecretRef; at least 16 bytes.
    #[serde(deserialize_with = "secret_spec")]
    pub secret: SecretSpec,
}

/// `alerts` in [`GatewayConfig`].
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsSection {
    /// Balances, in credits (above 0), below which the owner is told;
    /// each crossing once, again after a top-up.
    pub balance_below: Vec<Value>,
    /// Shares of a key's limit, whole percentages from 1 to 100, at which
    /// the owner is told; each once per limit period, again after the
    /// limit's reset or change.
    pub key_limit_percent: Vec<Value>,
    /// A webhook told of every alert, signed as leak notices are.
    pub webhook: Option<NotifyWebhookSection>,
}

/// `email` in [`GatewayConfig`].
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailSection {
    /// The SMTP server as a URL (`smtp://host:25`, `smtp://host:587?tls=required`,
    /// `smtps://user:pass@host`): text when it holds no password, else
    /// `{"env": "VAR"}`, `{"file": "/path"}` or a SecretRef holding it.
    pub smtp: SmtpServer,
    /// The sender, such as `modelgate <keys@example.com>`.
    pub from: String,
}

/// `plugins` in [`GatewayConfig`]: `{"entries": {…}}`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginsSection {
    /// The plugin entries by name.
    pub entries: PluginEntries,
}

/// `plugins.entries` in [`GatewayConfig`].
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginEntries {
    /// The webhook routes, as [`WebhooksConfig::from_plugin_entry`] reads
    /// them: `{"enabled": bool, "config": {"routes": {…}, "limits": {…}}}`.
    #[serde(default, deserialize_with = "webhooks_entry")]
    pub webhooks: Option<WebhooksConfig>,
}

/// `email.smtp` in [`GatewayConfig`]: the SMTP server's URL, written in
/// the config or read from a secret at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SmtpServer {
    /// Written as text (it may still hold a user name): never printed.
    Url(Redacted<String>),
    /// `{"env": "VAR"}`, `{"file": "/path"}` or a SecretRef holding it.
    Secret(SecretSpec),
}

impl<'de> Deserialize<'de> for SmtpServer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(url) => Ok(SmtpServer::Url(Redacted(url))),
            reference => secret_ref_from_json(&reference)
                .map(SmtpServer::Secret)
                .map_err(|problem| {
                    serde::de::Error::custom(format!(
                        "expected an smtp:// or smtps:// URL, or where to read it: {problem}"
                    ))
                }),
        }
    }
}

/// A secret's place: `{"env"}`, `{"file"}` or a SecretRef, never inline.
fn secret_spec<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SecretSpec, D::Error> {
    let value = Value::deserialize(deserializer)?;
    secret_ref_from_json(&value).map_err(serde::de::Error::custom)
}

fn optional_secret_spec<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<SecretSpec>, D::Error> {
    match Option::<Value>::deserialize(deserializer)? {
        None => Ok(None),
        Some(value) => secret_ref_from_json(&value)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

fn webhooks_entry<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<WebhooksConfig>, D::Error> {
    let entry = Value::deserialize(deserializer)?;
    WebhooksConfig::from_plugin_entry(&entry)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// One provider in [`GatewayConfig`]`.providers`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSection {
    /// Its base URL, API version included (`https://api.openai.com/v1`).
    pub base_url: String,
    /// Where its API key comes from: `{"env": "VAR"}`, `{"file": "/path"}`
    /// (the whole file, trimmed) or a SecretRef `{"source": "env"|"file"|"exec",
    /// "provider", "id"}` naming a provider of `secrets.providers`, as the
    /// webhook routes take it. A key that cannot be read stops start-up.
    #[serde(default, deserialize_with = "optional_secret_spec")]
    pub api_key: Option<SecretSpec>,
    /// Extra headers it receives with every request (`OpenAI-Organization`, …).
    /// Their values may be credentials: never printed.
    #[serde(default)]
    pub headers: HashMap<String, Redacted<String>>,
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

/// What a provider calls a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelPrefix {
    /// `openai/gpt-4o` reaches the provider as `gpt-4o`.
    Strip,
    /// `openai/gpt-4o` reaches the provider as `openai/gpt-4o`.
    Keep,
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

impl GenerationsSection {
    /// The settings: the config was checked when read
    /// ([`GatewayConfig::validate`]).
    pub(crate) fn settings(&self, ranking: AppRanking) -> Generations {
        let mut generations = Generations::new().app_ranking(ranking);
        if let Some(days) = self.retention_days {
            generations = generations.retention(Duration::from_secs(days * 86_400));
        }
        if let Some(most) = self.max_per_account {
            generations = generations.max_per_account(most);
        }
        generations
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(days) = self
            .retention_days
            .filter(|days| !(1..=3650).contains(days))
        {
            return Err(ConfigError::new(format!(
                "generations.retention_days must be from 1 to 3650, not {days}"
            )));
        }
        if self.max_per_account == Some(0) {
            return Err(ConfigError::new(
                "generations.max_per_account must be at least 1",
            ));
        }
        Ok(())
    }
}

/// Why a configuration was refused: where in the document, and what is
/// wrong or expected there.
#[derive(Debug, thiserror::Error)]
#[error("config: {0}")]
pub struct ConfigError(String);

impl ConfigError {
    pub(super) fn new(message: impl std::fmt::Display) -> Self {
        ConfigError(message.to_string())
    }

    /// `message` about the value at `path` (`pricing.models["a/b"]`). A
    /// message that starts with its own place (`credit.byok is …`,
    /// `models["a/b"].prompt_per_million must …`) is joined to the path
    /// rather than repeated after it.
    fn at(path: &str, message: impl std::fmt::Display) -> Self {
        let message = message.to_string();
        if path.is_empty() || message.starts_with(path) {
            return ConfigError(message);
        }
        let word = message
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(message.len());
        let placed = message.starts_with(|c: char| c.is_ascii_alphabetic())
            && matches!(message[word..].chars().next(), Some('.' | '['));
        if placed {
            ConfigError(format!("{path}.{message}"))
        } else {
            ConfigError(format!("{path}: {message}"))
        }
    }
}

/// `path` as a config writes it: `providers.openai.headers`, and keys that
/// are not plain names quoted, `pricing.models["openai/gpt-4o"]`.
fn written_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut written = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => written.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                let plain = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !plain {
                    written.push_str(&format!("[{key:?}]"));
                    continue;
                }
                if !written.is_empty() {
                    written.push('.');
                }
                written.push_str(key);
            }
            Segment::Unknown => written.push_str(".?"),
        }
    }
    written
}

impl GatewayConfig {
    /// Reads a JSON configuration and checks it all: unknown fields, and
    /// values any layer would refuse, are errors naming their path.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let config: GatewayConfig = serde_path_to_error::deserialize(&mut deserializer)
            .map_err(|error| ConfigError::at(&written_path(error.path()), error.inner()))?;
        deserializer.end().map_err(ConfigError::new)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what the sections' own types cannot: each value against what
    /// its layer accepts, and the sections against each other (a fallback's
    /// provider and price, a BYOK provider's key, the secrets providers a
    /// reference names). [`from_json`](Self::from_json) calls it; so does
    /// [`build_gateway`](super::build_gateway), for a config built in code.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(base_url) = &self.upstream.base_url {
            UpstreamConfig::new(base_url.clone())
                .check()
                .map_err(|error| ConfigError::at("upstream.base_url", error))?;
        }
        let rate_rules = self.rate_rules();
        rate_rules
            .validate()
            .map_err(|error| ConfigError::at("rate_limits", error))?;
        self.free_quota
            .validate()
            .map_err(|error| ConfigError::at("free_quota", error))?;
        self.retry_policy()?;
        if let Some(webhooks) = self.webhooks() {
            webhooks
                .check()
                .map_err(|error| ConfigError::at("plugins.entries.webhooks", error))?;
        }
        for (name, section) in &self.providers {
            self.validate_provider(name, section)?;
        }
        let providers = (!self.providers.is_empty())
            .then(|| self.providers.keys().cloned().collect::<HashSet<String>>());
        ModelCatalog::new(
            Arc::new(self.price_table()),
            providers,
            &self.fallbacks,
            &rate_rules,
            &self.free_quota,
        )
        .map_err(|error| ConfigError::at("fallbacks", error))?;
        if self.max_in_flight == Some(0) {
            return Err(ConfigError::new("max_in_flight must be at least 1"));
        }
        self.unauthenticated
            .validate()
            .map_err(|error| ConfigError::at("unauthenticated", error))?;
        self.auth_failures
            .validate()
            .map_err(|error| ConfigError::at("auth_failures", error))?;
        TrustedProxies::parse(&self.trusted_proxies)
            .map_err(|error| ConfigError::at("trusted_proxies", error))?;
        if let Some(section) = &self.leak_scanning {
            self.check_reference("leak_scanning.public_keys", &section.public_keys)?;
            if let Some(webhook) = &section.notify_webhook {
                WebhookSettings::check_url(webhook.url.expose())
                    .map_err(|error| ConfigError::at("leak_scanning.notify_webhook", error))?;
                self.check_reference("leak_scanning.notify_webhook.secret", &webhook.secret)?;
            }
        }
        if let Some(section) = &self.email {
            match &section.smtp {
                SmtpServer::Url(url) => {
                    EmailSettings::new(url.expose(), &section.from)
                        .map_err(|error| ConfigError::at("email", error))?;
                }
                SmtpServer::Secret(reference) => {
                    self.check_reference("email.smtp", reference)?;
                    EmailSettings::check_sender(&section.from)
                        .map_err(|error| ConfigError::at("email", error))?;
                }
            }
        }
        if let Some(section) = &self.alerts {
            let rules = AlertRules::from_json(&section.balance_below, &section.key_limit_percent)
                .map_err(|error| ConfigError::at("alerts", error))?;
            if rules.is_empty() {
                return Err(ConfigError::new(
                    "alerts: names no threshold; set balance_below or key_limit_percent",
                ));
            }
            if let Some(webhook) = &section.webhook {
                WebhookSettings::check_url(webhook.url.expose())
                    .map_err(|error| ConfigError::at("alerts.webhook", error))?;
                self.check_reference("alerts.webhook.secret", &webhook.secret)?;
            } else if self.email.is_none() {
                return Err(ConfigError::new(
                    "alerts: nothing to send them with; set the email section or alerts.webhook",
                ));
            }
        }
        self.generations.validate()?;
        if self.oauth.max_pending_codes_per_account == Some(0) {
            return Err(ConfigError::new(
                "oauth.max_pending_codes_per_account must be at least 1",
            ));
        }
        self.management_rate_rule()?;
        Ok(())
    }

    fn validate_provider(&self, name: &str, section: &ProviderSection) -> Result<(), ConfigError> {
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
        if let Some(key) = &section.api_key {
            self.check_reference(&format!("providers.{name}.api_key"), key)?;
        }
        section
            .upstream_config(None)
            .check()
            .map_err(|error| ConfigError::at(&format!("providers.{name}"), error))
    }

    /// A reference to a secrets provider names one this config declares,
    /// of the reference's source; a file or an inline text needs nothing.
    fn check_reference(&self, field: &str, spec: &SecretSpec) -> Result<(), ConfigError> {
        match spec {
            SecretSpec::Ref(reference) => reference
                .provider_in(&self.secrets)
                .map(drop)
                .map_err(|error| ConfigError::at(field, error)),
            SecretSpec::Inline(_) | SecretSpec::File(_) => Ok(()),
        }
    }

    /// Whether the config enables the webhooks plugin.
    pub fn webhooks_enabled(&self) -> bool {
        self.webhooks().is_some_and(|webhooks| webhooks.enabled)
    }

    /// The webhooks plugin entry; `None` when there is none.
    pub fn webhooks(&self) -> Option<&WebhooksConfig> {
        self.plugins.as_ref()?.entries.webhooks.as_ref()
    }

    /// The upstream client's settings; `base_url` overrides the config's.
    pub fn upstream_config(&self, base_url: Option<&str>) -> Result<UpstreamConfig, ConfigError> {
        let base_url = base_url
            .map(str::to_owned)
            .or_else(|| self.upstream.base_url.clone())
            .ok_or_else(|| ConfigError::new("upstream.base_url is missing"))?;
        let mut config = UpstreamConfig::new(base_url);
        if let Some(variable) = &self.upstream.api_key_env {
            let key = std::env::var(variable).map_err(|_| {
                ConfigError::new(format!(
                    "upstream.api_key_env names {variable}, which is not set"
                ))
            })?;
            config.api_key = Some(Redacted(key));
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
            // Also when called on a config built in code: a BYOK provider
            // without its own key would make the gateway's access unpaid.
            self.validate_provider(name, section)?;
            let api_key = section
                .api_key
                .as_ref()
                .map(|key| self.read_secret(&format!("providers.{name}.api_key"), key))
                .transpose()?;
            let config = section.upstream_config(api_key.as_ref());
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
        let webhook = match self
            .leak_scanning
            .as_ref()
            .and_then(|section| section.notify_webhook.as_ref())
        {
            None => None,
            Some(section) => Some(self.notify_webhook("leak_scanning.notify_webhook", section)?),
        };
        Ok(Notifier::new(self.email_settings()?, webhook))
    }

    /// The alert rules and who is told of alerts (the owner by e-mail and
    /// `alerts.webhook`); `None` without an `alerts` section.
    pub fn alerts(&self) -> Result<Option<(AlertRules, Notifier)>, ConfigError> {
        let Some(section) = &self.alerts else {
            return Ok(None);
        };
        let rules = AlertRules::from_json(&section.balance_below, &section.key_limit_percent)
            .map_err(|error| ConfigError::at("alerts", error))?;
        let webhook = match &section.webhook {
            None => None,
            Some(webhook) => Some(self.notify_webhook("alerts.webhook", webhook)?),
        };
        Ok(Some((
            rules,
            Notifier::new(self.email_settings()?, webhook),
        )))
    }

    /// A notice webhook's settings, its secret read now; errors name `field`.
    fn notify_webhook(
        &self,
        field: &str,
        section: &NotifyWebhookSection,
    ) -> Result<WebhookSettings, ConfigError> {
        let secret = self.read_secret(&format!("{field}.secret"), &section.secret)?;
        WebhookSettings::new(section.url.expose(), secret)
            .map_err(|error| ConfigError::new(format!("{field}: {error}")))
    }

    /// The `email` section's settings, its SMTP URL read now.
    fn email_settings(&self) -> Result<Option<EmailSettings>, ConfigError> {
        let email = match &self.email {
            None => None,
            Some(section) => {
                let url = match &section.smtp {
                    SmtpServer::Url(url) => url.expose().clone(),
                    SmtpServer::Secret(reference) => self
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
        Ok(email)
    }

    /// `pricing`, or [`DEMO_PRICING`].
    pub(crate) fn price_table(&self) -> PriceTable {
        match &self.pricing {
            Some(pricing) => pricing.clone(),
            None => PriceTable::from_json(DEMO_PRICING).expect("the demo prices are valid"),
        }
    }

    /// `rate_limits`, or [`DEMO_RATE_LIMITS`].
    pub(crate) fn rate_rules(&self) -> RateLimitRules {
        match &self.rate_limits {
            Some(rules) => rules.clone(),
            None => RateLimitRules::from_json(DEMO_RATE_LIMITS).expect("the demo rules are valid"),
        }
    }

    /// `management_rate`, checked as an account rule is; the default when
    /// absent.
    pub(crate) fn management_rate_rule(&self) -> Result<RateRule, ConfigError> {
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

    pub(crate) fn retry_policy(&self) -> Result<RetryPolicy, ConfigError> {
        let policy = RetryPolicy::new(
            self.retry
                .max_attempts
                .unwrap_or(RetryPolicy::DEFAULT_ATTEMPTS),
        )
        .map_err(|error| ConfigError::at("retry.max_attempts", error))?;
        Ok(match self.retry.max_wait_ms {
            Some(ms) => policy.max_wait(Duration::from_millis(ms)),
            None => policy,
        })
    }

    /// The secret `spec` names, read now; errors name `field`.
    fn read_secret(&self, field: &str, spec: &SecretSpec) -> Result<Secret, ConfigError> {
        resolve_secret(spec, &self.secrets, &ResolveLimits::default())
            .map_err(|error| ConfigError::new(format!("{field}: {error}")))
    }
}

impl ProviderSection {
    /// The provider's upstream settings, with `api_key` once it is read.
    fn upstream_config(&self, api_key: Option<&Secret>) -> UpstreamConfig {
        let mut config = UpstreamConfig::new(self.base_url.clone());
        config.api_key = api_key.map(|key| Redacted(key.expose().to_owned()));
        config.extra_headers = self
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        config.credential_headers = self.credential_headers.clone();
        if let Some(ms) = self.connect_timeout_ms {
            config.connect_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = self.response_header_timeout_ms {
            config.response_header_timeout = Duration::from_millis(ms);
        }
        config
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{ByokProviders, SharedStore};
    use crate::proxy::Providers;
    use proptest::prelude::*;
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
    fn byok_without_an_api_key_is_refused_at_load_naming_the_field() {
        let refused = |providers: Value| {
            GatewayConfig::from_json(&serde_json::json!({ "providers": providers }).to_string())
                .expect_err("refused")
                .to_string()
        };
        for section in [
            // Trusted by its network.
            serde_json::json!({"base_url": "http://127.0.0.1:9/v1", "byok": true}),
            // Its credential is a configured header, not the one an
            // account's key replaces.
            serde_json::json!({"base_url": "http://127.0.0.1:9/v1", "byok": true,
                               "headers": {"x-api-key": "gateway-x"}}),
        ] {
            let error = refused(serde_json::json!({ "local": section }));
            assert!(
                error.starts_with("config: providers.local.byok needs providers.local.api_key"),
                "{error}"
            );
            assert!(!error.contains("gateway-x"), "{error}");
        }
        let error = refused(serde_json::json!({"p": {
            "base_url": "http://127.0.0.1:9/v1",
            "headers": {"x-goog-api-key": "gateway-g"},
            "credential_headers": ["x-goog-apikey"]}}));
        assert_eq!(
            error,
            "config: providers.p: upstream: credential_headers names x-goog-apikey, which is not one of the configured headers"
        );
        for bad in [r#""byok": "yes""#, r#""credential_headers": "x-api-key""#] {
            let text = format!(r#"{{"providers": {{"p": {{"base_url": "http://x/v1", {bad}}}}}}}"#);
            let error = GatewayConfig::from_json(&text).unwrap_err().to_string();
            assert!(error.starts_with("config: providers.p."), "{text}: {error}");
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
            let text = serde_json::json!({"providers": {"p": section}}).to_string();
            match GatewayConfig::from_json(&text) {
                Ok(config) => {
                    // Accepted at load: building fails for nothing in the text.
                    let upstreams = config.provider_upstreams().unwrap();
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
        let refused = |api_key: Value| {
            GatewayConfig::from_json(
                &serde_json::json!({
                    "secrets": {"providers": {"vault": {"source": "file", "path": keys, "mode": "json"}}},
                    "providers": {"openai": {"base_url": "http://127.0.0.1:9/v1", "api_key": api_key}}
                })
                .to_string(),
            )
            .expect_err("a reference to no declared provider is refused at load")
            .to_string()
        };
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
            let error = refused(api_key.clone());
            assert!(
                error.starts_with("config: providers.openai.api_key: "),
                "{error}"
            );
            for word in words {
                assert!(error.contains(word), "{api_key}: {word:?} missing: {error}");
            }
        }
        // What only the outside decides still stops start-up: a key missing
        // from the vault.
        let missing =
            config(serde_json::json!({"source": "file", "provider": "vault", "id": "/anthropic"}));
        let error = missing
            .provider_upstreams()
            .expect_err("no such key")
            .to_string();
        assert!(
            error.starts_with("config: providers.openai.api_key: "),
            "{error}"
        );
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
    fn generations_settings_are_checked_at_load() {
        let store: SharedStore = Arc::new(crate::store::MemoryStore::new());
        let settings = |json: &str| {
            GatewayConfig::from_json(json)
                .unwrap()
                .generations
                .settings(AppRanking::new(Arc::clone(&store)))
        };
        let kept = settings(r#"{"generations": {"retention_days": 7, "max_per_account": 10}}"#);
        assert_eq!(kept.retention, Duration::from_secs(7 * 86_400));
        assert_eq!(kept.max_per_account, 10);
        let default = settings("{}");
        assert_eq!(default.retention, crate::usage::DEFAULT_RETENTION);
        for (json, words) in [
            (
                r#"{"generations": {"retention_days": 0}}"#,
                "config: generations.retention_days must be from 1 to 3650, not 0",
            ),
            (
                r#"{"generations": {"retention_days": 3651}}"#,
                "config: generations.retention_days must be from 1 to 3650, not 3651",
            ),
            (
                r#"{"generations": {"max_per_account": 0}}"#,
                "config: generations.max_per_account must be at least 1",
            ),
        ] {
            let error = GatewayConfig::from_json(json).unwrap_err().to_string();
            assert_eq!(error, words, "{json}");
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

    /// `config: <path>…` for `json`.
    fn refusal(json: &str) -> String {
        GatewayConfig::from_json(json).expect_err(json).to_string()
    }

    #[test]
    fn each_section_refuses_a_bad_value_naming_its_path_and_what_is_expected() {
        for (json, expected) in [
            (
                r#"{"pricing": {"models": {"openai/gpt-4o": {"prompt_per_million": -1, "completion_per_million": 1}}}}"#,
                r#"config: pricing.models["openai/gpt-4o"].prompt_per_million must be a number of credits from 0 to 1000000"#,
            ),
            (
                r#"{"pricing": {"models": {"openai/gpt-4o": {"prompt_per_million": "1", "completion_per_million": 1}}}}"#,
                r#"config: pricing.models["openai/gpt-4o"].prompt_per_million: invalid type: string "1", expected f64"#,
            ),
            (
                r#"{"pricing": {"default": {"prompt_per_million": 1, "completion_per_million": 1, "context_length": 0}}}"#,
                "config: pricing.default.context_length must be a whole number of tokens from 1 to 1000000000, not 0",
            ),
            (
                r#"{"pricing": {"free_models": ["a/b"]}}"#,
                r#"config: pricing: free_models: "a/b" is not a model id ending in :free (provider/model:free)"#,
            ),
            (
                r#"{"pricing": {"free_models": ["a/b:free", 5]}}"#,
                "config: pricing.free_models[1]: invalid type: integer `5`, expected a string",
            ),
            (
                r#"{"providers": {"openai": {"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-inline-0123456789"}}}"#,
                r#"config: providers.openai.api_key: must be {"env": "VAR"}, {"file": "/path"} or a SecretRef {source, provider, id}, not inline text"#,
            ),
            (
                r#"{"providers": {"openai": {"base_url": "ftp://127.0.0.1/v1"}}}"#,
                "config: providers.openai: upstream: ftp is not http or https",
            ),
            (
                r#"{"providers": {"open ai": {"base_url": "http://127.0.0.1:9/v1"}}}"#,
                r#"config: providers: "open ai" must be 1 to 64 characters of A-Z a-z 0-9 - _ ."#,
            ),
            (
                r#"{"providers": {"p": {"base_url": "http://127.0.0.1:9/v1", "headers": {"host": "x"}}}}"#,
                "config: providers.p: upstream: the header host is set by the gateway, not the config",
            ),
            (
                r#"{"upstream": {"base_url": "api.openai.com"}}"#,
                r#"config: upstream.base_url: upstream: "api.openai.com" needs a scheme and a host, such as https://api.openai.com/v1"#,
            ),
            (
                r#"{"fallbacks": {"openai/gpt-4o": ["gpt-4o-mini"]}}"#,
                r#"config: fallbacks.openai/gpt-4o: "gpt-4o-mini" is not a model id"#,
            ),
            (
                r#"{"retry": {"max_attempts": 9}}"#,
                "config: retry.max_attempts: ",
            ),
            (
                r#"{"email": {"smtp": "smtp://127.0.0.1:25", "from": "m <m@example.com>"}, "alerts": {"balance_below": [5, -1]}}"#,
                "config: alerts.balance_below[1]: must not be negative",
            ),
            (
                r#"{"email": {"smtp": "smtp://127.0.0.1:25", "from": "m <m@example.com>"}, "alerts": {"key_limit_percent": [80, 120]}}"#,
                "config: alerts.key_limit_percent[1]: must be a whole number from 1 to 100, not 120",
            ),
            (
                r#"{"email": {"smtp": "smtp://127.0.0.1:25", "from": "m <m@example.com>"}, "alerts": {}}"#,
                "config: alerts: names no threshold; set balance_below or key_limit_percent",
            ),
            (
                r#"{"alerts": {"balance_below": [5]}}"#,
                "config: alerts: nothing to send them with; set the email section or alerts.webhook",
            ),
            (
                r#"{"alerts": {"balance_below": [5], "webhook": {"url": "ftp://ops.example.com/h", "secret": {"env": "ALERT_SECRET"}}}}"#,
                "config: alerts.webhook: notify webhook_url: ftp is not http or https",
            ),
            (
                r#"{"alerts": {"balance_below": [5], "webhook": {"url": "https://ops.example.com/h", "secret": "0123456789abcdef0123"}}}"#,
                "config: alerts.webhook.secret: must be {\"env\": \"VAR\"}",
            ),
            (
                r#"{"alerts": {"balance_below": 5}}"#,
                "config: alerts.balance_below: invalid type",
            ),
            (r#"{"max_in_flight": 0}"#, "config: max_in_flight must be at least 1"),
            (
                r#"{"unauthenticated": {"max_in_flight": 0}}"#,
                "config: unauthenticated.max_in_flight must be at least 1",
            ),
            (
                r#"{"auth_failures": {"max_failures": 0}}"#,
                "config: auth_failures.max_failures must be at least 1",
            ),
            (
                r#"{"trusted_proxies": ["10.0.0.0/8", "proxy.local"]}"#,
                r#"config: trusted_proxies: "proxy.local" is neither an IP address nor a network such as 10.0.0.0/8"#,
            ),
            (
                r#"{"rate_limits": {"account": {"gcra": {"requests": 0, "period_seconds": 60, "burst": 1}}}}"#,
                "config: rate_limits",
            ),
            (
                r#"{"free_quota": {"requests_per_minute": 0}}"#,
                "config: free_quota",
            ),
            (
                r#"{"leak_scanning": {"public_keys": "-----BEGIN PUBLIC KEY-----"}}"#,
                "config: leak_scanning.public_keys: must be {\"env\": \"VAR\"}",
            ),
            (
                r#"{"leak_scanning": {"public_keys": {"file": "/k.json"}, "notify_webhook": {"url": "ftp://ops.example.com/h", "secret": {"env": "LEAK_SECRET"}}}}"#,
                "config: leak_scanning.notify_webhook: notify webhook_url: ftp is not http or https",
            ),
            (
                r#"{"leak_scanning": {"public_keys": {"file": "/k.json"}, "notify_webhook": {"url": "https://ops.example.com/h", "secret": "0123456789abcdef0123"}}}"#,
                "config: leak_scanning.notify_webhook.secret: must be {\"env\": \"VAR\"}",
            ),
            (
                r#"{"email": {"smtp": "smtp://user:pass@mail.example.com", "from": "keys@example.com"}}"#,
                "config: email: notify smtp_url: smtp://user@mail.example.com would send its password unencrypted",
            ),
            (
                r#"{"email": {"smtp": {"env": "SMTP_URL"}, "from": "not a mailbox"}}"#,
                r#"config: email: notify from: "not a mailbox" is not a mailbox"#,
            ),
            (
                r#"{"email": {"smtp": 25, "from": "keys@example.com"}}"#,
                "config: email.smtp: expected an smtp:// or smtps:// URL, or where to read it: must be",
            ),
            (
                r#"{"plugins": {}}"#,
                "config: plugins: missing field `entries`",
            ),
            (
                r#"{"plugins": {"entries": {"webhook": {}}}}"#,
                "config: plugins.entries.webhook: unknown field `webhook`, expected `webhooks`",
            ),
            (
                r#"{"plugins": {"entries": {"webhooks": {"enabled": true, "config": {"routes": {"x": {"sessionKey": "s", "secret": "short"}}}}}}}"#,
                "config: plugins.entries.webhooks: webhooks route `x`: `secret` must be at least 16 bytes",
            ),
            (
                r#"{"oauth": {"max_pending_codes_per_account": 0}}"#,
                "config: oauth.max_pending_codes_per_account must be at least 1",
            ),
            (
                r#"{"management_rate": {"gcra": {"requests": 0, "period_seconds": 60, "burst": 1}}}"#,
                "config: management_rate: ",
            ),
            (
                r#"{"credit": {"reservation_ttl_seconds": 1}}"#,
                "config: credit.reservation_ttl_seconds must be from 3 to",
            ),
            (
                r#"{"secrets": {"providers": {"v": {"source": "file", "path": "keys.json"}}}}"#,
                "config: secrets",
            ),
            (
                r#"{"sqlite": {"synchronous": "off"}}"#,
                "config: sqlite.synchronous: unknown variant `off`",
            ),
            (r#"{"upstream": {}} trailing"#, "config: trailing characters"),
        ] {
            let error = refusal(json);
            assert!(error.starts_with(expected), "{json}:\n  got {error}\n  not {expected}");
        }
    }

    #[test]
    fn a_config_accepted_at_load_builds_but_for_what_is_outside_it() {
        let config = GatewayConfig::from_json(
            r#"{"leak_scanning": {"public_keys": {"file": "/nonexistent/modelgate-keys.json"}},
                "email": {"smtp": {"env": "MODELGATE_UNIT_UNSET_SMTP"}, "from": "keys@example.com"}}"#,
        )
        .unwrap();
        let error = config.scanning_keys().unwrap_err().to_string();
        assert!(
            error.starts_with("config: leak_scanning.public_keys: "),
            "{error}"
        );
        let error = config.leak_notifier().unwrap_err().to_string();
        assert!(error.starts_with("config: email.smtp: "), "{error}");
        // A config built in code is checked as a read one is.
        let config = GatewayConfig {
            max_in_flight: Some(0),
            ..GatewayConfig::default()
        };
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "config: max_in_flight must be at least 1"
        );
        // Read straight from a config built in code, the providers are
        // checked all the same: a BYOK provider needs its own key.
        let config = GatewayConfig {
            providers: HashMap::from([(
                "internal".to_owned(),
                ProviderSection {
                    base_url: "http://10.0.0.7/v1".into(),
                    byok: true,
                    ..ProviderSection::default()
                },
            )]),
            ..GatewayConfig::default()
        };
        let error = config.provider_upstreams().unwrap_err().to_string();
        assert!(
            error.contains("providers.internal.byok needs providers.internal.api_key"),
            "{error}"
        );
        // And so are the webhook routes.
        let short = crate::webhook::RouteConfig {
            route_id: "deploys".into(),
            enabled: true,
            path: "/plugins/webhooks/deploys".into(),
            session_key: "s".into(),
            secret: SecretSpec::Inline(crate::secrets::Secret::new("short".to_owned())),
            controller_id: "webhooks/deploys".into(),
            description: None,
        };
        let config = GatewayConfig {
            plugins: Some(PluginsSection {
                entries: PluginEntries {
                    webhooks: Some(WebhooksConfig {
                        enabled: true,
                        routes: vec![short],
                        limits: Default::default(),
                    }),
                },
            }),
            ..GatewayConfig::default()
        };
        let error = config.validate().unwrap_err().to_string();
        assert!(
            error.contains("`secret` must be at least 16 bytes"),
            "{error}"
        );
    }

    /// The `pub` fields of `declaration` in this file.
    fn declared_fields(declaration: &str) -> Vec<&'static str> {
        let source = include_str!("config.rs");
        let body = &source[source.find(declaration).expect(declaration)..];
        let body = &body[..body.find("\n}").unwrap()];
        body.lines()
            .filter_map(|line| line.trim().strip_prefix("pub "))
            .filter_map(|field| field.split_once(':').map(|(name, _)| name))
            .collect()
    }

    #[test]
    fn debug_shows_every_field_and_no_secret() {
        let secrets = [
            "header-value-secret-3141",
            "smtp-password-secret-2718",
            "notify-url-token-secret-1618",
            "route-inline-secret-0123456789",
            "exec-argument-secret-1414",
        ];
        let text = serde_json::json!({
            "upstream": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "OPENAI_API_KEY",
                         "connect_timeout_ms": 1, "response_header_timeout_ms": 2},
            "pricing": {"models": {"openai/gpt-4o": {"prompt_per_million": 1, "completion_per_million": 2}}},
            "rate_limits": {"account": {"gcra": {"requests": 600, "period_seconds": 60, "burst": 60}}},
            "free_quota": {"requests_per_minute": 20, "requests_per_day": 50},
            "body": {"max_body_bytes": 4096, "read_timeout_ms": 1000},
            "retry": {"max_attempts": 2, "max_wait_ms": 10},
            "credit": {"default_max_tokens": 7, "reservation_ttl_seconds": 60},
            "secrets": {"providers": {"keyring": {"source": "exec", "command": "/usr/bin/keyring",
                                                  "args": ["--token", secrets[4]]}}},
            "plugins": {"entries": {"webhooks": {"enabled": true, "config": {"routes": {
                "deploys": {"sessionKey": "agent:main", "secret": secrets[3]}}}}}},
            "providers": {"openai": {"base_url": "http://127.0.0.1:9/v1",
                                     "api_key": {"source": "exec", "provider": "keyring", "id": "openai"},
                                     "headers": {"x-goog-api-key": secrets[0]},
                                     "credential_headers": ["x-goog-api-key"], "byok": true,
                                     "connect_timeout_ms": 1, "response_header_timeout_ms": 2,
                                     "model_prefix": "keep", "completion_bound_field": "max_completion_tokens"}},
            "fallbacks": {"openai/gpt-4o": ["openai/gpt-4o"]},
            "max_in_flight": 8,
            "unauthenticated": {"max_in_flight": 4},
            "auth_failures": {"max_failures": 3, "window_seconds": 60},
            "trusted_proxies": ["10.0.0.0/8"],
            "leak_scanning": {"public_keys": {"file": "/etc/modelgate/keys.json"},
                              "notify_webhook": {"url": format!("https://ops.example.com/hooks/{}", secrets[2]),
                                                 "secret": {"env": "LEAK_WEBHOOK_SECRET"}}},
            "email": {"smtp": format!("smtps://user:{}@mail.example.com", secrets[1]),
                      "from": "modelgate <keys@example.com>"},
            "alerts": {"balance_below": [5], "key_limit_percent": [80],
                       "webhook": {"url": format!("https://ops.example.com/alerts/{}", secrets[2]),
                                   "secret": {"env": "ALERT_WEBHOOK_SECRET"}}},
            "generations": {"retention_days": 30, "max_per_account": 10, "public_ranking": true},
            "oauth": {"allow_plain_pkce": true, "max_pending_codes_per_account": 5},
            "management_rate": {"gcra": {"requests": 60, "period_seconds": 60, "burst": 6}},
            "shutdown_grace_seconds": 3,
            "sqlite": {"synchronous": "full"}
        })
        .to_string();
        let config = GatewayConfig::from_json(&text).unwrap();
        let shown = format!("{config:?}");
        for secret in secrets {
            assert!(!shown.contains(secret), "{secret} shown: {shown}");
        }
        for declaration in [
            "pub struct GatewayConfig {",
            "pub struct UpstreamSection {",
            "pub struct BodySection {",
            "pub struct RetrySection {",
            "pub struct CreditSection {",
            "pub struct ProviderSection {",
            "pub struct GenerationsSection {",
            "pub struct OAuthSection {",
            "pub struct LeakScanningSection {",
            "pub struct NotifyWebhookSection {",
            "pub struct EmailSection {",
            "pub struct AlertsSection {",
            "pub struct PluginsSection {",
            "pub struct PluginEntries {",
            "pub struct SqliteSection {",
        ] {
            let fields = declared_fields(declaration);
            assert!(!fields.is_empty(), "{declaration}");
            for field in fields {
                assert!(
                    shown.contains(&format!("{field}: ")),
                    "{declaration} {field} not shown: {shown}"
                );
            }
        }
    }

    #[test]
    fn redacted_prints_nothing_of_its_value_and_reads_as_the_value() {
        let header: Redacted<String> = serde_json::from_str(r#""sk-secret""#).unwrap();
        assert_eq!(header.expose(), "sk-secret");
        assert_eq!(format!("{header:?}"), "[redacted]");
    }

    /// JSON shaped like a config: its section and field names, and values
    /// of every kind.
    fn config_like_json() -> impl Strategy<Value = Value> {
        let names: Vec<&'static str> = [
            "upstream",
            "pricing",
            "rate_limits",
            "free_quota",
            "body",
            "retry",
            "credit",
            "secrets",
            "plugins",
            "providers",
            "fallbacks",
            "max_in_flight",
            "unauthenticated",
            "auth_failures",
            "trusted_proxies",
            "leak_scanning",
            "email",
            "alerts",
            "balance_below",
            "key_limit_percent",
            "webhook",
            "generations",
            "oauth",
            "management_rate",
            "shutdown_grace_seconds",
            "sqlite",
            "models",
            "default",
            "free_models",
            "prompt_per_million",
            "completion_per_million",
            "base_url",
            "api_key",
            "headers",
            "byok",
            "entries",
            "webhooks",
            "enabled",
            "config",
            "routes",
            "smtp",
            "from",
            "public_keys",
            "notify_webhook",
            "url",
            "secret",
            "env",
            "file",
            "source",
            "provider",
            "id",
            "retention_days",
            "max_attempts",
            "openai/gpt-4o",
        ]
        .to_vec();
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "[a-zA-Z0-9/:._ -]{0,24}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, move |inner| {
            let key = prop_oneof![
                proptest::sample::select(names.clone()).prop_map(str::to_owned),
                "[a-z_]{1,8}"
            ];
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map(key, inner, 0..6)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn any_json_is_a_config_or_an_error_naming_where_never_a_panic(value in config_like_json()) {
            match GatewayConfig::from_json(&value.to_string()) {
                Ok(config) => prop_assert!(config.validate().is_ok()),
                Err(error) => prop_assert!(error.to_string().starts_with("config: ")),
            }
        }

        #[test]
        fn any_text_is_a_config_or_an_error_never_a_panic(text in "\\PC{0,200}") {
            let _ = GatewayConfig::from_json(&text);
        }
    }
}
