use chrono::{DateTime, Utc};

use crate::error::{ErrorKind, GatewayError};
use crate::keys::KeyHash;
use crate::keys::{KeyRateLimit, KeyRecord};
use crate::model_id::{ModelId, pattern_allows, pattern_allows_in_other_case};
use crate::store::KeyLimit;

/// Who is calling: the key BearerAuth accepted, put into the request's
/// [`RequestContext`](super::RequestContext) for the layers after it.
///
/// `Debug` shows no secret: the key hash prints redacted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// SHA-256 of the key; its id in the store and the ledger.
    pub key_hash: KeyHash,
    /// The account whose balance, rate limits and quotas the key shares.
    pub account_id: String,
    /// The key's name.
    pub label: String,
    /// Whether this is a management key (management API only, no models).
    pub management: bool,
    /// Whether this is the operator's management key, over every account;
    /// an account's management key manages `account_id` only.
    pub operator: bool,
    /// The key's credit limit as the ledger checks it, if it has one.
    pub key_limit: Option<KeyLimit>,
    /// Whether usage through the account's own provider keys counts
    /// against the limit.
    pub include_byok_in_limit: bool,
    /// When the key stops working.
    pub expires_at: Option<DateTime<Utc>>,
    /// Whether the key was rotated: another replaced it, and it works only
    /// until its grace ends (`expires_at`).
    pub rotated: bool,
    /// The models the key may call (model ids or provider prefixes);
    /// `None`: every model.
    pub allowed_models: Option<Vec<String>>,
    /// The key's own request rate, if it has one.
    pub rate_limit: Option<KeyRateLimit>,
}

impl Principal {
    /// Whether the key may call `model`: its `allowed_models` cover it, or
    /// it has none.
    pub fn may_call(&self, model: &ModelId) -> bool {
        self.allowed_models
            .as_ref()
            .is_none_or(|allowed| allowed.iter().any(|pattern| pattern_allows(pattern, model)))
    }

    /// [`may_call`](Self::may_call), or the 403 `model_not_allowed` that
    /// refuses the request.
    pub fn check_model(&self, model: &ModelId) -> Result<(), GatewayError> {
        if self.may_call(model) {
            return Ok(());
        }
        // Spelled in another case: say how the list spells it.
        let spelled = self
            .allowed_models
            .iter()
            .flatten()
            .find(|pattern| pattern_allows_in_other_case(pattern, model));
        let message = match spelled {
            Some(pattern) => format!(
                "this key may not call {model}: its allowed_models name {pattern}, spelled exactly so (model ids are case-sensitive)"
            ),
            None => format!(
                "this key may not call {model}: its allowed_models do not cover it; the key's allowed_models list the models it may call"
            ),
        };
        Err(GatewayError::new(ErrorKind::Forbidden, message)
            .with_metadata("reason", "model_not_allowed")
            .with_metadata("param", "model"))
    }

    /// The principal of a stored key.
    pub fn from_record(key_hash: KeyHash, record: &KeyRecord) -> Self {
        Principal {
            key_hash,
            account_id: record.account.clone(),
            label: record.name.clone(),
            management: record.management,
            operator: record.is_operator(),
            key_limit: record.key_limit(),
            include_byok_in_limit: record.include_byok_in_limit,
            expires_at: record.expires_at,
            rotated: record.rotated_to.is_some(),
            allowed_models: record.allowed_models.clone(),
            rate_limit: record.rate_limit,
        }
    }
}

#[cfg(test)]
impl Principal {
    /// A normal key's principal on `account`, for layer tests.
    pub(crate) fn for_tests(account: &str) -> Self {
        Principal {
            key_hash: KeyHash::of("test key"),
            account_id: account.to_owned(),
            label: "test".to_owned(),
            management: false,
            operator: false,
            key_limit: None,
            include_byok_in_limit: false,
            expires_at: None,
            rotated: false,
            allowed_models: None,
            rate_limit: None,
        }
    }
}
