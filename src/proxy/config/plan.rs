//! [`GatewayPlan`]: a [`GatewayConfig`] checked once, its values parsed into
//! what the layers take, and what it names outside itself read, so that
//! building a gateway from it is wiring that cannot fail.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{ConfigError, GatewayConfig};
use crate::alerts::AlertRules;
use crate::auth::AuthFailureLimit;
use crate::body::ModelNames;
use crate::client_addr::TrustedProxies;
use crate::clock::Clock;
use crate::credit::{BoundField, PriceTable};
use crate::free_quota::FreeQuotaRules;
use crate::in_flight::{InFlightLimitLayer, UnauthenticatedLimits};
use crate::leaks::ScanningKeys;
use crate::notify::{EmailSettings, Notifier, WebhookSettings};
use crate::oauth::PlainPkce;
use crate::proxy::{ModelCatalog, ProviderUpstream, RetryPolicy};
use crate::rate_limit::{RateLimitRules, RateRule};
use crate::secrets::ResolveLimits;
use crate::usage::Generations;
use crate::webhook::{WebhookLimits, WebhookRoute, resolve_routes};

/// A gateway's configuration made ready to build from, once, at load: the
/// config checked (the same checks and errors as
/// [`GatewayConfig::from_json`]), each value parsed into the type its layer
/// takes, and what the config names outside itself read (the secrets, the
/// secret-scanning public keys, a client per provider).
///
/// It is what [`build_gateway`](crate::proxy::build_gateway) takes, and the
/// only way to make one is [`GatewayPlan::new`]: a config built in code
/// reaches a gateway only checked, and building one cannot fail. One plan
/// builds any number of gateways (instances sharing a store); they share
/// its provider clients.
///
/// ```
/// use modelgate::proxy::{GatewayConfig, GatewayPlan};
///
/// let config = GatewayConfig {
///     max_in_flight: Some(0),
///     ..GatewayConfig::default()
/// };
/// let error = GatewayPlan::new(&config).unwrap_err();
/// assert_eq!(error.to_string(), "config: max_in_flight must be at least 1");
/// ```
#[derive(Clone, Debug)]
pub struct GatewayPlan {
    /// The config's own values, checked.
    pub(in crate::proxy) checked: CheckedConfig,
    /// What the config names outside itself, read.
    pub(in crate::proxy) loaded: Loaded,
}

impl GatewayPlan {
    /// Checks `config` and reads what it names outside itself. Fails for
    /// what [`GatewayConfig::validate`] refuses, then for what only the
    /// outside decides (a secret that cannot be read, a public-keys file
    /// that is missing), each error naming the config's field.
    pub fn new(config: &GatewayConfig) -> Result<Self, ConfigError> {
        let checked = CheckedConfig::new(config)?;
        let loaded = Loaded::read(config)?;
        Ok(GatewayPlan { checked, loaded })
    }
}

/// The config's values as the layers take them, each checked: all of a
/// plan that reads nothing outside the config.
#[derive(Clone, Debug)]
pub(in crate::proxy) struct CheckedConfig {
    /// `rate_limits`, or the demo's.
    pub(in crate::proxy) rate_rules: RateLimitRules,
    pub(in crate::proxy) free_quota: FreeQuotaRules,
    pub(in crate::proxy) retry: RetryPolicy,
    /// The webhook routes' limits; `None` without a webhooks entry.
    pub(in crate::proxy) webhook_limits: Option<WebhookLimits>,
    /// `pricing`, or the demo's.
    pub(in crate::proxy) prices: Arc<PriceTable>,
    /// The models served, their fallbacks and `GET /api/v1/models`.
    pub(in crate::proxy) catalog: Arc<ModelCatalog>,
    /// Per provider, the field its completion bound is written in, where
    /// the config names one.
    pub(in crate::proxy) completion_bound_fields: Vec<(String, BoundField)>,
    pub(in crate::proxy) max_in_flight: usize,
    /// BearerAuth's lookups of keys not known live at once.
    pub(in crate::proxy) max_concurrent_key_lookups: usize,
    pub(in crate::proxy) unauthenticated: UnauthenticatedLimits,
    pub(in crate::proxy) auth_failures: AuthFailureLimit,
    pub(in crate::proxy) trusted_proxies: TrustedProxies,
    /// With an `alerts` section.
    pub(in crate::proxy) alert_rules: Option<AlertRules>,
    /// CreditGuard's records, without the app ranking (the gateway's own).
    pub(in crate::proxy) generations: Generations,
    pub(in crate::proxy) public_ranking: bool,
    pub(in crate::proxy) plain_pkce: PlainPkce,
    pub(in crate::proxy) max_pending_codes_per_account: u64,
    pub(in crate::proxy) management_rate: RateRule,
    pub(in crate::proxy) max_body_bytes: usize,
    /// `default_provider` and `model_aliases`.
    pub(in crate::proxy) model_names: ModelNames,
    pub(in crate::proxy) body_read_timeout: Duration,
    pub(in crate::proxy) default_max_tokens: Option<u64>,
    pub(in crate::proxy) reservation_ttl: Option<Duration>,
}

