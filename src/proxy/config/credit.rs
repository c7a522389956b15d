//! `credit`: credit accounting.

use serde::Deserialize;

/// `credit` in [`GatewayConfig`](super::GatewayConfig).
///
/// There is no `byok` here: a request is BYOK only when the account's own
/// key is what reaches the provider, so an account brings its keys through
/// the management API (`PUT /api/v1/accounts/{id}/byok/{provider}`), with a
/// `providers` section. A config that still has `credit.byok` is refused.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(try_from = "CreditSectionInput")]
pub struct CreditSection {
    /// Completion tokens assumed without `max_tokens`.
    pub default_max_tokens: Option<u64>,
    /// How long a hold lasts unless renewed, in seconds (renewed every
    /// third of it while its request is in flight).
    pub reservation_ttl_seconds: Option<u64>,
}

/// The longest hold lifetime, in seconds: [`MAX_RESERVATION_TTL`](crate::store::MAX_RESERVATION_TTL).
const MAX_RESERVATION_TTL_SECONDS: u64 = crate::store::MAX_RESERVATION_TTL.as_secs();

/// `credit` as written, so a retired field gets a message that says what
/// to do instead of serde's "unknown field".
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct CreditSectionInput {
    default_max_tokens: Option<u64>,
    reservation_ttl_seconds: Option<u64>,
    byok: Option<serde::de::IgnoredAny>,
}

impl TryFrom<CreditSectionInput> for CreditSection {
    type Error = String;

    fn try_from(input: CreditSectionInput) -> Result<Self, String> {
        if input.byok.is_some() {
            // It booked accounts as BYOK while the gateway's own key was
            // sent: the gateway paid and no balance was charged.
            return Err(
                "credit.byok is no longer accepted: it booked an account's requests as BYOK (not charged to its balance) while the gateway's own provider key was sent. Remove it; to let an account bring its own key, add a `providers` section naming the provider and set the account's key with PUT /api/v1/accounts/{id}/byok/{provider} using a management key"
                    .to_owned(),
            );
        }
        // A hold renewed every third of its lifetime, in whole seconds:
        // below 3 s renewals would come faster than a store answers under
        // load, and 0 would hold nothing.
        if let Some(seconds) = input
            .reservation_ttl_seconds
            .filter(|seconds| !(3..=MAX_RESERVATION_TTL_SECONDS).contains(seconds))
        {
            return Err(format!(
                "credit.reservation_ttl_seconds must be from 3 to {MAX_RESERVATION_TTL_SECONDS} (a year), not {seconds}: a hold lasts that long unless renewed, and is renewed every third of it while its request runs"
            ));
        }
        Ok(CreditSection {
            default_max_tokens: input.default_max_tokens,
            reservation_ttl_seconds: input.reservation_ttl_seconds,
        })
    }
}

impl CreditSection {
    /// `reservation_ttl_seconds` as a lifetime.
    pub(super) fn reservation_ttl(&self) -> Option<std::time::Duration> {
        self.reservation_ttl_seconds
            .map(std::time::Duration::from_secs)
    }
}

#[cfg(test)]
mod tests {
    use crate::proxy::GatewayConfig;

    #[test]
    fn credit_byok_is_refused_with_what_to_do_instead() {
        let error = GatewayConfig::from_json(r#"{"credit": {"byok": {"acme": ["openai"]}}}"#)
            .expect_err("credit.byok is refused");
        let message = error.to_string();
        for words in [
            "credit.byok is no longer accepted",
            "`providers` section",
            "PUT /api/v1/accounts/{id}/byok/{provider}",
            "management key",
        ] {
            assert!(message.contains(words), "{words:?} missing: {message}");
        }
        // Even empty: the field itself is what is retired.
        assert!(GatewayConfig::from_json(r#"{"credit": {"byok": {}}}"#).is_err());
    }

    #[test]
    fn the_other_credit_fields_are_read_and_unknown_ones_refused() {
        let config = GatewayConfig::from_json(
            r#"{"credit": {"default_max_tokens": 7, "reservation_ttl_seconds": 60}}"#,
        )
        .unwrap();
        assert_eq!(config.credit.default_max_tokens, Some(7));
        assert_eq!(config.credit.reservation_ttl_seconds, Some(60));
        for bad in ["0", "2", "31536001"] {
            let error = GatewayConfig::from_json(&format!(
                r#"{{"credit": {{"reservation_ttl_seconds": {bad}}}}}"#
            ))
            .unwrap_err()
            .to_string();
            assert!(
                error.contains("credit.reservation_ttl_seconds must be from 3"),
                "{error}"
            );
        }
        let config = GatewayConfig::from_json(r#"{"credit": {}}"#).unwrap();
        assert_eq!(config.credit.default_max_tokens, None);
        let error = GatewayConfig::from_json(r#"{"credit": {"max_tokens": 7}}"#)
            .expect_err("unknown fields are refused");
        assert!(
            error.to_string().contains("unknown field `max_tokens`"),
            "{error}"
        );
    }
}
