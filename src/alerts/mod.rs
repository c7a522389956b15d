//! Alerts: the account's owner is e-mailed (and the alert webhook told)
//! when the balance falls below a threshold or a key's usage passes a
//! share of its limit, once per crossing across every instance.
//!
//! **When.** After a request's settlement is recorded,
//! [`CreditGuardLayer::on_settled`](crate::credit::CreditGuardLayer::on_settled)
//! hands the account, the key and its limit to [`Alerts::settled`], which
//! only queues them (a bounded queue; when full the check is dropped and
//! counted). A background task then reads the account's balance
//! ([`LedgerStore::account_balance`](crate::store::LedgerStore::account_balance))
//! and the key's usage in its limit's period
//! ([`KeyUsage::in_period`](crate::store::KeyUsage::in_period)), and for
//! each threshold of the [`AlertRules`] that is crossed:
//!
//! - `balance_below`: the balance is below the threshold (an account that
//!   never bought credits is left alone);
//! - `key_limit_percent`: the key's usage in its period is at least that
//!   share of its limit.
//!
//! **Exactly once.** Each crossing has a marker id ([`balance_marker`],
//! [`key_marker`]); the instance that creates it in the store
//! (`put_json_at` with [`Expect::Absent`](crate::store::Expect::Absent) in
//! [`ALERTS_COLLECTION`], the store's own atomic step) sends the notice,
//! and every other instance finds it there and sends nothing. The balance
//! marker names the account's purchased total, so a top-up arms the
//! thresholds again; the key marker names the start of the limit's period
//! and the limit, so a new period or a changed limit arms it again. A
//! marker lives [`MARKER_TTL`]: a state that lasts longer than that (a
//! limit that never resets, a balance never topped up) is reported once
//! more after it.
//!
//! **Never in the way.** The money path only queues; the checks read the
//! store after the request is settled, one account at a time, and a
//! failed read or write is logged and counted, never retried against the
//! request. Each instance remembers the markers it has claimed or found
//! claimed, so a balance that stays below a threshold writes nothing more.
//!
//! **Delivery** is the [`Notifier`](crate::notify::Notifier)'s
//! ([`Notifier::alert`](crate::notify::Notifier::alert)): e-mail to the
//! account's address (none without one) and the webhook signed as leak
//! notices are, with the same retries, bounds and metric.
//!
//! ```
//! use modelgate::alerts::{balance_marker, key_marker, AlertRules};
//! use serde_json::json;
//!
//! let rules = AlertRules::from_json(&[json!(5), json!(0.5)], &[json!(80), json!(100)]).unwrap();
//! assert_eq!(rules.balance_below_nanos(), &[5_000_000_000, 500_000_000]);
//! let error = AlertRules::from_json(&[json!(5), json!(-1)], &[]).unwrap_err();
//! assert_eq!(error.to_string(), "balance_below[1]: must not be negative");
//!
//! // A top-up (a larger purchased total) is a new crossing.
//! assert_ne!(balance_marker("acct", 5_000_000_000, 10), balance_marker("acct", 5_000_000_000, 20));
//! assert_eq!(key_marker("ab12", 80, None, 7), key_marker("ab12", 80, None, 7));
//! ```

mod worker;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::keys::credits::nanos_from_json;

pub use worker::{Alerts, DEFAULT_MAX_QUEUED_CHECKS};

/// The record collection of claimed alert markers.
pub const ALERTS_COLLECTION: &str = "alerts";

/// How long a claimed marker is kept (40 days: longer than the longest
/// limit period, a month).
pub const MARKER_TTL: Duration = Duration::from_secs(40 * 86_400);

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

/// The marker of `account`'s balance below `threshold_nanos` while its
/// purchased total is `purchased_nanos`: a top-up makes a new one.
pub fn balance_marker(account: &str, threshold_nanos: i64, purchased_nanos: i64) -> String {
    format!("balance/{account}/{threshold_nanos}/{purchased_nanos}")
}

/// The marker of the key `key_hash` (hex) past `percent` of its limit of
/// `limit_nanos` in the period that began at `period_start` (`None`: a
/// limit that never resets): a new period or another limit makes a new
/// one.
pub fn key_marker(
    key_hash: &str,
    percent: u8,
    period_start: Option<DateTime<Utc>>,
    limit_nanos: i64,
) -> String {
    let period =
        period_start.map_or_else(|| "all".to_owned(), |start| start.timestamp().to_string());
    format!("key/{key_hash}/{percent}/{period}/{limit_nanos}")
}

/// Whether `used_nanos` is at least `percent` of `limit_nanos`, exactly.
pub(crate) fn past_percent(used_nanos: i64, limit_nanos: i64, percent: u8) -> bool {
    limit_nanos > 0 && i128::from(used_nanos) * 100 >= i128::from(limit_nanos) * i128::from(percent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
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

        #[test]
        fn markers_change_exactly_when_the_crossing_is_a_new_one(
            account in "[a-z0-9_]{1,12}",
            threshold in 1i64..i64::MAX,
            purchased in 0i64..i64::MAX / 2,
            top_up in 1i64..1_000_000_000,
            percent in 1u8..=100,
            limit in 1i64..i64::MAX / 2,
            day in 0i64..20_000,
            period in prop::sample::select(vec![crate::clock::Period::Day, crate::clock::Period::Week, crate::clock::Period::Month]),
        ) {
            // The same state: the same marker, whichever instance asks.
            prop_assert_eq!(balance_marker(&account, threshold, purchased), balance_marker(&account, threshold, purchased));
            // A top-up arms it again.
            prop_assert_ne!(balance_marker(&account, threshold, purchased), balance_marker(&account, threshold, purchased + top_up));
            let instant = Utc.timestamp_opt(day * 86_400 + 3_600, 0).unwrap();
            let start = period.start_of(instant);
            let later_in_period = instant.max(start) + chrono::Duration::seconds(1);
            let next = period.end_of(instant);
            let key = "3f9a0c1b2d4e";
            prop_assert_eq!(
                key_marker(key, percent, Some(start), limit),
                key_marker(key, percent, Some(period.start_of(later_in_period.min(next - chrono::Duration::seconds(1)))), limit)
            );
            // The limit's reset (the next period) arms it again.
            prop_assert_ne!(key_marker(key, percent, Some(start), limit), key_marker(key, percent, Some(period.start_of(next)), limit));
            // So does another limit, or another share.
            prop_assert_ne!(key_marker(key, percent, Some(start), limit), key_marker(key, percent, Some(start), limit + 1));
            prop_assert_ne!(key_marker(key, percent, None, limit), key_marker(key, percent % 100 + 1, None, limit));
        }
    }
}