impl CheckedConfig {
    /// Checks `config` in the order of its errors' precedence: the first
    /// refusal is the one reported.
    pub(super) fn new(config: &GatewayConfig) -> Result<Self, ConfigError> {
        config.upstream.check()?;
        let rate_rules = config.rate_rules();
        rate_rules
            .validate()
            .map_err(|error| ConfigError::at("rate_limits", error))?;
        config
            .free_quota
            .validate()
            .map_err(|error| ConfigError::at("free_quota", error))?;
        let retry = config.retry.policy()?;
        let webhook_limits = match config.webhooks() {
            Some(webhooks) => {
                webhooks
                    .check()
                    .map_err(|error| ConfigError::at("plugins.entries.webhooks", error))?;
                Some(webhooks.limits)
            }
            None => None,
        };
        for (name, section) in &config.providers {
            section.check(name, &config.secrets)?;
        }
        let prices = Arc::new(config.price_table());
        // Without providers, the one upstream serves every provider.
        let providers =
            (!config.providers.is_empty()).then(|| config.providers.keys().cloned().collect());
        let model_names = config.model_names()?;
        let catalog = ModelCatalog::new(
            Arc::clone(&prices),
            providers,
            &config.fallbacks,
            &rate_rules,
            &config.free_quota,
        )
        .map_err(|error| ConfigError::at("fallbacks", error))?
        .with_model_names(model_names.clone());
        if config.max_in_flight == Some(0) {
            return Err(ConfigError::new("max_in_flight must be at least 1"));
        }
        let max_in_flight = config
            .max_in_flight
            .unwrap_or_else(InFlightLimitLayer::default_max_in_flight);
        config
            .unauthenticated
            .validate()
            .map_err(|error| ConfigError::at("unauthenticated", error))?;
        config
            .auth_failures
            .validate()
            .map_err(|error| ConfigError::at("auth_failures", error))?;
        let trusted_proxies = TrustedProxies::parse(&config.trusted_proxies)
            .map_err(|error| ConfigError::at("trusted_proxies", error))?;
        if let Some(section) = &config.leak_scanning {
            section.check(&config.secrets)?;
        }
        if let Some(section) = &config.email {
            section.check(&config.secrets)?;
        }
        let alert_rules = match &config.alerts {
            Some(section) => Some(section.rules(config.email.is_some(), &config.secrets)?),
            None => None,
        };
        let generations = config.generations.generations()?;
        let max_pending_codes_per_account = config.oauth.max_pending_codes_per_account()?;
        let management_rate = management_rate(config)?;
        Ok(CheckedConfig {
            rate_rules,
            free_quota: config.free_quota,
            retry,
            webhook_limits,
            prices,
            catalog: Arc::new(catalog),
            completion_bound_fields: config
                .providers
                .iter()
                .filter_map(|(name, section)| {
                    section
                        .completion_bound_field
                        .map(|field| (name.clone(), field))
                })
                .collect(),
            max_in_flight,
            max_concurrent_key_lookups: config
                .unauthenticated
                .max_concurrent_key_lookups
                .unwrap_or(max_in_flight),
            unauthenticated: config.unauthenticated,
            auth_failures: config.auth_failures,
            trusted_proxies,
            alert_rules,
            generations,
            public_ranking: config.generations.public_ranking,
            plain_pkce: config.oauth.plain_pkce(),
            max_pending_codes_per_account,
            management_rate,
            max_body_bytes: config.body.max_body_bytes(),
            model_names,
            body_read_timeout: config.body.read_timeout(),
            default_max_tokens: config.credit.default_max_tokens,
            reservation_ttl: config.credit.reservation_ttl(),
        })
    }
}

