//! Counters and slots in SQLite.
//!
//! A counter is a row per (scope, name) holding its state in a compact
//! blob; every decision is made by the rules (`store::rules`) over the rows
//! a call reads, as `MemoryStore` decides over its maps. A slot set is a row per
//! lease. A file has no TTLs: each call removes a bounded batch of rows
//! that have ended.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};
use std::time::Duration;

use super::{SqliteStore, sql};
use crate::clock::unix_micros;
use crate::store::counter::{duration_micros, validate_checks, validate_slot};
use crate::store::rules::counter::{
    self, Counter, CounterState, EXPIRY_SLACK_MICROS, Fit, WindowCount,
};
use crate::store::rules::slots::{self, SlotsView};
use crate::store::{Check, CheckOutcome, CounterStore, Decision, FastMap, SlotOutcome, StoreError};

/// The tables of counters and slots.
pub(super) const SCHEMA: &str = "
CREATE TABLE counter_state (
    scope TEXT NOT NULL,
    name TEXT NOT NULL,
    state BLOB NOT NULL,
    expires_at_micros INTEGER NOT NULL,
    PRIMARY KEY (scope, name)
);
CREATE INDEX counter_state_by_expiry ON counter_state (expires_at_micros);
CREATE TABLE slot_lease (
    scope TEXT NOT NULL,
    name TEXT NOT NULL,
    holder TEXT NOT NULL,
    ends_at_micros INTEGER NOT NULL,
    PRIMARY KEY (scope, name, holder)
);
CREATE INDEX slot_lease_by_end ON slot_lease (ends_at_micros);
";

/// The most ended rows (counters, leases) one call removes: more than a
/// call can create, so they never pile up, and a bounded cost per call.
const ENDED_ROWS_PER_CALL: i64 = 32;

/// The operation named by errors of the counters' rows.
const COUNTER_OPERATION: &str = "check_and_add";

/// Decides `checks` of `scope` at `now` inside the caller's transaction,
/// by the rules: whether all fit and each one's outcome; when all
/// fit and `commit`, adds every amount.
pub(super) fn check_all(
    connection: &Connection,
    scope: &str,
    checks: &[Check],
    now: DateTime<Utc>,
    commit: bool,
) -> Result<(bool, Vec<CheckOutcome>), StoreError> {
    let mut counters = ScopeCounters::read(connection, scope, checks, now)?;
    let decided = counters.decide(checks, now, commit);
    counters.write(connection, checks)?;
    Ok(decided)
}

/// The counters of a scope that some checks name, read once inside the
/// caller's transaction (after the ended rows are removed) and decided on
/// by the rules as often as the caller needs, as `MemoryStore` decides
/// over its map: an admission decides, takes its hold, then adds.
pub(super) struct ScopeCounters<'s> {
    scope: &'s str,
    counters: FastMap<Box<str>, Counter>,
    // Each counter's row as read, to write back only the ones that changed.
    read: Vec<Option<(Vec<u8>, i64)>>,
}

