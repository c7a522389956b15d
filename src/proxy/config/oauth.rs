//! `oauth`: what OAuth approvals may use.

use serde::Deserialize;

/// `oauth` in [`GatewayConfig`](super::GatewayConfig).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OAuthSection {
    /// Whether an approval may use the `plain` PKCE method (and an approval
    /// naming no method means `plain`). Absent: `false`, S256 only; with
    /// `plain` the verifier itself travels in the consent page's URL.
    pub allow_plain_pkce: bool,
    /// The most OAuth codes of one account waiting for their exchange at
    /// once: at least 1. Absent: 100.
    pub max_pending_codes_per_account: Option<u64>,
}
