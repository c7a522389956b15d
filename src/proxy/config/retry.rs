//! `retry`: upstream retries.

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use crate::proxy::RetryPolicy;

/// `retry` in [`GatewayConfig`](super::GatewayConfig).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySection {
    /// Attempts in all, 1 to 5 (default 3).
    pub max_attempts: Option<u32>,
    /// Longest wait before a retry, in ms (default 10 000).
    pub max_wait_ms: Option<u64>,
}

impl RetrySection {
    /// The retry policy: its attempts checked, its longest wait set.
    pub(super) fn policy(&self) -> Result<RetryPolicy, ConfigError> {
        let policy = RetryPolicy::new(self.max_attempts.unwrap_or(RetryPolicy::DEFAULT_ATTEMPTS))
            .map_err(|error| ConfigError::at("retry.max_attempts", error))?;
        Ok(match self.max_wait_ms {
            Some(ms) => policy.max_wait(Duration::from_millis(ms)),
            None => policy,
        })
    }
}