impl<'s> ScopeCounters<'s> {
    /// The rows of `scope` that `checks` name.
    pub(super) fn read(
        connection: &Connection,
        scope: &'s str,
        checks: &[Check],
        now: DateTime<Utc>,
    ) -> Result<Self, StoreError> {
        remove_ended_counters(connection, unix_micros(now))?;
        let mut counters: FastMap<Box<str>, Counter> = FastMap::default();
        let mut read: Vec<Option<(Vec<u8>, i64)>> = Vec::with_capacity(checks.len());
        let mut select = connection
            .prepare_cached(
                "SELECT state, expires_at_micros FROM counter_state WHERE scope = ?1 AND name = ?2",
            )
            .map_err(sql(COUNTER_OPERATION))?;
        for check in checks {
            let row: Option<(Vec<u8>, i64)> = select
                .query_row(params![scope, check.name], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .optional()
                .map_err(sql(COUNTER_OPERATION))?;
            if let Some((state, expires_at_micros)) = &row {
                let state = decode_state(state).map_err(|reason| {
                    StoreError::corrupt(
                        COUNTER_OPERATION,
                        format!("counter {:?} of {scope:?}: {reason}", check.name),
                    )
                })?;
                counters.insert(
                    check.name.as_str().into(),
                    Counter {
                        state,
                        expires_at_micros: *expires_at_micros,
                    },
                );
            }
            read.push(row);
        }
        Ok(ScopeCounters {
            scope,
            counters,
            read,
        })
    }

    /// The rules' decision on `checks` (those [`read`](Self::read) was
    /// given) at `now`: whether all fit and each one's outcome; when all
    /// fit and `commit`, every amount is added (in memory until
    /// [`write`](Self::write)).
    pub(super) fn decide(
        &mut self,
        checks: &[Check],
        now: DateTime<Utc>,
        commit: bool,
    ) -> (bool, Vec<CheckOutcome>) {
        counter::check_all(&mut self.counters, checks, now, commit)
    }

    /// Whether every one of `checks` fits at `now`, nothing added: the
    /// first half of [`decide`](Self::decide), for a caller that decides
    /// its hold before [`outcomes`](Self::outcomes).
    pub(super) fn fit(&mut self, checks: &[Check], now: DateTime<Utc>) -> Fit {
        Fit::of(&mut self.counters, checks, now)
    }

    /// The second half of [`decide`](Self::decide) after [`fit`](Self::fit).
    pub(super) fn outcomes(
        &mut self,
        fit: &Fit,
        checks: &[Check],
        commit: bool,
    ) -> Vec<CheckOutcome> {
        fit.outcomes(&mut self.counters, checks, commit)
    }

    /// Writes back the counters that changed since they were read.
    pub(super) fn write(self, connection: &Connection, checks: &[Check]) -> Result<(), StoreError> {
        let mut upsert = connection
            .prepare_cached(
                "INSERT INTO counter_state (scope, name, state, expires_at_micros) \
                 VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (scope, name) DO UPDATE SET \
                 state = excluded.state, expires_at_micros = excluded.expires_at_micros",
            )
            .map_err(sql(COUNTER_OPERATION))?;
        for (check, row) in checks.iter().zip(self.read) {
            // Absent when never decided on: nothing changed then.
            let Some(counter) = self.counters.get(check.name.as_str()) else {
                continue;
            };
            // A counter nothing was ever added to holds nothing worth a row.
            if row.is_none() && counter.expires_at_micros == i64::MIN {
                continue;
            }
            let state = encode_state(&counter.state);
            // Unchanged unless something was added or has aged out.
            if row.as_ref().is_some_and(|(read_state, read_expiry)| {
                *read_state == state && *read_expiry == counter.expires_at_micros
            }) {
                continue;
            }
            upsert
                .execute(params![
                    self.scope,
                    check.name,
                    state,
                    counter.expires_at_micros
                ])
                .map_err(sql(COUNTER_OPERATION))?;
        }
        Ok(())
    }
}

/// Removes up to [`ENDED_ROWS_PER_CALL`] counters past their end and the
/// slack memory keeps them for.
fn remove_ended_counters(connection: &Connection, now_micros: i64) -> Result<(), StoreError> {
    connection
        .prepare_cached(
            "DELETE FROM counter_state WHERE rowid IN (SELECT rowid FROM counter_state \
             WHERE expires_at_micros <= ?1 LIMIT ?2)",
        )
        .and_then(|mut delete| {
            delete.execute(params![
                now_micros.saturating_sub(EXPIRY_SLACK_MICROS),
                ENDED_ROWS_PER_CALL
            ])
        })
        .map_err(sql(COUNTER_OPERATION))?;
    Ok(())
}

const TAG_EMPTY: u8 = 0;
const TAG_WINDOWS: u8 = 1;
const TAG_ROLLING: u8 = 2;
const TAG_GCRA: u8 = 3;

/// A counter's state as a blob: a tag byte, then fixed-width little-endian
/// integers (windows: start, end, used; rolling: each entry's instant and
/// amount, its total being their sum; GCRA: the theoretical arrival).
fn encode_state(state: &CounterState) -> Vec<u8> {
    match state {
        CounterState::Empty => vec![TAG_EMPTY],
        CounterState::Windows(windows) => {
            let mut bytes = Vec::with_capacity(1 + 24 * windows.len());
            bytes.push(TAG_WINDOWS);
            for window in windows {
                bytes.extend_from_slice(&window.start_micros.to_le_bytes());
                bytes.extend_from_slice(&window.end_micros.to_le_bytes());
                bytes.extend_from_slice(&window.used.to_le_bytes());
            }
            bytes
        }
        CounterState::Rolling { entries, .. } => {
            let mut bytes = Vec::with_capacity(1 + 16 * entries.len());
            bytes.push(TAG_ROLLING);
            for (at_micros, amount) in entries {
                bytes.extend_from_slice(&at_micros.to_le_bytes());
                bytes.extend_from_slice(&amount.to_le_bytes());
            }
            bytes
        }
        CounterState::Gcra {
            theoretical_arrival_micros,
        } => {
            let mut bytes = Vec::with_capacity(9);
            bytes.push(TAG_GCRA);
            bytes.extend_from_slice(&theoretical_arrival_micros.to_le_bytes());
            bytes
        }
    }
}

/// The state [`encode_state`] wrote, or why `bytes` is not one.
fn decode_state(bytes: &[u8]) -> Result<CounterState, &'static str> {
    fn word(bytes: &[u8]) -> [u8; 8] {
        bytes.try_into().expect("chunks of 8 bytes")
    }
    let Some((&tag, body)) = bytes.split_first() else {
        return Err("an empty counter state");
    };
    match tag {
        TAG_EMPTY if body.is_empty() => Ok(CounterState::Empty),
        TAG_WINDOWS if body.len() % 24 == 0 => Ok(CounterState::Windows(
            body.chunks_exact(24)
                .map(|window| WindowCount {
                    start_micros: i64::from_le_bytes(word(&window[..8])),
                    end_micros: i64::from_le_bytes(word(&window[8..16])),
                    used: u64::from_le_bytes(word(&window[16..])),
                })
                .collect(),
        )),
        TAG_ROLLING if body.len() % 16 == 0 => {
            let entries: std::collections::VecDeque<(i64, u64)> = body
                .chunks_exact(16)
                .map(|entry| {
                    (
                        i64::from_le_bytes(word(&entry[..8])),
                        u64::from_le_bytes(word(&entry[8..])),
                    )
                })
                .collect();
            // Pruning from the front relies on the order; the total on the sum.
            if entries
                .iter()
                .zip(entries.iter().skip(1))
                .any(|(earlier, later)| earlier.0 > later.0)
            {
                return Err("rolling entries out of order");
            }
            let used = entries
                .iter()
                .try_fold(0u64, |total, &(_, amount)| total.checked_add(amount))
                .ok_or("rolling entries past 2^64")?;
            Ok(CounterState::Rolling { entries, used })
        }
        TAG_GCRA if body.len() == 8 => Ok(CounterState::Gcra {
            theoretical_arrival_micros: i64::from_le_bytes(word(body)),
        }),
        TAG_EMPTY | TAG_WINDOWS | TAG_ROLLING | TAG_GCRA => {
            Err("a counter state of the wrong length")
        }
        _ => Err("an unknown counter state"),
    }
}

