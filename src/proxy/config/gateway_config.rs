//! [`GatewayConfig`]: the whole document, its sections, and the checks
//! that run when it is read.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::error::written_path;
use super::{
    AlertsSection, BodySection, ConfigError, CreditSection, EmailSection, GenerationsSection,
    LeakScanningSection, ModelPrefix, NotifyWebhookSection, OAuthSection, PluginsSection,
    ProviderSection, RetrySection, SmtpServer, SqliteSection, UpstreamSection, DEMO_PRICING,
    DEMO_RATE_LIMITS,
};
use crate::alerts::AlertRules;
use crate::auth::AuthFailureLimit;
use crate::client_addr::TrustedProxies;
use crate::credit::PriceTable;
use crate::free_quota::FreeQuotaRules;
use crate::in_flight::UnauthenticatedLimits;
use crate::leaks::ScanningKeys;
use crate::notify::{EmailSettings, Notifier, WebhookSettings};
use crate::proxy::{ModelCatalog, ProviderUpstream, RetryPolicy, Upstream, UpstreamConfig};
use crate::rate_limit::{RateLimitRules, RateRule};
use crate::secrets::{
    resolve_secret, Redacted, ResolveLimits, Secret, SecretProviders, SecretSpec,
};
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
    /// [`build_gateway`](crate::proxy::build_gateway), for a config built in code.
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
