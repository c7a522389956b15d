//! [`GatewayConfig`]: the whole document, its sections, and the checks
//! that run when it is read.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Deserialize;

use super::error::written_path;
use super::plan::CheckedConfig;
use super::{
    AlertsSection, BodySection, ConfigError, CreditSection, DEMO_PRICING, DEMO_RATE_LIMITS,
    EmailSection, GenerationsSection, LeakScanningSection, OAuthSection, PluginsSection,
    ProviderSection, RetrySection, SqliteSection, UpstreamSection,
};
use crate::auth::AuthFailureLimit;
use crate::credit::PriceTable;
use crate::free_quota::FreeQuotaRules;
use crate::in_flight::UnauthenticatedLimits;
use crate::proxy::UpstreamConfig;
use crate::rate_limit::{RateLimitRules, RateRule};
use crate::secrets::SecretProviders;
use crate::webhook::WebhooksConfig;

/// The gateway's configuration, as a JSON document; every section is
/// optional. A gateway is built from its [`GatewayPlan`](super::GatewayPlan), made once the
/// config is read.
///
/// ```json
/// {
///   "upstream": {"base_url": "https://api.openai.com/v1", "api_key_env": "OPENAI_API_KEY",
///                "connect_timeout_ms": 10000, "response_header_timeout_ms": 600000,
///                "late_answer_seconds": 600, "max_late_answers": 1024},
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
///   "default_provider": "openai",
///   "model_aliases": {"claude-*": "anthropic/", "sonnet": "anthropic/claude-sonnet-4.5"},
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
    /// The provider of a bare model id (`gpt-4o-mini` is then
    /// `<default_provider>/gpt-4o-mini`) that no alias names. Absent: a bare
    /// id is refused, unless an alias names it. See
    /// [`ModelNames`](crate::body::ModelNames).
    pub default_provider: Option<String>,
    /// Bare ids a request's `model` (and `models`) may name, by name: an
    /// exact alias to a model id (`"claude-opus-4-8":
    /// "anthropic/claude-opus-4-8"`), or a prefix pattern to a provider
    /// (`"claude-*": "anthropic/"`, the id appended). An exact alias
    /// first, then the longest pattern, then `default_provider`. The model
    /// chosen is what is priced, limited, recorded and sent to the
    /// provider; an id with a `/` always means itself.
    pub model_aliases: BTreeMap<String, String>,
    /// Per model id, the models to try after it, after any the request
    /// lists in `models`. The next is tried only when this model failed:
    /// the upstream's own 429 or 5xx, a timeout, a refused connection, or
    /// a per-model rate rule; never after the gateway's refusal of the
    /// account or key (account-wide or free-model 429, 402, a failed
    /// store's 503). See [`Fallback`](crate::proxy::Fallback).
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
    /// The rate of each account's calls to the key routes (every request of
    /// its management keys, and of its inference keys to the usage routes;
    /// the operator's key is not counted), as a rate rule (`{"gcra": {…}}` or `{"rolling": {…}}`).
    /// Absent: 600 a minute, in bursts of 60.
    pub management_rate: Option<RateRule>,
    /// After SIGTERM, how long the requests in flight may take to end
    /// before the gateway ends the responses still open, each charged for
    /// what it used; then, how long it waits at most for their settlements
    /// to reach the store (each is retried for 2 minutes,
    /// [`SETTLEMENT_RETRY_WINDOW`](crate::store::SETTLEMENT_RETRY_WINDOW)).
    /// Absent: [`DEFAULT_SHUTDOWN_GRACE`] (30 s).
    pub shutdown_grace_seconds: Option<u64>,
    /// How a SQLite store (`--store sqlite:PATH`, the proxy's default)
    /// commits.
    pub sqlite: SqliteSection,
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

    /// Checks what the sections' own types cannot, reading nothing outside
    /// the config: each value against what its layer accepts, and the
    /// sections against each other (a fallback's provider and price, a BYOK
    /// provider's key, the secrets providers a reference names).
    /// [`from_json`](Self::from_json) calls it; [`GatewayPlan::new`](super::GatewayPlan::new) makes
    /// the same checks, so a config built in code reaches a gateway only
    /// checked.
    pub fn validate(&self) -> Result<(), ConfigError> {
        CheckedConfig::new(self).map(drop)
    }

    /// Whether the config enables the webhooks plugin.
    pub fn webhooks_enabled(&self) -> bool {
        self.webhooks().is_some_and(|webhooks| webhooks.enabled)
    }

    /// The webhooks plugin entry; `None` when there is none.
    pub fn webhooks(&self) -> Option<&WebhooksConfig> {
        self.plugins.as_ref()?.entries.webhooks.as_ref()
    }

    /// The upstream client's settings, its key read from the environment
    /// now; `base_url` overrides the config's.
    pub fn upstream_config(&self, base_url: Option<&str>) -> Result<UpstreamConfig, ConfigError> {
        self.upstream.upstream_config(base_url)
    }

    /// `pricing`, or [`DEMO_PRICING`].
    pub(super) fn price_table(&self) -> PriceTable {
        match &self.pricing {
            Some(pricing) => pricing.clone(),
            None => PriceTable::from_json(DEMO_PRICING).expect("the demo prices are valid"),
        }
    }

    /// `rate_limits`, or [`DEMO_RATE_LIMITS`].
    pub(super) fn rate_rules(&self) -> RateLimitRules {
        match &self.rate_limits {
            Some(rules) => rules.clone(),
            None => RateLimitRules::from_json(DEMO_RATE_LIMITS).expect("the demo rules are valid"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shutdown_grace_is_read_and_defaults_to_30_seconds() {
        let config = GatewayConfig::from_json(r#"{"shutdown_grace_seconds": 2}"#).unwrap();
        assert_eq!(config.shutdown_grace(), Duration::from_secs(2));
        let config = GatewayConfig::from_json("{}").unwrap();
        assert_eq!(config.shutdown_grace(), Duration::from_secs(30));
        assert!(GatewayConfig::from_json(r#"{"shutdown_grace_seconds": -1}"#).is_err());
    }
}