/// Removes up to [`ENDED_ROWS_PER_CALL`] leases past their end and the
/// slack memory keeps them for, in any slot set.
fn remove_ended_leases(connection: &Connection, now_micros: i64) -> Result<(), StoreError> {
    connection
        .prepare_cached(
            "DELETE FROM slot_lease WHERE rowid IN (SELECT rowid FROM slot_lease \
             WHERE ends_at_micros <= ?1 LIMIT ?2)",
        )
        .and_then(|mut delete| {
            delete.execute(params![
                now_micros.saturating_sub(EXPIRY_SLACK_MICROS),
                ENDED_ROWS_PER_CALL
            ])
        })
        .map_err(sql("acquire_slot"))?;
    Ok(())
}

/// The rules' acquisition over the rows of one slot set.
fn acquire(
    connection: &Connection,
    (scope, name, holder): (&str, &str, &str),
    limit: u64,
    lease_micros: i64,
    now_micros: i64,
) -> rusqlite::Result<SlotOutcome> {
    // A lease ending at `t` is held while `now < t`.
    connection
        .prepare_cached(
            "DELETE FROM slot_lease WHERE scope = ?1 AND name = ?2 AND ends_at_micros <= ?3",
        )?
        .execute(params![scope, name, now_micros])?;
    let (held, earliest_end_micros, renewing): (i64, Option<i64>, bool) = connection
        .prepare_cached(
            "SELECT count(*), min(ends_at_micros), coalesce(max(holder = ?3), 0) \
             FROM slot_lease WHERE scope = ?1 AND name = ?2",
        )?
        .query_row(params![scope, name, holder], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })?;
    let view = SlotsView {
        held: held as u64,
        earliest_end_micros,
        renewing,
    };
    let (outcome, lease_end) = slots::acquire(view, limit, lease_micros, now_micros);
    if let Some(ends_at_micros) = lease_end {
        connection
            .prepare_cached(
                "INSERT INTO slot_lease (scope, name, holder, ends_at_micros) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (scope, name, holder) DO UPDATE SET ends_at_micros = excluded.ends_at_micros",
            )?
            .execute(params![scope, name, holder, ends_at_micros])?;
    }
    Ok(outcome)
}

