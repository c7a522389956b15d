//! [`AlertRules`]: the thresholds alerts are sent at, read from the
//! config's lists, and the exact test of a key's share of its limit.

use serde_json::Value;

use crate::keys::credits::nanos_from_json;

/// The most thresholds of each kind.
pub const MAX_THRESHOLDS: usize = 16;

/// When alerts are sent: balance thresholds and shares of key limits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlertRules {
    balance_below_nanos: Vec<i64>,
    key_limit_percent: Vec<u8>,
}

/// Why alert rules were refused: the entry (`balance_below[1]`) and what
/// is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AlertRulesError(String);

impl AlertRules {
    /// Rules from the config's lists: `balance_below` as numbers of
    /// credits above 0, `key_limit_percent` as whole percentages from 1 to
    /// 100; each at most [`MAX_THRESHOLDS`] entries, none twice.
    pub fn from_json(
        balance_below: &[Value],
        key_limit_percent: &[Value],
    ) -> Result<Self, AlertRulesError> {
        let error = |field: &str, at: usize, words: String| {
            AlertRulesError(format!("{field}[{at}]: {words}"))
        };
        for (field, len) in [
            ("balance_below", balance_below.len()),
            ("key_limit_percent", key_limit_percent.len()),
        ] {
            if len > MAX_THRESHOLDS {
                return Err(AlertRulesError(format!(
                    "{field}: at most {MAX_THRESHOLDS} thresholds, not {len}"
                )));
            }
        }
        let mut balance_below_nanos = Vec::with_capacity(balance_below.len());
        for (at, value) in balance_below.iter().enumerate() {
            let nanos = nanos_from_json(value)
                .map_err(|reason| error("balance_below", at, reason.describe()))?;
            if nanos == 0 {
                return Err(error("balance_below", at, "must be above 0 credits".into()));
            }
            if balance_below_nanos.contains(&nanos) {
                return Err(error(
                    "balance_below",
                    at,
                    format!("{value} is listed twice"),
                ));
            }
            balance_below_nanos.push(nanos);
        }
        let mut percents = Vec::with_capacity(key_limit_percent.len());
        for (at, value) in key_limit_percent.iter().enumerate() {
            let percent = value
                .as_u64()
                .filter(|percent| (1..=100).contains(percent))
                .and_then(|percent| u8::try_from(percent).ok())
                .ok_or_else(|| {
                    error(
                        "key_limit_percent",
                        at,
                        format!("must be a whole number from 1 to 100, not {value}"),
                    )
                })?;
            if percents.contains(&percent) {
                return Err(error(
                    "key_limit_percent",
                    at,
                    format!("{percent} is listed twice"),
                ));
            }
            percents.push(percent);
        }
        Ok(AlertRules {
            balance_below_nanos,
            key_limit_percent: percents,
        })
    }

    /// The balance thresholds, in nano-credits, in the config's order.
    pub fn balance_below_nanos(&self) -> &[i64] {
        &self.balance_below_nanos
    }

    /// The shares of a key's limit, in percent, in the config's order.
    pub fn key_limit_percent(&self) -> &[u8] {
        &self.key_limit_percent
    }

    /// Whether no threshold is set: nothing to check.
    pub fn is_empty(&self) -> bool {
        self.balance_below_nanos.is_empty() && self.key_limit_percent.is_empty()
    }
}

/// Whether `used_nanos` is at least `percent` of `limit_nanos`, exactly.
pub(crate) fn past_percent(used_nanos: i64, limit_nanos: i64, percent: u8) -> bool {
    limit_nanos > 0 && i128::from(used_nanos) * 100 >= i128::from(limit_nanos) * i128::from(percent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn rules_read_credits_and_percentages() {
        let rules = AlertRules::from_json(
            &[json!(5), json!(1), json!(0.000000001)],
            &[json!(80), json!(100), json!(1)],
        )
        .unwrap();
        assert_eq!(
            rules.balance_below_nanos(),
            &[5_000_000_000, 1_000_000_000, 1]
        );
        assert_eq!(rules.key_limit_percent(), &[80, 100, 1]);
        assert!(!rules.is_empty());
        assert!(AlertRules::from_json(&[], &[]).unwrap().is_empty());
    }

    #[test]
    fn bad_entries_are_named_by_place() {
        for (balance, percent, message) in [
            (
                vec![json!(5), json!("1")],
                vec![],
                "balance_below[1]: must be a number of credits",
            ),
            (
                vec![json!(-1)],
                vec![],
                "balance_below[0]: must not be negative",
            ),
            (
                vec![json!(0)],
                vec![],
                "balance_below[0]: must be above 0 credits",
            ),
            (
                vec![json!(1e12)],
                vec![],
                "balance_below[0]: must be at most 1000000000 credits",
            ),
            (
                vec![json!(5), json!(5.0)],
                vec![],
                "balance_below[1]: 5.0 is listed twice",
            ),
            (
                vec![],
                vec![json!(0)],
                "key_limit_percent[0]: must be a whole number from 1 to 100, not 0",
            ),
            (
                vec![],
                vec![json!(80), json!(101)],
                "key_limit_percent[1]: must be a whole number from 1 to 100, not 101",
            ),
            (
                vec![],
                vec![json!(80.5)],
                "key_limit_percent[0]: must be a whole number from 1 to 100, not 80.5",
            ),
            (
                vec![],
                vec![json!(-5)],
                "key_limit_percent[0]: must be a whole number from 1 to 100, not -5",
            ),
            (
                vec![],
                vec![json!(80), json!(80)],
                "key_limit_percent[1]: 80 is listed twice",
            ),
        ] {
            assert_eq!(
                AlertRules::from_json(&balance, &percent)
                    .unwrap_err()
                    .to_string(),
                message
            );
        }
        let many: Vec<Value> = (1..=17).map(|n| json!(n)).collect();
        assert_eq!(
            AlertRules::from_json(&many, &[]).unwrap_err().to_string(),
            "balance_below: at most 16 thresholds, not 17"
        );
    }

    #[test]
    fn percentages_are_exact_at_the_edge() {
        assert!(past_percent(80, 100, 80));
        assert!(!past_percent(79, 100, 80));
        assert!(past_percent(i64::MAX, i64::MAX, 100));
        assert!(!past_percent(5, 0, 1));
    }

    proptest! {
        #[test]
        fn rules_round_trip_any_valid_lists(
            credits in proptest::collection::btree_set(1i64..=1_000_000, 0..=16),
            percents in proptest::collection::btree_set(1u8..=100, 0..=16),
        ) {
            let balance: Vec<Value> = credits.iter().map(|c| json!(c)).collect();
            let percent: Vec<Value> = percents.iter().map(|p| json!(p)).collect();
            let rules = AlertRules::from_json(&balance, &percent).unwrap();
            let nanos: Vec<i64> = credits.iter().map(|c| c * crate::store::NANOS_PER_CREDIT).collect();
            prop_assert_eq!(rules.balance_below_nanos(), &nanos[..]);
            prop_assert_eq!(rules.key_limit_percent(), &percents.iter().copied().collect::<Vec<_>>()[..]);
        }
    }
}
