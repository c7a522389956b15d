//! Counters and in-flight slots: limits, checks and their outcomes, shared
//! by every backend.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::StoreError;
use crate::clock::{Period, unix_micros};

/// The largest limit or amount a counter takes: every integer up to 2^53 is
/// exact in a Lua number (a double), so Redis and memory agree on them all.
pub const MAX_EXACT: u64 = 1 << 53;

/// The longest holder id a slot takes: ids are per request, and a bound
/// keeps one caller from filling a shared slot set with megabytes.
const MAX_HOLDER_BYTES: usize = 128;

/// A bound on how much may be added to a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// At most `limit` per window aligned to the Unix epoch (`[k·window, (k+1)·window)`).
    FixedWindow {
        /// Most that may be added in one window.
        limit: u64,
        /// The window's length (at least 1 µs).
        window: Duration,
    },
    /// At most `limit` in *any* interval of length `window`: an exact
    /// sliding log, so no burst at a window edge can exceed the bound.
    Rolling {
        /// Most that may be added in any window.
        limit: u64,
        /// The window's length (at least 1 µs).
        window: Duration,
    },
    /// GCRA (a leaky bucket as a meter): `rate` per `period` sustained, up to
    /// `burst` at once.
    Gcra {
        /// Sustained amount per period.
        rate: u64,
        /// The period of `rate`.
        period: Duration,
        /// Largest amount admitted at once (the bucket's size, at least 1).
        burst: u64,
    },
    /// At most `limit` per UTC calendar period (day, week from Monday, month).
    Calendar {
        /// Most that may be added in one period.
        limit: u64,
        /// The period.
        period: Period,
    },
}

impl Limit {
    /// The most the counter can hold: `limit`, or `burst` for GCRA.
    pub fn capacity(&self) -> u64 {
        match *self {
            Limit::FixedWindow { limit, .. }
            | Limit::Rolling { limit, .. }
            | Limit::Calendar { limit, .. } => limit,
            Limit::Gcra { burst, .. } => burst,
        }
    }

    /// The same limit with another capacity (`limit`, or `burst` for GCRA).
    pub(crate) fn with_capacity(self, capacity: u64) -> Limit {
        match self {
            Limit::FixedWindow { window, .. } => Limit::FixedWindow {
                limit: capacity,
                window,
            },
            Limit::Rolling { window, .. } => Limit::Rolling {
                limit: capacity,
                window,
            },
            Limit::Calendar { period, .. } => Limit::Calendar {
                limit: capacity,
                period,
            },
            Limit::Gcra { rate, period, .. } => Limit::Gcra {
                rate,
                period,
                burst: capacity,
            },
        }
    }

    pub(crate) fn validate(&self) -> Result<(), &'static str> {
        if self.capacity() > MAX_EXACT {
            return Err("limit must be at most 2^53");
        }
        match *self {
            Limit::FixedWindow { window, .. } | Limit::Rolling { window, .. } => {
                if window.as_micros() == 0 {
                    return Err("window must be at least 1 µs");
                }
                if window.as_micros() > u128::from(MAX_EXACT) {
                    return Err("window must be at most 2^53 µs (285 years)");
                }
            }
            Limit::Gcra {
                rate,
                period,
                burst,
            } => {
                if rate == 0 || burst == 0 {
                    return Err("gcra rate and burst must be at least 1");
                }
                let emission_micros = period.as_micros() / u128::from(rate);
                if emission_micros == 0 {
                    return Err("gcra period / rate must be at least 1 µs");
                }
                if emission_micros * u128::from(burst) > u128::from(MAX_EXACT) {
                    return Err("gcra period / rate × burst must be at most 2^53 µs");
                }
            }
            Limit::Calendar { .. } => {}
        }
        Ok(())
    }
}

/// One counter to check, and how much to add to it if every check admits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Check {
    /// The counter's name within its scope (for example `free:minute`).
    pub name: String,
    /// Its bound.
    pub limit: Limit,
    /// How much this request adds (usually 1). Zero only reads the counter.
    pub amount: u64,
}

impl Check {
    /// A check of `name` against `limit` that adds `amount`.
    pub fn new(name: impl Into<String>, limit: Limit, amount: u64) -> Self {
        Check {
            name: name.into(),
            limit,
            amount,
        }
    }
}

/// What a check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckOutcome {
    /// Whether this check alone would admit the request.
    pub admitted: bool,
    /// The counter's capacity (`Limit::capacity`).
    pub limit: u64,
    /// What the counter holds now: after adding when the whole decision
    /// admitted, unchanged otherwise.
    pub used: u64,
    /// `limit - used`, what may still be added now.
    pub remaining: u64,
    /// How long until this request's amount would fit; zero when it fits now.
    pub retry_after: Duration,
    /// How long until the counter is back to empty (full capacity remaining).
    pub reset_after: Duration,
}

/// The result of checking several counters as one step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// True when every check admitted and every amount was added; false
    /// when any check rejected, in which case nothing was added anywhere.
    pub admitted: bool,
    /// One outcome per check, in the order given.
    pub outcomes: Vec<CheckOutcome>,
}

impl Decision {
    /// The index of the first check that rejected.
    pub fn rejected_by(&self) -> Option<usize> {
        self.outcomes.iter().position(|outcome| !outcome.admitted)
    }

