//! `leak_scanning.notify_webhook` and `alerts.webhook`: a signed webhook
//! told of notices.

use serde::Deserialize;

use super::secret_fields::secret_spec;
use crate::secrets::{Redacted, SecretSpec};

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
