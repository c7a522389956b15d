//! [`LeakNotice`]: what a leaked key's owner and the operator are told.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A leaked key, as its owner and the operator are told about it. It is
/// also the webhook's `data`, serialised as is (`reported_at` in RFC 3339,
/// absent options as `null`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakNotice {
    /// The account's id.
    pub account: String,
    /// The account owner's address; `None` sends no e-mail (the webhook
    /// still goes).
    pub email: Option<String>,
    /// The key's human name.
    pub key_name: String,
    /// The first 12 hex digits of the key's SHA-256 hash: never the key.
    pub key_hash_prefix: String,
    /// The kind of secret found, such as `modelgate_api_key`.
    pub token_type: String,
    /// Where it was found (a GitHub URL), when known.
    pub url: Option<String>,
    /// What kind of place that is (`content`, `commit`, `npm`, …), when
    /// known.
    pub source: Option<String>,
    /// When the leak was reported.
    pub reported_at: DateTime<Utc>,
    /// Who reported it: `secret_scanning` or `operator`.
    pub reported_by: String,
}
