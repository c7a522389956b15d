//! `body`: request body limits.

use std::time::Duration;

use serde::Deserialize;

use crate::body::BodyLimitLayer;

/// `body` in [`GatewayConfig`](super::GatewayConfig).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BodySection {
    /// Largest request body, in bytes.
    pub max_body_bytes: Option<usize>,
    /// Longest time to receive a body, in ms.
    pub read_timeout_ms: Option<u64>,
}

impl BodySection {
    /// `max_body_bytes`, or BodyLimit's default.
    pub(super) fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
            .unwrap_or(BodyLimitLayer::DEFAULT_MAX_BODY_BYTES)
    }

    /// `read_timeout_ms`, or BodyLimit's default.
    pub(super) fn read_timeout(&self) -> Duration {
        self.read_timeout_ms
            .map_or(BodyLimitLayer::DEFAULT_READ_TIMEOUT, Duration::from_millis)
    }
}
