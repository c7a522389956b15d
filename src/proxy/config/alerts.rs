//! `alerts`: low balance and key-limit alerts to an account's owner.

use serde::Deserialize;
use serde_json::Value;

use super::{ConfigError, NotifyWebhookSection};
use crate::alerts::AlertRules;
use crate::secrets::SecretProviders;

/// `alerts` in [`GatewayConfig`](super::GatewayConfig).
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

impl AlertsSection {
    /// The alert rules, once the section names a threshold and a way to
    /// send them: the `email` section (`with_email`) or its webhook.
    pub(super) fn rules(
        &self,
        with_email: bool,
        secrets: &SecretProviders,
    ) -> Result<AlertRules, ConfigError> {
        let rules = AlertRules::from_json(&self.balance_below, &self.key_limit_percent)
            .map_err(|error| ConfigError::at("alerts", error))?;
        if rules.is_empty() {
            return Err(ConfigError::new(
                "alerts: names no threshold; set balance_below or key_limit_percent",
            ));
        }
        match &self.webhook {
            Some(webhook) => webhook.check("alerts.webhook", secrets)?,
            None if !with_email => {
                return Err(ConfigError::new(
                    "alerts: nothing to send them with; set the email section or alerts.webhook",
                ));
            }
            None => {}
        }
        Ok(rules)
    }
}
