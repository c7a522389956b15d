//! `oauth`: what OAuth approvals may use.

use serde::Deserialize;

use super::ConfigError;
use crate::oauth::{DEFAULT_MAX_PENDING_CODES_PER_ACCOUNT, PlainPkce};

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

impl OAuthSection {
    /// `allow_plain_pkce` as the approvals read it.
    pub(super) fn plain_pkce(&self) -> PlainPkce {
        if self.allow_plain_pkce {
            PlainPkce::Allowed
        } else {
            PlainPkce::Refused
        }
    }

    /// `max_pending_codes_per_account`, at least 1, or the default.
    pub(super) fn max_pending_codes_per_account(&self) -> Result<u64, ConfigError> {
        match self.max_pending_codes_per_account {
            Some(0) => Err(ConfigError::new(
                "oauth.max_pending_codes_per_account must be at least 1",
            )),
            Some(most) => Ok(most),
            None => Ok(DEFAULT_MAX_PENDING_CODES_PER_ACCOUNT),
        }
    }
}
