//! `retry`: upstream retries.

use serde::Deserialize;

/// `retry` in [`GatewayConfig`](super::GatewayConfig).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySection {
    /// Attempts in all, 1 to 5 (default 3).
    pub max_attempts: Option<u32>,
    /// Longest wait before a retry, in ms (default 10 000).
    pub max_wait_ms: Option<u64>,
}
