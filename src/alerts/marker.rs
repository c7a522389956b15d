//! The markers that make each alert crossing happen once: an id per
//! crossing, claimed in [`ALERTS_COLLECTION`] by the store's
//! create-if-absent write, kept [`MARKER_TTL`].

use std::time::Duration;

use chrono::{DateTime, Utc};

/// The record collection of claimed alert markers.
pub const ALERTS_COLLECTION: &str = "alerts";

/// How long a claimed marker is kept (40 days: longer than the longest
/// limit period, a month).
pub const MARKER_TTL: Duration = Duration::from_secs(40 * 86_400);

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

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    proptest! {
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
