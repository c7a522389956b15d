//! `leak_scanning.notify_webhook` and `alerts.webhook`: a signed webhook
//! told of notices.

use serde::Deserialize;

use super::ConfigError;
use super::secret_fields::{check_reference, read_secret, secret_spec};
use crate::notify::WebhookSettings;
use crate::secrets::{Redacted, SecretProviders, SecretSpec};

/// `leak_scanning.notify_webhook` in [`GatewayConfig`](super::GatewayConfig).
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

impl NotifyWebhookSection {
    /// Its URL, and the secrets provider its secret names; errors name
    /// `field`, where the section is.
    pub(super) fn check(&self, field: &str, secrets: &SecretProviders) -> Result<(), ConfigError> {
        WebhookSettings::check_url(self.url.expose())
            .map_err(|error| ConfigError::at(field, error))?;
        check_reference(&format!("{field}.secret"), &self.secret, secrets)
    }

    /// Its settings, its secret read now; errors name `field`.
    pub(super) fn settings(
        &self,
        field: &str,
        secrets: &SecretProviders,
    ) -> Result<WebhookSettings, ConfigError> {
        let secret = read_secret(&format!("{field}.secret"), &self.secret, secrets)?;
        WebhookSettings::new(self.url.expose(), secret)
            .map_err(|error| ConfigError::new(format!("{field}: {error}")))
    }
}