#[async_trait]
impl CounterStore for SqliteStore {
    async fn check_and_add(
        &self,
        scope: &str,
        checks: &[Check],
        now: DateTime<Utc>,
    ) -> Result<Decision, StoreError> {
        validate_checks("check_and_add", checks)?;
        let scope = scope.to_owned();
        let checks = checks.to_vec();
        self.call("check_and_add", move |connection| {
            let (admitted, outcomes) = check_all(connection, &scope, &checks, now, true)?;
            Ok(Decision { admitted, outcomes })
        })
        .await
    }

    async fn acquire_slot(
        &self,
        scope: &str,
        name: &str,
        holder: &str,
        limit: u64,
        lease: Duration,
        now: DateTime<Utc>,
    ) -> Result<SlotOutcome, StoreError> {
        validate_slot(limit, lease, holder)?;
        let (scope, name, holder) = (scope.to_owned(), name.to_owned(), holder.to_owned());
        let lease_micros = duration_micros(lease);
        let now_micros = unix_micros(now);
        self.call("acquire_slot", move |connection| {
            remove_ended_leases(connection, now_micros)?;
            acquire(
                connection,
                (&scope, &name, &holder),
                limit,
                lease_micros,
                now_micros,
            )
            .map_err(sql("acquire_slot"))
        })
        .await
    }

