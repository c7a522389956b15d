//! `leak_scanning`: secret-scanning alerts (`POST /api/v1/leaks`).

use serde::Deserialize;

use super::secret_fields::secret_spec;
use super::NotifyWebhookSection;
use crate::secrets::SecretSpec;

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