    /// The longest wait among the rejecting checks: when retrying earlier is futile.
    pub fn retry_after(&self) -> Duration {
        self.outcomes
            .iter()
            .filter(|outcome| !outcome.admitted)
            .map(|outcome| outcome.retry_after)
            .max()
            .unwrap_or_default()
    }
}

/// What taking an in-flight slot found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotOutcome {
    /// Whether the holder holds a slot now (taken or renewed); when false
    /// nothing changed.
    pub acquired: bool,
    /// Unexpired leases after the call, the holder's own included.
    pub held: u64,
    /// How many slots there are, as asked.
    pub limit: u64,
    /// When refused: until the earliest lease expires; zero when acquired.
    pub retry_after: Duration,
}

/// Atomic check-and-add on named counters, and in-flight slots, scoped by
/// account.
///
/// All checks of one call belong to one scope (an account), are evaluated
/// together and are applied all or none: a request checked against a
/// per-minute and a per-day counter consumes from neither when either
/// rejects. On Redis a call is one script run in one Cluster slot.
///
/// Slots bound how many requests are in flight at once: each is a lease
/// that ends by itself, so a holder that crashes before giving its slot
/// back blocks it for one lease at most.
#[async_trait]
pub trait CounterStore: Send + Sync + 'static {
    /// Checks every counter of `checks` in `scope` at `now`; adds every
    /// amount when all admit, nothing otherwise. Names must be distinct.
    async fn check_and_add(
        &self,
        scope: &str,
        checks: &[Check],
        now: DateTime<Utc>,
    ) -> Result<Decision, StoreError>;

    /// Whether the store answers now, for a readiness probe; an
    /// in-process store always does.
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Takes one of `limit` slots named `name` in `scope` for `holder` until
    /// `now + lease`; refused (nothing changes) when `limit` unexpired leases are held.
    /// Expired leases are dropped first, so a crashed holder frees its slot when its lease ends.
    /// Taking a slot already held by the same `holder` renews it and counts once.
    ///
    /// `limit` is from 1 to [`MAX_EXACT`], `lease` from 1 ms to
    /// [`MAX_EXACT`] µs, and `holder` 1 to 128 bytes.
    async fn acquire_slot(
        &self,
        scope: &str,
        name: &str,
        holder: &str,
        limit: u64,
        lease: Duration,
        now: DateTime<Utc>,
    ) -> Result<SlotOutcome, StoreError>;

    /// Gives back `holder`'s slot; giving back a slot not held is not an error.
    async fn release_slot(&self, scope: &str, name: &str, holder: &str) -> Result<(), StoreError>;
}

pub(crate) fn validate_slot(limit: u64, lease: Duration, holder: &str) -> Result<(), StoreError> {
    const OPERATION: &str = "acquire_slot";
    if limit == 0 || limit > MAX_EXACT {
        return Err(StoreError::invalid(
            OPERATION,
            "slot limit must be from 1 to 2^53",
        ));
    }
    // A shorter lease would end before a round trip to the store does.
    if lease < Duration::from_millis(1) {
        return Err(StoreError::invalid(
            OPERATION,
            "lease must be at least 1 ms",
        ));
    }
    if lease.as_micros() > u128::from(MAX_EXACT) {
        return Err(StoreError::invalid(
            OPERATION,
            "lease must be at most 2^53 µs (285 years)",
        ));
    }
    if holder.is_empty() || holder.len() > MAX_HOLDER_BYTES {
        return Err(StoreError::invalid(
            OPERATION,
            format!("holder must be 1 to {MAX_HOLDER_BYTES} bytes"),
        ));
    }
    Ok(())
}

pub(crate) fn validate_checks(operation: &'static str, checks: &[Check]) -> Result<(), StoreError> {
    for (index, check) in checks.iter().enumerate() {
        if check.amount > MAX_EXACT {
            return Err(StoreError::invalid(
                operation,
                format!("check {:?}: amount must be at most 2^53", check.name),
            ));
        }
        check.limit.validate().map_err(|reason| {
            StoreError::invalid(operation, format!("check {:?}: {reason}", check.name))
        })?;
        if checks[..index]
            .iter()
            .any(|earlier| earlier.name == check.name)
        {
            return Err(StoreError::invalid(
                operation,
                format!("counter {:?} is checked twice in one call", check.name),
            ));
        }
    }
    Ok(())
}

/// The window of a fixed or calendar limit at `now`, as µs since the epoch.
pub(crate) fn window_bounds_micros(limit: &Limit, now: DateTime<Utc>) -> (i64, i64) {
    let now_micros = unix_micros(now);
    match *limit {
        Limit::FixedWindow { window, .. } => {
            let window_micros = duration_micros(window);
            let start = now_micros.div_euclid(window_micros) * window_micros;
            (start, start.saturating_add(window_micros))
        }
        Limit::Calendar { period, .. } => period.bounds_micros(now_micros),
        Limit::Rolling { .. } | Limit::Gcra { .. } => (now_micros, now_micros),
    }
}

/// A duration in whole µs, saturating at `i64::MAX`.
pub(crate) fn duration_micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// A non-negative µs count back into a `Duration`.
pub(crate) fn micros_duration(micros: i64) -> Duration {
    Duration::from_micros(u64::try_from(micros).unwrap_or(0))
}
