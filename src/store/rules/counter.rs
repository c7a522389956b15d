//! The counters' decisions: one check against one counter's state, and
//! several checks as one all-or-nothing step. `MemoryStore` keeps the
//! states in maps, `SqliteStore` in rows; both decide with these, and the
//! Redis Functions (`counters.lua`) decide the same way (a differential
//! test holds them equal).

use std::collections::VecDeque;

use chrono::{DateTime, Utc};

use crate::clock::unix_micros;
use crate::store::counter::{duration_micros, micros_duration, window_bounds_micros};
use crate::store::{Check, CheckOutcome, FastMap, Limit};

/// How long a counter outlives its window, as `RedisStoreConfig::expiry_slack`
/// does: a caller whose clock reads a little earlier still finds it.
pub(crate) const EXPIRY_SLACK_MICROS: i64 = 10_000_000;

/// One counter's state, as every store but Redis keeps it.
#[derive(Debug)]
pub(crate) struct Counter {
    pub(crate) state: CounterState,
    /// After this instant the counter holds nothing and may be dropped.
    pub(crate) expires_at_micros: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WindowCount {
    pub(crate) start_micros: i64,
    pub(crate) end_micros: i64,
    pub(crate) used: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CounterState {
    Empty,
    /// Fixed and calendar windows, by start, until they end (plus slack).
    Windows(Vec<WindowCount>),
    Rolling {
        entries: VecDeque<(i64, u64)>,
        used: u64,
    },
    Gcra {
        theoretical_arrival_micros: i64,
    },
}

fn counter_mut<'a>(counters: &'a mut FastMap<Box<str>, Counter>, name: &str) -> &'a mut Counter {
    if !counters.contains_key(name) {
        counters.insert(
            name.into(),
            Counter {
                state: CounterState::Empty,
                expires_at_micros: i64::MIN,
            },
        );
    }
    counters.get_mut(name).expect("inserted above")
}

/// Evaluates one check against its counter; when `commit`, adds the amount.
/// Returns whether the amount fits and the outcome as it stands afterwards.
fn check_one(
    counter: &mut Counter,
    check: &Check,
    now_micros: i64,
    (start_micros, end_micros): (i64, i64),
    commit: bool,
) -> CheckOutcome {
    let amount = check.amount;
    match check.limit {
        Limit::FixedWindow { limit, .. } | Limit::Calendar { limit, .. } => {
            if !matches!(counter.state, CounterState::Windows(_)) {
                counter.state = CounterState::Windows(Vec::new());
            }
            let CounterState::Windows(windows) = &mut counter.state else {
                unreachable!("set to windows above")
            };
            // Windows are kept by their start, as Redis keys them, so a
            // caller whose clock reads a moment earlier (or who lost the race
            // for the lock at an edge) counts in its own window and never
            // resets a newer one.
            windows.retain(|window| {
                window.end_micros.saturating_add(EXPIRY_SLACK_MICROS) > now_micros
            });
            let index = windows
                .iter()
                .position(|window| window.start_micros == start_micros);
            let used = index.map_or(0, |index| windows[index].used);
            let fits = used.checked_add(amount).is_some_and(|total| total <= limit);
            let used = if fits && commit && amount > 0 {
                match index {
                    Some(index) => windows[index].used += amount,
                    None => windows.push(WindowCount {
                        start_micros,
                        end_micros,
                        used: amount,
                    }),
                }
                counter.expires_at_micros = counter.expires_at_micros.max(end_micros);
                used + amount
            } else {
                used
            };
            let window_left = micros_duration(end_micros - now_micros);
            CheckOutcome {
                admitted: fits,
                limit,
                used,
                remaining: limit.saturating_sub(used),
                retry_after: if fits {
                    Default::default()
                } else {
                    window_left
                },
                reset_after: if used > 0 {
                    window_left
                } else {
                    Default::default()
                },
            }
        }
        Limit::Rolling { limit, window } => {
            let window_micros = duration_micros(window);
            if !matches!(counter.state, CounterState::Rolling { .. }) {
                counter.state = CounterState::Rolling {
                    entries: VecDeque::new(),
                    used: 0,
                };
            }
            let CounterState::Rolling { entries, used } = &mut counter.state else {
                unreachable!("set to rolling above")
            };
            // An entry made at `t` counts while `now < t + window`.
            let cutoff = now_micros.saturating_sub(window_micros);
            while let Some(&(at, entry_amount)) = entries.front() {
                if at > cutoff {
                    break;
                }
                *used -= entry_amount;
                entries.pop_front();
            }
            let fits = used.checked_add(amount).is_some_and(|total| total <= limit);
            if fits && commit && amount > 0 {
                // Sorted by time even when this caller's clock reads earlier
                // than the last one's, so pruning from the front stays exact.
                let index = entries.partition_point(|&(at, _)| at <= now_micros);
                entries.insert(index, (now_micros, amount));
                *used += amount;
                counter.expires_at_micros = counter
                    .expires_at_micros
                    .max(now_micros.saturating_add(window_micros));
            }
            let retry_after = if fits {
                0
            } else {
                // The earliest instant when enough old entries have left the window.
                let needed = used.saturating_add(amount).saturating_sub(limit);
                let mut freed = 0u64;
                entries
                    .iter()
                    .find_map(|&(at, entry_amount)| {
                        freed += entry_amount;
                        (freed >= needed && amount <= limit)
                            .then(|| at + window_micros - now_micros)
                    })
                    .unwrap_or(window_micros)
            };
            let reset_after = entries
                .back()
                .map_or(0, |&(at, _)| at + window_micros - now_micros);
            CheckOutcome {
                admitted: fits,
                limit,
                used: *used,
                remaining: limit.saturating_sub(*used),
                retry_after: micros_duration(retry_after),
                reset_after: micros_duration(reset_after),
            }
        }
        Limit::Gcra {
            rate,
            period,
            burst,
        } => {
            let emission_micros = i128::from(duration_micros(period) / rate as i64);
            let tolerance_micros = emission_micros * i128::from(burst);
            let now_wide = i128::from(now_micros);
            let stored = match counter.state {
                CounterState::Gcra {
                    theoretical_arrival_micros,
                } => i128::from(theoretical_arrival_micros),
                _ => now_wide,
            };
            let arrival = stored.max(now_wide);
            let new_arrival = arrival + emission_micros * i128::from(amount);
            let fits = new_arrival - now_wide <= tolerance_micros;
            let arrival = if fits && commit && amount > 0 {
                let new_arrival = i64::try_from(new_arrival).unwrap_or(i64::MAX);
                counter.state = CounterState::Gcra {
                    theoretical_arrival_micros: new_arrival,
                };
                counter.expires_at_micros = new_arrival;
                i128::from(new_arrival)
            } else {
                arrival
            };
            let backlog = arrival - now_wide;
            let used = u64::try_from((backlog + emission_micros - 1) / emission_micros)
                .unwrap_or(u64::MAX);
            let retry_after = if fits {
                0
            } else {
                new_arrival - now_wide - tolerance_micros
            };
            CheckOutcome {
                admitted: fits,
                limit: burst,
                used,
                remaining: burst.saturating_sub(used),
                retry_after: micros_duration(i64::try_from(retry_after).unwrap_or(i64::MAX)),
                reset_after: micros_duration(i64::try_from(backlog).unwrap_or(i64::MAX)),
            }
        }
    }
}

