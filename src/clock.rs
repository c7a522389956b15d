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

use chrono::{DateTime, Datelike, Months, NaiveDate, TimeZone, Utc};
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
        from_unix_micros(self.bounds_micros(unix_micros(instant)).0)
    }

    /// The first instant after the period containing `instant` (its end,
    /// exclusive): the moment the period resets.
    pub fn end_of(self, instant: DateTime<Utc>) -> DateTime<Utc> {
        from_unix_micros(self.bounds_micros(unix_micros(instant)).1)
    }

    /// Start and end (exclusive) of the period containing `instant_micros`,
    /// in µs since the epoch. Days and weeks are plain arithmetic (UTC has
    /// no DST and the store ignores leap seconds, as Unix time does); only
    /// months need the calendar. The counters ask this on every request.
    pub(crate) fn bounds_micros(self, instant_micros: i64) -> (i64, i64) {
        const DAY_MICROS: i64 = 86_400_000_000;
        let day = instant_micros.div_euclid(DAY_MICROS);
        match self {
            Period::Day => (day * DAY_MICROS, (day + 1) * DAY_MICROS),
            Period::Week => {
                // 1970-01-01 was a Thursday, three days after a Monday.
                let monday = day - (day + 3).rem_euclid(7);
                (monday * DAY_MICROS, (monday + 7) * DAY_MICROS)
            }
            Period::Month => {
                let date = from_unix_micros(instant_micros).date_naive();
                let first = date.with_day(1).expect("day 1 exists in every month");
                let next = first + Months::new(1);
                (unix_micros(midnight(first)), unix_micros(midnight(next)))
            }
        }
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

pub(crate) fn from_unix_micros(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(micros).expect("within chrono's range")
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
                let date = instant.date_naive();
                let calendar_start = match period {
                    Period::Day => date,
                    Period::Week => date - chrono::Days::new(u64::from(date.weekday().num_days_from_monday())),
                    Period::Month => date.with_day(1).unwrap(),
                };
                prop_assert_eq!(start, midnight(calendar_start));
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
