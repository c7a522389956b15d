//! `leak_scanning`: secret-scanning alerts (`POST /api/v1/leaks`).

use serde::Deserialize;

use super::secret_fields::{check_reference, read_secret, secret_spec};
use super::{ConfigError, NotifyWebhookSection};
use crate::leaks::ScanningKeys;
use crate::secrets::{SecretProviders, SecretSpec};

/// `leak_scanning` in [`GatewayConfig`](super::GatewayConfig).
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

impl LeakScanningSection {
    /// The secrets providers its references name, and the webhook's URL.
    pub(super) fn check(&self, secrets: &SecretProviders) -> Result<(), ConfigError> {
        check_reference("leak_scanning.public_keys", &self.public_keys, secrets)?;
        match &self.notify_webhook {
            Some(webhook) => webhook.check("leak_scanning.notify_webhook", secrets),
            None => Ok(()),
        }
    }

    /// The public keys alerts are checked with, read now.
    pub(super) fn scanning_keys(
        &self,
        secrets: &SecretProviders,
    ) -> Result<ScanningKeys, ConfigError> {
        let text = read_secret("leak_scanning.public_keys", &self.public_keys, secrets)?;
        ScanningKeys::from_json(text.expose().as_bytes())
            .map_err(|error| ConfigError::new(format!("leak_scanning.public_keys: {error}")))
    }
}