/// Checks every counter of `checks` under one lock: whether all fit, and
/// when they do and `commit`, adds to all; never to some.
pub(crate) fn check_all(
    counters: &mut FastMap<Box<str>, Counter>,
    checks: &[Check],
    now: DateTime<Utc>,
    commit: bool,
) -> (bool, Vec<CheckOutcome>) {
    let fit = Fit::of(counters, checks, now);
    let outcomes = fit.outcomes(counters, checks, commit);
    (fit.admitted, outcomes)
}

/// [`check_all`] in two steps, for a caller that decides something else
/// in between (an admission takes its hold): whether every check fits,
/// then each one's outcome, adding to all when they fit and the caller
/// commits. The counters must not change between the two.
pub(crate) struct Fit {
    /// Whether every check fits.
    pub(crate) admitted: bool,
    now_micros: i64,
    bounds: Vec<(i64, i64)>,
}

impl Fit {
    /// Whether every one of `checks` fits at `now`; nothing is added.
    pub(crate) fn of(
        counters: &mut FastMap<Box<str>, Counter>,
        checks: &[Check],
        now: DateTime<Utc>,
    ) -> Fit {
        let now_micros = unix_micros(now);
        let bounds: Vec<(i64, i64)> = checks
            .iter()
            .map(|check| window_bounds_micros(&check.limit, now))
            .collect();
        let admitted = checks.iter().zip(&bounds).all(|(check, &bounds)| {
            let counter = counter_mut(counters, &check.name);
            check_one(counter, check, now_micros, bounds, false).admitted
        });
        Fit {
            admitted,
            now_micros,
            bounds,
        }
    }

    /// Each check's outcome (the `checks` this was made of), every amount
    /// added when all fit and `commit`.
    pub(crate) fn outcomes(
        &self,
        counters: &mut FastMap<Box<str>, Counter>,
        checks: &[Check],
        commit: bool,
    ) -> Vec<CheckOutcome> {
        checks
            .iter()
            .zip(&self.bounds)
            .map(|(check, &bounds)| {
                let counter = counter_mut(counters, &check.name);
                check_one(
                    counter,
                    check,
                    self.now_micros,
                    bounds,
                    self.admitted && commit,
                )
            })
            .collect()
    }
}