    async fn release_slot(&self, scope: &str, name: &str, holder: &str) -> Result<(), StoreError> {
        let (scope, name, holder) = (scope.to_owned(), name.to_owned(), holder.to_owned());
        self.call("release_slot", move |connection| {
            connection
                .prepare_cached(
                    "DELETE FROM slot_lease WHERE scope = ?1 AND name = ?2 AND holder = ?3",
                )
                .and_then(|mut delete| delete.execute(params![scope, name, holder]))
                .map_err(sql("release_slot"))?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;
    use crate::clock::from_unix_micros;
    use crate::store::{Limit, SqliteStoreConfig};

    const SECOND_MICROS: i64 = 1_000_000;

    async fn row_count(store: &SqliteStore, table: &'static str) -> i64 {
        store
            .call("test", move |connection| {
                connection
                    .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
                        row.get(0)
                    })
                    .map_err(sql("test"))
            })
            .await
            .expect("count the rows")
    }

    #[tokio::test]
    async fn ended_counter_and_slot_rows_are_removed_by_later_calls() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let store = SqliteStore::open(
            directory.path().join("modelgate.db"),
            SqliteStoreConfig::default(),
        )
        .expect("open the store");
        // On a minute's start, so the windows end at `at(60)`.
        let start_micros = 28_333_333 * 60 * SECOND_MICROS;
        let at = |seconds: i64| from_unix_micros(start_micros + seconds * SECOND_MICROS);
        let minute = Limit::FixedWindow {
            limit: 5,
            window: Duration::from_secs(60),
        };
        // More rows than one call removes, so removal takes several calls.
        let rows = 2 * ENDED_ROWS_PER_CALL + 5;
        for index in 0..rows {
            let check = Check::new(format!("counter-{index}"), minute, 1);
            let decision = store
                .check_and_add("acct", &[check], at(0))
                .await
                .expect("check");
            assert!(decision.admitted);
            let slot = store
                .acquire_slot(
                    "acct",
                    &format!("slot-{index}"),
                    "holder",
                    1,
                    Duration::from_secs(10),
                    at(0),
                )
                .await
                .expect("acquire");
            assert!(slot.acquired);
        }
        assert_eq!(row_count(&store, "counter_state").await, rows);
        assert_eq!(row_count(&store, "slot_lease").await, rows);

        // Within the slack after their ends, the rows stay.
        let read = [Check::new("other", minute, 0)];
        store
            .check_and_add("acct", &read, at(65))
            .await
            .expect("check");
        store
            .acquire_slot("acct", "other", "h", 1, Duration::from_secs(1), at(15))
            .await
            .expect("acquire");
        assert_eq!(row_count(&store, "counter_state").await, rows);
        assert_eq!(row_count(&store, "slot_lease").await, rows + 1);

        // Past it, each call removes one bounded batch.
        let later = at(60 + 11);
        store
            .check_and_add("acct", &read, later)
            .await
            .expect("check");
        assert_eq!(
            row_count(&store, "counter_state").await,
            rows - ENDED_ROWS_PER_CALL
        );
        store
            .acquire_slot("acct", "other", "h", 1, Duration::from_secs(1), at(10 + 11))
            .await
            .expect("acquire");
        // The batch, and "other"'s own ended lease (replaced by its new one).
        assert_eq!(
            row_count(&store, "slot_lease").await,
            rows - ENDED_ROWS_PER_CALL + 1
        );
        for _ in 0..2 {
            store
                .check_and_add("acct", &read, later)
                .await
                .expect("check");
            store
                .acquire_slot("acct", "other", "h", 1, Duration::from_secs(1), at(10 + 11))
                .await
                .expect("acquire");
        }
        assert_eq!(row_count(&store, "counter_state").await, 0);
        assert_eq!(row_count(&store, "slot_lease").await, 1);
    }

    fn counter_state() -> impl Strategy<Value = CounterState> {
        let window = (any::<i64>(), any::<i64>(), any::<u64>()).prop_map(
            |(start_micros, end_micros, used)| WindowCount {
                start_micros,
                end_micros,
                used,
            },
        );
        let rolling = prop::collection::vec((any::<i64>(), 0..=crate::store::MAX_EXACT), 0..40)
            .prop_map(|mut entries| {
                entries.sort_by_key(|&(at_micros, _)| at_micros);
                let used = entries.iter().map(|&(_, amount)| amount).sum();
                CounterState::Rolling {
                    entries: VecDeque::from(entries),
                    used,
                }
            });
        prop_oneof![
            Just(CounterState::Empty),
            prop::collection::vec(window, 0..8).prop_map(CounterState::Windows),
            rolling,
            any::<i64>().prop_map(|theoretical_arrival_micros| CounterState::Gcra {
                theoretical_arrival_micros
            }),
        ]
    }

    proptest! {
        #[test]
        fn a_counter_state_round_trips(state in counter_state()) {
            prop_assert_eq!(decode_state(&encode_state(&state)), Ok(state));
        }

        /// Whatever a file holds, decoding never panics, and what it
        /// accepts is exactly what encoding writes.
        #[test]
        fn any_blob_decodes_to_its_own_encoding_or_is_refused(
            bytes in prop::collection::vec(any::<u8>(), 0..80),
        ) {
            if let Ok(state) = decode_state(&bytes) {
                prop_assert_eq!(encode_state(&state), bytes);
            }
        }
    }
}
