//! `alerts`: low balance and key-limit alerts to an account's owner.

use serde::Deserialize;
use serde_json::Value;

use super::NotifyWebhookSection;

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
