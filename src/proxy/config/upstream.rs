//! `upstream`: the one upstream every model goes to without `providers`.

use serde::Deserialize;

/// `upstream` in [`GatewayConfig`](super::GatewayConfig).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamSection {
    /// The upstream's base URL, its version path included.
    pub base_url: Option<String>,
    /// The environment variable holding the upstream's API key.
    pub api_key_env: Option<String>,
    /// Longest wait for a connection, in ms.
    pub connect_timeout_ms: Option<u64>,
    /// Longest wait for the response headers, in ms.
    pub response_header_timeout_ms: Option<u64>,
}
