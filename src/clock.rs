//! Time for the layers: a [`Clock`] trait, the system clock, a manual clock
//! for tests, and UTC calendar periods.
//!
//! Layers never read the system time themselves; they ask their `Clock` and
//! pass the instant to the store. So a test drives every window, reset and
//! expiry with a [`ManualClock`], on the in-process store and on Redis alike.
//!
//! ```
//! use chrono::{TimeZone, Utc};
//! use modelgate::clock::{Clock, ManualClock, Period};
//!
//! let clock = ManualClock::new(Utc.with_ymd_and_hms(2024, 2, 29, 13, 5, 0).unwrap());
//! // 2024-02-29 is a Thursday; its week starts on Monday 2024-02-26.
//! assert_eq!(Period::Week.start_of(clock.now()), Utc.with_ymd_and_hms(2024, 2, 26, 0, 0, 0).unwrap());
//! assert_eq!(Period::Month.end_of(clock.now()), Utc.with_ymd_and_hms(2024, 3, 1, 0, 0, 0).unwrap());
//! clock.advance(std::time::Duration::from_secs(11 * 3600));
//! assert_eq!(Period::Day.start_of(clock.now()), Utc.with_ymd_and_hms(2024, 3, 1, 0, 0, 0).unwrap());
//! ```

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Datelike, Days, Months, NaiveDate, TimeZone, Utc};
use serde::{Deserialize, Serialize};

/// A source of the current UTC time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current instant.
    fn now(&self) -> DateTime<Utc>;
}

/// The operating system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told; clones share one time.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        ManualClock {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// Moves the clock to `instant` (backwards too, to test clock skew).
    pub fn set(&self, instant: DateTime<Utc>) {
        *self.lock() = instant;
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = chrono::Duration::from_std(by).expect("advance by less than 292 years");
        let mut now = self.lock();
        *now += by;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DateTime<Utc>> {
        // A panic while holding this lock cannot leave the time half-written.
        self.now
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.lock()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> DateTime<Utc> {
        (**self).now()
    }
}

/// A UTC calendar period: the reset period of key limits and daily quotas.
///
/// Serialized as `daily`, `weekly` and `monthly`, the `limit_reset` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    /// A UTC day, from midnight to midnight.
    #[serde(rename = "daily")]
    Day,
    /// A UTC week, from Monday 00:00 to the next Monday 00:00.
    #[serde(rename = "weekly")]
    Week,
    /// A UTC calendar month, from the 1st 00:00 to the next month's 1st.
    #[serde(rename = "monthly")]
    Month,
}

impl Period {
    /// The first instant of the period containing `instant`.
    pub fn start_of(self, instant: DateTime<Utc>) -> DateTime<Utc> {
        let date = instant.date_naive();
        let first_day = match self {
            Period::Day => date,
            Period::Week => date - Days::new(u64::from(date.weekday().num_days_from_monday())),
            Period::Month => date.with_day(1).expect("day 1 exists in every month"),
        };
        midnight(first_day)
    }

    /// The first instant after the period containing `instant` (its end,
    /// exclusive): the moment the period resets.
    pub fn end_of(self, instant: DateTime<Utc>) -> DateTime<Utc> {
        let start = self.start_of(instant).date_naive();
        let next = match self {
            Period::Day => start + Days::new(1),
            Period::Week => start + Days::new(7),
            Period::Month => start + Months::new(1),
        };
        midnight(next)
    }

    /// The `limit_reset` string of this period.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "daily",
            Period::Week => "weekly",
            Period::Month => "monthly",
        }
    }
}

fn midnight(date: NaiveDate) -> DateTime<Utc> {
    Utc.from_utc_datetime(&date.and_hms_opt(0, 0, 0).expect("midnight exists"))
}