/// `management_rate`, checked as an account rule is; the default when
/// absent.
fn management_rate(config: &GatewayConfig) -> Result<RateRule, ConfigError> {
    let Some(rule) = config.management_rate else {
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

/// What the config names outside itself, read once at load.
#[derive(Clone, Debug)]
pub(in crate::proxy) struct Loaded {
    /// The webhook routes served, their secrets read; a disabled route, or
    /// one whose secret cannot be read, is left out (and logged).
    pub(in crate::proxy) webhook_routes: Vec<WebhookRoute>,
    /// Who is told of a leaked key.
    pub(in crate::proxy) leak_notices: NoticeChannels,
    /// With a `leak_scanning` section.
    pub(in crate::proxy) scanning_keys: Option<ScanningKeys>,
    /// A client per provider; `None` without providers: the gateway's one
    /// upstream serves every model.
    pub(in crate::proxy) providers: Option<HashMap<String, ProviderUpstream>>,
    /// Who is told of alerts, with an `alerts` section.
    pub(in crate::proxy) alert_notices: Option<NoticeChannels>,
}

impl Loaded {
    /// Reads in a fixed order, so of several faults the same one is
    /// reported first.
    fn read(config: &GatewayConfig) -> Result<Self, ConfigError> {
        let secrets = &config.secrets;
        let webhook_routes = match config.webhooks() {
            Some(webhooks) => resolve_routes(webhooks, secrets, &ResolveLimits::default()).0,
            None => Vec::new(),
        };
        let leak_webhook = match config
            .leak_scanning
            .as_ref()
            .and_then(|section| section.notify_webhook.as_ref())
        {
            Some(section) => Some(section.settings("leak_scanning.notify_webhook", secrets)?),
            None => None,
        };
        // Read once: leak notices and alerts go out through the same server.
        let email = match &config.email {
            Some(section) => Some(section.settings(secrets)?),
            None => None,
        };
        let scanning_keys = match &config.leak_scanning {
            Some(section) => Some(section.scanning_keys(secrets)?),
            None => None,
        };
        let providers = if config.providers.is_empty() {
            None
        } else {
            let mut upstreams = HashMap::new();
            for (name, section) in &config.providers {
                upstreams.insert(name.clone(), section.upstream(name, secrets)?);
            }
            Some(upstreams)
        };
        let alert_notices = match &config.alerts {
            Some(section) => Some(NoticeChannels {
                email: email.clone(),
                webhook: match &section.webhook {
                    Some(webhook) => Some(webhook.settings("alerts.webhook", secrets)?),
                    None => None,
                },
            }),
            None => None,
        };
        Ok(Loaded {
            webhook_routes,
            leak_notices: NoticeChannels {
                email,
                webhook: leak_webhook,
            },
            scanning_keys,
            providers,
            alert_notices,
        })
    }
}

/// Where notices of one kind go: the owner's e-mail and a webhook, each
/// when configured.
#[derive(Clone, Debug)]
pub(in crate::proxy) struct NoticeChannels {
    email: Option<EmailSettings>,
    webhook: Option<WebhookSettings>,
}

impl NoticeChannels {
    /// A notifier of its own for each gateway: its pending notices and
    /// sends are that gateway's, its webhooks dated by its clock.
    pub(in crate::proxy) fn notifier(&self, clock: Arc<dyn Clock>) -> Notifier {
        Notifier::new(self.email.clone(), self.webhook.clone()).with_clock(clock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::{PluginEntries, PluginsSection, ProviderSection};
    use crate::secrets::{Secret, SecretSpec};
    use crate::webhook::{RouteConfig, WebhooksConfig};

    /// `config: <field>…` for the plan of `json`, which loads.
    fn plan_refusal(json: &str) -> String {
        let config = GatewayConfig::from_json(json).expect(json);
        GatewayPlan::new(&config).expect_err(json).to_string()
    }

    #[test]
    fn a_config_accepted_at_load_is_planned_but_for_what_is_outside_it() {
        let error = plan_refusal(
            r#"{"leak_scanning": {"public_keys": {"file": "/nonexistent/modelgate-keys.json"}}}"#,
        );
        assert!(
            error.starts_with("config: leak_scanning.public_keys: "),
            "{error}"
        );
        let error = plan_refusal(
            r#"{"email": {"smtp": {"env": "MODELGATE_UNIT_UNSET_SMTP"}, "from": "keys@example.com"}}"#,
        );
        assert!(error.starts_with("config: email.smtp: "), "{error}");
        // Of several faults outside the config, the leak notices' come
        // before the scanning keys'.
        let error = plan_refusal(
            r#"{"leak_scanning": {"public_keys": {"file": "/nonexistent/modelgate-keys.json"}},
                "email": {"smtp": {"env": "MODELGATE_UNIT_UNSET_SMTP"}, "from": "keys@example.com"}}"#,
        );
        assert!(error.starts_with("config: email.smtp: "), "{error}");
        let plan = GatewayPlan::new(&GatewayConfig::default()).unwrap();
        assert!(plan.loaded.providers.is_none() && plan.checked.alert_rules.is_none());
    }

    #[test]
    fn a_config_built_in_code_is_planned_only_once_checked() {
        let refusal = |config: &GatewayConfig| {
            let planned = GatewayPlan::new(config).unwrap_err().to_string();
            assert_eq!(config.validate().unwrap_err().to_string(), planned);
            planned
        };
        let config = GatewayConfig {
            max_in_flight: Some(0),
            ..GatewayConfig::default()
        };
        assert_eq!(refusal(&config), "config: max_in_flight must be at least 1");
        // A BYOK provider needs its own key.
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
        let error = refusal(&config);
        assert!(
            error.contains("providers.internal.byok needs providers.internal.api_key"),
            "{error}"
        );
        // The webhook routes' secrets are checked before any is read.
        let short = RouteConfig {
            route_id: "deploys".into(),
            enabled: true,
            path: "/plugins/webhooks/deploys".into(),
            session_key: "s".into(),
            secret: SecretSpec::Inline(Secret::new("short".to_owned())),
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
        let error = refusal(&config);
        assert!(
            error.contains("`secret` must be at least 16 bytes"),
            "{error}"
        );
    }
}
