//! `body`: request body limits.

use serde::Deserialize;

/// `body` in [`GatewayConfig`](super::GatewayConfig).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BodySection {
    /// Largest request body, in bytes.
    pub max_body_bytes: Option<usize>,
    /// Longest time to receive a body, in ms.
    pub read_timeout_ms: Option<u64>,
}
