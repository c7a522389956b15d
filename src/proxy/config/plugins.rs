//! `plugins`: the plugin entries (the webhook routes).

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::webhook::WebhooksConfig;

/// `plugins` in [`GatewayConfig`](super::GatewayConfig): `{"entries": {…}}`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginsSection {
    /// The plugin entries by name.
    pub entries: PluginEntries,
}

/// `plugins.entries` in [`GatewayConfig`](super::GatewayConfig).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginEntries {
    /// The webhook routes, as [`WebhooksConfig::from_plugin_entry`] reads
    /// them: `{"enabled": bool, "config": {"routes": {…}, "limits": {…}}}`.
    #[serde(default, deserialize_with = "webhooks_entry")]
    pub webhooks: Option<WebhooksConfig>,
}

fn webhooks_entry<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<WebhooksConfig>, D::Error> {
    let entry = Value::deserialize(deserializer)?;
    WebhooksConfig::from_plugin_entry(&entry)
        .map(Some)
        .map_err(serde::de::Error::custom)
}