/// Microseconds since the Unix epoch: the store's unit of time, exact in a
/// Lua number (a double) for the next 280 years.
pub(crate) fn unix_micros(instant: DateTime<Utc>) -> i64 {
    instant.timestamp_micros()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
    }

    #[test]
    fn day_bounds() {
        let t = at(2023, 12, 31, 23, 59, 59);
        assert_eq!(Period::Day.start_of(t), at(2023, 12, 31, 0, 0, 0));
        assert_eq!(Period::Day.end_of(t), at(2024, 1, 1, 0, 0, 0));
        let midnight = at(2024, 1, 1, 0, 0, 0);
        assert_eq!(Period::Day.start_of(midnight), midnight);
        assert_eq!(Period::Day.end_of(midnight), at(2024, 1, 2, 0, 0, 0));
    }

    #[test]
    fn week_starts_monday_across_month_and_year_ends() {
        // 2025-01-01 is a Wednesday; its week began Monday 2024-12-30.
        let t = at(2025, 1, 1, 12, 0, 0);
        assert_eq!(Period::Week.start_of(t), at(2024, 12, 30, 0, 0, 0));
        assert_eq!(Period::Week.end_of(t), at(2025, 1, 6, 0, 0, 0));
        // A Sunday belongs to the week that started six days before.
        let sunday = at(2024, 3, 3, 23, 0, 0);
        assert_eq!(Period::Week.start_of(sunday), at(2024, 2, 26, 0, 0, 0));
        // A Monday at midnight starts its own week.
        let monday = at(2024, 3, 4, 0, 0, 0);
        assert_eq!(Period::Week.start_of(monday), monday);
        assert_eq!(Period::Week.end_of(monday), at(2024, 3, 11, 0, 0, 0));
    }

    #[test]
    fn month_bounds_across_leap_days_and_year_end() {
        let leap = at(2024, 2, 29, 18, 30, 0);
        assert_eq!(Period::Month.start_of(leap), at(2024, 2, 1, 0, 0, 0));
        assert_eq!(Period::Month.end_of(leap), at(2024, 3, 1, 0, 0, 0));
        let not_leap = at(2023, 2, 28, 23, 59, 59);
        assert_eq!(Period::Month.end_of(not_leap), at(2023, 3, 1, 0, 0, 0));
        let century_not_leap = at(2100, 2, 28, 0, 0, 0);
        assert_eq!(
            Period::Month.end_of(century_not_leap),
            at(2100, 3, 1, 0, 0, 0)
        );
        let december = at(2024, 12, 31, 23, 59, 59);
        assert_eq!(Period::Month.start_of(december), at(2024, 12, 1, 0, 0, 0));
        assert_eq!(Period::Month.end_of(december), at(2025, 1, 1, 0, 0, 0));
        assert_eq!(Period::Day.end_of(leap), at(2024, 3, 1, 0, 0, 0));
    }

    #[test]
    fn manual_clock_moves_only_when_told_and_clones_share_time() {
        let clock = ManualClock::new(at(2024, 1, 1, 0, 0, 0));
        let other = clock.clone();
        assert_eq!(clock.now(), clock.now());
        clock.advance(Duration::from_millis(1500));
        assert_eq!(
            other.now(),
            at(2024, 1, 1, 0, 0, 1) + chrono::Duration::milliseconds(500)
        );
        other.set(at(2030, 6, 1, 0, 0, 0));
        assert_eq!(clock.now(), at(2030, 6, 1, 0, 0, 0));
    }

    #[test]
    fn serde_uses_limit_reset_names() {
        assert_eq!(serde_json::to_string(&Period::Week).unwrap(), "\"weekly\"");
        let parsed: Period = serde_json::from_str("\"monthly\"").unwrap();
        assert_eq!(parsed, Period::Month);
        assert!(serde_json::from_str::<Period>("\"yearly\"").is_err());
    }

    proptest! {
        #[test]
        fn every_instant_lies_in_its_period(seconds in 0i64..8_000_000_000, micros in 0u32..1_000_000) {
            let instant = DateTime::from_timestamp(seconds, micros * 1000).unwrap();
            for period in [Period::Day, Period::Week, Period::Month] {
                let start = period.start_of(instant);
                let end = period.end_of(instant);
                prop_assert!(start <= instant && instant < end);
                prop_assert_eq!(period.start_of(end), end);
                prop_assert_eq!(period.start_of(start), start);
                let length_days = (end - start).num_days();
                match period {
                    Period::Day => prop_assert_eq!(length_days, 1),
                    Period::Week => {
                        prop_assert_eq!(length_days, 7);
                        prop_assert_eq!(start.weekday(), chrono::Weekday::Mon);
                    }
                    Period::Month => {
                        prop_assert!((28..=31).contains(&length_days));
                        prop_assert_eq!(start.day(), 1);
                    }
                }
            }
        }
    }
}
