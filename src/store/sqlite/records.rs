//! Records and app usage in SQLite.
//!
//! The semantics are `MemoryStore`'s, decided inside the store thread's
//! transaction: a record's place in its collection is its row id (given
//! at creation, kept by rewrites, so newest first is the row id
//! descending), and an expired record reads as absent at once. A file has
//! no TTLs, so expired rows are deleted by later calls, a bounded batch
//! each: a write, delete or listing removes its collection's, and a write
//! that gives a record a lifetime (whose clock those records are judged
//! by, as on `MemoryStore`) removes the soonest expired of any collection.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use super::{SqliteStore, sql};
use crate::clock::{Period, unix_micros};
use crate::store::apps::{MAX_APP_USAGE_ROWS, validate_app_usage};
use crate::store::counter::duration_micros;
use crate::store::records::validate_put;
use crate::store::rules::ledger::period_starts_micros;
use crate::store::rules::records::expectation_holds;
use crate::store::{
    AppUsage, AppUsageStore, Expect, PutOptions, PutOutcome, RecordStore, StoreError, Versioned,
    WriteOutcome,
};

/// The tables of records and app usage.
///
/// `record_entry.sequence` is the row id: `max + 1` at each insert, so a
/// record created later always sorts after every record still there.
/// Counts of app usage are stored up to `i64::MAX` (SQLite's integers).
pub(super) const SCHEMA: &str = "
CREATE TABLE record_entry (
    sequence INTEGER PRIMARY KEY,
    collection TEXT NOT NULL,
    id TEXT NOT NULL,
    value BLOB NOT NULL,
    revision INTEGER NOT NULL,
    expires_at_micros INTEGER
);
CREATE UNIQUE INDEX record_entry_by_id ON record_entry (collection, id);
CREATE INDEX record_entry_in_order ON record_entry (collection, sequence);
CREATE INDEX record_entry_expiring_in_collection ON record_entry (collection, expires_at_micros)
    WHERE expires_at_micros IS NOT NULL;
CREATE INDEX record_entry_expiring ON record_entry (expires_at_micros)
    WHERE expires_at_micros IS NOT NULL;

CREATE TABLE app_period (
    scope TEXT NOT NULL,
    period INTEGER NOT NULL,
    start_micros INTEGER NOT NULL,
    row_count INTEGER NOT NULL,
    PRIMARY KEY (scope, period)
) WITHOUT ROWID;
CREATE TABLE app_usage_row (
    scope TEXT NOT NULL,
    period INTEGER NOT NULL,
    app TEXT NOT NULL,
    model TEXT NOT NULL,
    requests INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    PRIMARY KEY (scope, period, app, model)
) WITHOUT ROWID;
CREATE TABLE app_details (
    scope TEXT NOT NULL,
    period INTEGER NOT NULL,
    app TEXT NOT NULL,
    details TEXT NOT NULL,
    PRIMARY KEY (scope, period, app)
) WITHOUT ROWID;
";

/// The most expired records one call deletes from its collection, and
/// again from the whole file: more than one write can create, so they
/// never pile up, yet a call's work stays bounded.
const PURGE_BATCH: i64 = 64;

/// A record as stored: its row id, value, revision and expiry.
struct StoredRow {
    sequence: i64,
    versioned: Versioned<Vec<u8>>,
    expires_at_micros: Option<i64>,
}

impl StoredRow {
    fn is_live(&self, now_micros: i64) -> bool {
        self.expires_at_micros
            .is_none_or(|expires_at_micros| expires_at_micros > now_micros)
    }
}

/// A `usize` as a SQL bound (`LIMIT`, `OFFSET`).
pub(super) fn sql_count(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Deletes up to [`PURGE_BATCH`] records of `collection` expired at `now`.
fn purge_collection(
    connection: &Connection,
    operation: &'static str,
    collection: &str,
    now_micros: i64,
) -> Result<(), StoreError> {
    connection
        .prepare_cached(
            "DELETE FROM record_entry WHERE sequence IN (
                SELECT sequence FROM record_entry INDEXED BY record_entry_expiring_in_collection
                WHERE collection = ?1 AND expires_at_micros <= ?2 LIMIT ?3)",
        )
        .and_then(|mut statement| statement.execute(params![collection, now_micros, PURGE_BATCH]))
        .map_err(sql(operation))?;
    Ok(())
}

/// Deletes up to [`PURGE_BATCH`] records of any collection expired at
/// `now`, the soonest expired first.
fn purge_everywhere(connection: &Connection, now_micros: i64) -> Result<(), StoreError> {
    connection
        .prepare_cached(
            "DELETE FROM record_entry WHERE sequence IN (
                SELECT sequence FROM record_entry INDEXED BY record_entry_expiring
                WHERE expires_at_micros <= ?1 ORDER BY expires_at_micros LIMIT ?2)",
        )
        .and_then(|mut statement| statement.execute(params![now_micros, PURGE_BATCH]))
        .map_err(sql("put_record"))?;
    Ok(())
}

/// The record `id` of `collection`, live or not.
fn stored_row(
    connection: &Connection,
    operation: &'static str,
    collection: &str,
    id: &str,
) -> Result<Option<StoredRow>, StoreError> {
    connection
        .prepare_cached(
            "SELECT sequence, value, revision, expires_at_micros FROM record_entry
             WHERE collection = ?1 AND id = ?2",
        )
        .and_then(|mut statement| {
            statement
                .query_row(params![collection, id], |row| {
                    Ok(StoredRow {
                        sequence: row.get(0)?,
                        versioned: Versioned {
                            value: row.get(1)?,
                            revision: row.get(2)?,
                        },
                        expires_at_micros: row.get(3)?,
                    })
                })
                .optional()
        })
        .map_err(sql(operation))
}

/// The live record `id` of `collection` at `now`; an expired one is
/// deleted and reads as absent, as `MemoryStore`'s purge leaves it.
fn live_row(
    connection: &Connection,
    operation: &'static str,
    collection: &str,
    id: &str,
    now_micros: i64,
) -> Result<Option<StoredRow>, StoreError> {
    match stored_row(connection, operation, collection, id)? {
        Some(row) if !row.is_live(now_micros) => {
            delete_row(connection, operation, row.sequence)?;
            Ok(None)
        }
        current => Ok(current),
    }
}

fn delete_row(
    connection: &Connection,
    operation: &'static str,
    sequence: i64,
) -> Result<(), StoreError> {
    connection
        .prepare_cached("DELETE FROM record_entry WHERE sequence = ?1")
        .and_then(|mut statement| statement.execute([sequence]))
        .map_err(sql(operation))?;
    Ok(())
}

/// The records of `collection` live at `now`: all of them less the
/// expired ones, both counted from indexes alone.
fn live_count(
    connection: &Connection,
    collection: &str,
    now_micros: i64,
) -> Result<u64, StoreError> {
    connection
        .prepare_cached(
            "SELECT (SELECT count(*) FROM record_entry INDEXED BY record_entry_in_order
                     WHERE collection = ?1)
                  - (SELECT count(*) FROM record_entry INDEXED BY record_entry_expiring_in_collection
                     WHERE collection = ?1 AND expires_at_micros <= ?2)",
        )
        .and_then(|mut statement| {
            statement.query_row(params![collection, now_micros], |row| row.get(0))
        })
        .map_err(sql("put_record"))
}

fn put(
    connection: &Connection,
    collection: &str,
    id: &str,
    value: &[u8],
    expect: Expect,
    options: PutOptions,
    now_micros: i64,
) -> Result<PutOutcome, StoreError> {
    const OPERATION: &str = "put_record";
    if options.ttl.is_some() {
        purge_everywhere(connection, now_micros)?;
    }
    purge_collection(connection, OPERATION, collection, now_micros)?;
    let current = live_row(connection, OPERATION, collection, id, now_micros)?;
    if !expectation_holds(current.as_ref().map(|row| row.versioned.revision), expect) {
        return Ok(PutOutcome::Write(WriteOutcome::Conflict {
            current: current.map(|row| row.versioned),
        }));
    }
    if current.is_none()
        && let Some(max_records) = options.max_records
    {
        let live = live_count(connection, collection, now_micros)?;
        if live >= max_records {
            return Ok(PutOutcome::Full { records: live });
        }
    }
    let expires_at_micros = options
        .ttl
        .map(|ttl| now_micros.saturating_add(duration_micros(ttl)));
    let revision = match current {
        Some(row) => {
            let revision = row.versioned.revision + 1;
            connection
                .prepare_cached(
                    "UPDATE record_entry SET value = ?2, revision = ?3, expires_at_micros = ?4
                     WHERE sequence = ?1",
                )
                .and_then(|mut statement| {
                    statement.execute(params![row.sequence, value, revision, expires_at_micros])
                })
                .map_err(sql(OPERATION))?;
            revision
        }
        None => {
            connection
                .prepare_cached(
                    "INSERT INTO record_entry (collection, id, value, revision, expires_at_micros)
                     VALUES (?1, ?2, ?3, 1, ?4)",
                )
                .and_then(|mut statement| {
                    statement.execute(params![collection, id, value, expires_at_micros])
                })
                .map_err(sql(OPERATION))?;
            1
        }
    };
    Ok(PutOutcome::Write(WriteOutcome::Written { revision }))
}

#[async_trait]
impl RecordStore for SqliteStore {
    async fn get_record_at(
        &self,
        collection: &str,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Versioned<Vec<u8>>>, StoreError> {
        const OPERATION: &str = "get_record";
        let (collection, id, now_micros) = (collection.to_owned(), id.to_owned(), unix_micros(now));
        self.call(OPERATION, move |connection| {
            Ok(stored_row(connection, OPERATION, &collection, &id)?
                .filter(|row| row.is_live(now_micros))
                .map(|row| row.versioned))
        })
        .await
    }

    async fn put_record_at(
        &self,
        collection: &str,
        id: &str,
        value: &[u8],
        expect: Expect,
        options: PutOptions,
        now: DateTime<Utc>,
    ) -> Result<PutOutcome, StoreError> {
        validate_put(&options)?;
        let (collection, id, value) = (collection.to_owned(), id.to_owned(), value.to_vec());
        let now_micros = unix_micros(now);
        self.call("put_record", move |connection| {
            put(
                connection,
                &collection,
                &id,
                &value,
                expect,
                options,
                now_micros,
            )
        })
        .await
    }

    async fn delete_record_at(
        &self,
        collection: &str,
        id: &str,
        expect: Expect,
        now: DateTime<Utc>,
    ) -> Result<WriteOutcome, StoreError> {
        const OPERATION: &str = "delete_record";
        let (collection, id, now_micros) = (collection.to_owned(), id.to_owned(), unix_micros(now));
        self.call(OPERATION, move |connection| {
            purge_collection(connection, OPERATION, &collection, now_micros)?;
            let current = live_row(connection, OPERATION, &collection, &id, now_micros)?;
            if !expectation_holds(current.as_ref().map(|row| row.versioned.revision), expect) {
                return Ok(WriteOutcome::Conflict {
                    current: current.map(|row| row.versioned),
                });
            }
            if let Some(row) = current {
                delete_row(connection, OPERATION, row.sequence)?;
            }
            Ok(WriteOutcome::Written { revision: 0 })
        })
        .await
    }

    async fn list_records_at(
        &self,
        collection: &str,
        offset: usize,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Vec<(String, Versioned<Vec<u8>>)>, StoreError> {
        const OPERATION: &str = "list_records";
        let (collection, now_micros) = (collection.to_owned(), unix_micros(now));
        self.call(OPERATION, move |connection| {
            purge_collection(connection, OPERATION, &collection, now_micros)?;
            let mut statement = connection
                .prepare_cached(
                    "SELECT id, value, revision FROM record_entry INDEXED BY record_entry_in_order
                     WHERE collection = ?1
                       AND (expires_at_micros IS NULL OR expires_at_micros > ?2)
                     ORDER BY sequence DESC LIMIT ?3 OFFSET ?4",
                )
                .map_err(sql(OPERATION))?;
            let rows = statement
                .query_map(
                    params![collection, now_micros, sql_count(limit), sql_count(offset)],
                    |row| {
                        Ok((
                            row.get(0)?,
                            Versioned {
                                value: row.get(1)?,
                                revision: row.get(2)?,
                            },
                        ))
                    },
                )
                .map_err(sql(OPERATION))?;
            rows.collect::<Result<_, _>>().map_err(sql(OPERATION))
        })
        .await
    }
}

/// `period`'s index in [`PERIODS`], its number in `app_period.period`.
fn period_index(period: Period) -> usize {
    match period {
        Period::Day => 0,
        Period::Week => 1,
        Period::Month => 2,
    }
}

/// The stored start and row count of `scope`'s `period`; a period never
/// written starts at 0 with no rows, as `MemoryStore`'s default does.
fn stored_period(
    connection: &Connection,
    operation: &'static str,
    scope: &str,
    period: i64,
) -> Result<(i64, i64), StoreError> {
    connection
        .prepare_cached(
            "SELECT start_micros, row_count FROM app_period WHERE scope = ?1 AND period = ?2",
        )
        .and_then(|mut statement| {
            statement
                .query_row(params![scope, period], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .map(Option::unwrap_or_default)
        .map_err(sql(operation))
}

/// A count added to a stored one, saturating at what SQLite holds.
fn add_count(stored: i64, added: u64) -> i64 {
    i64::try_from(added).map_or(i64::MAX, |added| stored.saturating_add(added))
}

fn add_to_period(
    connection: &Connection,
    scope: &str,
    period: i64,
    start_micros: i64,
    rows: &[AppUsage],
) -> Result<(), StoreError> {
    const OPERATION: &str = "add_app_usage";
    let (stored_start_micros, mut row_count) = stored_period(connection, OPERATION, scope, period)?;
    // Periods only roll forward; a write stamped in one that has already
    // rolled over counts nowhere.
    if start_micros < stored_start_micros {
        return Ok(());
    }
    if start_micros > stored_start_micros {
        for statement in [
            "DELETE FROM app_usage_row WHERE scope = ?1 AND period = ?2",
            "DELETE FROM app_details WHERE scope = ?1 AND period = ?2",
        ] {
            connection
                .prepare_cached(statement)
                .and_then(|mut statement| statement.execute(params![scope, period]))
                .map_err(sql(OPERATION))?;
        }
        row_count = 0;
    }
    for row in rows {
        let counted: Option<(i64, i64)> = connection
            .prepare_cached(
                "SELECT requests, tokens FROM app_usage_row
                 WHERE scope = ?1 AND period = ?2 AND app = ?3 AND model = ?4",
            )
            .and_then(|mut statement| {
                statement
                    .query_row(params![scope, period, row.app, row.model], |found| {
                        Ok((found.get(0)?, found.get(1)?))
                    })
                    .optional()
            })
            .map_err(sql(OPERATION))?;
        let (requests, tokens) = match counted {
            Some(counted) => counted,
            None if row_count >= sql_count(MAX_APP_USAGE_ROWS) => continue,
            None => {
                row_count += 1;
                (0, 0)
            }
        };
        connection
            .prepare_cached(
                "INSERT OR REPLACE INTO app_usage_row (scope, period, app, model, requests, tokens)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut statement| {
                statement.execute(params![
                    scope,
                    period,
                    row.app,
                    row.model,
                    add_count(requests, row.requests),
                    add_count(tokens, row.tokens),
                ])
            })
            .map_err(sql(OPERATION))?;
        connection
            .prepare_cached(
                "INSERT OR REPLACE INTO app_details (scope, period, app, details)
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut statement| {
                statement.execute(params![scope, period, row.app, row.details])
            })
            .map_err(sql(OPERATION))?;
    }
    connection
        .prepare_cached(
            "INSERT OR REPLACE INTO app_period (scope, period, start_micros, row_count)
             VALUES (?1, ?2, ?3, ?4)",
        )
        .and_then(|mut statement| {
            statement.execute(params![scope, period, start_micros, row_count])
        })
        .map_err(sql(OPERATION))?;
    Ok(())
}

#[async_trait]
impl AppUsageStore for SqliteStore {
    async fn add_app_usage(
        &self,
        scope: &str,
        rows: &[AppUsage],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        validate_app_usage(rows)?;
        let (scope, rows) = (scope.to_owned(), rows.to_vec());
        let starts = period_starts_micros(now);
        self.call("add_app_usage", move |connection| {
            for (period, start_micros) in (0..).zip(starts) {
                add_to_period(connection, &scope, period, start_micros, &rows)?;
            }
            Ok(())
        })
        .await
    }

    async fn app_usage(
        &self,
        scope: &str,
        period: Period,
        now: DateTime<Utc>,
    ) -> Result<Vec<AppUsage>, StoreError> {
        const OPERATION: &str = "app_usage";
        let index = period_index(period);
        let start_micros = period_starts_micros(now)[index];
        let period = index as i64;
        let scope = scope.to_owned();
        self.call(OPERATION, move |connection| {
            let (stored_start_micros, _) = stored_period(connection, OPERATION, &scope, period)?;
            if stored_start_micros != start_micros {
                return Ok(Vec::new());
            }
            let mut statement = connection
                .prepare_cached(
                    "SELECT counted.app, coalesce(shown.details, ''), counted.model,
                            counted.requests, counted.tokens
                     FROM app_usage_row AS counted
                     LEFT JOIN app_details AS shown
                       ON shown.scope = counted.scope AND shown.period = counted.period
                      AND shown.app = counted.app
                     WHERE counted.scope = ?1 AND counted.period = ?2",
                )
                .map_err(sql(OPERATION))?;
            let rows = statement
                .query_map(params![scope, period], |row| {
                    Ok(AppUsage {
                        app: row.get(0)?,
                        details: row.get(1)?,
                        model: row.get(2)?,
                        requests: row.get(3)?,
                        tokens: row.get(4)?,
                    })
                })
                .map_err(sql(OPERATION))?;
            rows.collect::<Result<_, _>>().map_err(sql(OPERATION))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::TimeZone;
    use proptest::prelude::*;

    use super::*;
    use crate::store::{KEYS, MemoryStore, StoreErrorKind, flows};

    const SECOND: i64 = 1_000_000;

    fn at(micros: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(0, 0).unwrap() + chrono::Duration::microseconds(micros)
    }

    fn open() -> (tempfile::TempDir, SqliteStore) {
        let directory = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(
            directory.path().join("modelgate.db"),
            super::super::SqliteStoreConfig::default(),
        )
        .unwrap();
        (directory, store)
    }

    /// The record rows in the file, expired ones not yet deleted included.
    async fn rows_in_file(store: &SqliteStore) -> i64 {
        store
            .call("test", |connection| {
                connection
                    .query_row("SELECT count(*) FROM record_entry", [], |row| row.get(0))
                    .map_err(sql("test"))
            })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn expired_records_are_deleted_from_the_file_by_later_calls_a_batch_at_a_time() {
        let (_directory, store) = open();
        let week_micros = 7 * 86_400 * SECOND;
        let week = PutOptions::expiring(Duration::from_secs(7 * 86_400));
        for session in 0..100 {
            let collection = flows(&format!("s{session}"));
            let outcome = store
                .put_record_at(&collection, "f", b"v", Expect::Absent, week, at(0))
                .await
                .unwrap();
            assert_eq!(
                outcome,
                PutOutcome::Write(WriteOutcome::Written { revision: 1 })
            );
        }
        // A write without a lifetime, years after `at(0)`, deletes
        // nothing: only the clock of the writers that gave records their
        // lifetime decides, as on `MemoryStore`.
        let years_later = at(520 * week_micros);
        store
            .put_record_at(
                KEYS,
                "k",
                b"v",
                Expect::Any,
                PutOptions::default(),
                years_later,
            )
            .await
            .unwrap();
        assert_eq!(rows_in_file(&store).await, 101);
        // Each expiring write a week later deletes one batch, of any
        // collection, until none is left.
        for (later, rows_left) in [(1, 101 + 1 - PURGE_BATCH), (2, 3)] {
            store
                .put_record_at(
                    &flows(&format!("new{later}")),
                    "f",
                    b"v",
                    Expect::Absent,
                    week,
                    at(week_micros + later),
                )
                .await
                .unwrap();
            assert_eq!(rows_in_file(&store).await, rows_left);
        }
        // A collection's own calls delete its expired records too.
        let crowded = flows("crowded");
        let second = PutOptions::expiring(Duration::from_secs(1));
        for index in 0..100 {
            store
                .put_record_at(
                    &crowded,
                    &format!("f{index}"),
                    b"v",
                    Expect::Absent,
                    second,
                    at(week_micros),
                )
                .await
                .unwrap();
        }
        assert_eq!(rows_in_file(&store).await, 103);
        let later = at(week_micros + SECOND);
        assert!(
            store
                .list_records_at(&crowded, 0, 10, later)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(rows_in_file(&store).await, 103 - PURGE_BATCH);
        store
            .delete_record_at(&crowded, "f0", Expect::Any, later)
            .await
            .unwrap();
        assert_eq!(rows_in_file(&store).await, 3);
    }

    #[tokio::test]
    async fn records_and_app_usage_outlive_the_store_that_wrote_them() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("modelgate.db");
        let config = super::super::SqliteStoreConfig::default;
        let store = SqliteStore::open(&path, config()).unwrap();
        store
            .put_record_at(
                KEYS,
                "k",
                b"v",
                Expect::Absent,
                PutOptions::default(),
                at(0),
            )
            .await
            .unwrap();
        let row = AppUsage {
            app: "a".into(),
            details: "{}".into(),
            model: "m".into(),
            requests: 1,
            tokens: 7,
        };
        store
            .add_app_usage("*", std::slice::from_ref(&row), at(0))
            .await
            .unwrap();
        drop(store);
        let store = SqliteStore::open(&path, config()).unwrap();
        assert_eq!(
            store.get_record_at(KEYS, "k", at(0)).await.unwrap(),
            Some(Versioned {
                value: b"v".to_vec(),
                revision: 1
            })
        );
        assert_eq!(
            store.app_usage("*", Period::Month, at(0)).await.unwrap(),
            [row]
        );
    }

    #[tokio::test]
    async fn counts_past_what_sqlite_holds_saturate() {
        let (_directory, store) = open();
        let huge = AppUsage {
            app: "a".into(),
            details: String::new(),
            model: "m".into(),
            requests: crate::store::MAX_EXACT,
            tokens: crate::store::MAX_EXACT,
        };
        let rows = vec![huge; 1100];
        store.add_app_usage("*", &rows, at(0)).await.unwrap();
        let counted = store.app_usage("*", Period::Day, at(0)).await.unwrap();
        assert_eq!(counted[0].requests, i64::MAX as u64);
    }

    #[derive(Clone, Debug)]
    enum RecordOp {
        Get {
            collection: u8,
            id: u8,
        },
        Put {
            collection: u8,
            id: u8,
            value: u8,
            expect: Expect,
            options: PutOptions,
        },
        Delete {
            collection: u8,
            id: u8,
            expect: Expect,
        },
        List {
            collection: u8,
            offset: usize,
            limit: usize,
        },
        Advance {
            micros: i64,
        },
    }

    fn expect() -> impl Strategy<Value = Expect> {
        prop_oneof![
            Just(Expect::Any),
            Just(Expect::Absent),
            (0u64..4).prop_map(Expect::Revision),
        ]
    }

    /// Lifetimes on a 1 s grid (zero now and then, which is refused), so
    /// records often expire exactly at a call's `now`.
    fn options() -> impl Strategy<Value = PutOptions> {
        (prop::option::of(0u64..6), prop::option::of(0u64..4)).prop_map(
            |(ttl_secs, max_records)| PutOptions {
                ttl: ttl_secs.map(Duration::from_secs),
                max_records,
            },
        )
    }

    fn record_op() -> impl Strategy<Value = RecordOp> {
        prop_oneof![
            2 => (0u8..2, 0u8..5).prop_map(|(collection, id)| RecordOp::Get { collection, id }),
            5 => (0u8..2, 0u8..5, any::<u8>(), expect(), options()).prop_map(
                |(collection, id, value, expect, options)| RecordOp::Put {
                    collection, id, value, expect, options,
                }
            ),
            2 => (0u8..2, 0u8..5, expect())
                .prop_map(|(collection, id, expect)| RecordOp::Delete { collection, id, expect }),
            2 => (0u8..2, 0usize..4, 0usize..7)
                .prop_map(|(collection, offset, limit)| RecordOp::List { collection, offset, limit }),
            2 => (0i64..3).prop_map(|seconds| RecordOp::Advance { micros: seconds * SECOND }),
        ]
    }

    /// A call's answer, errors by their message, so both stores compare.
    fn answer<T: std::fmt::Debug>(outcome: Result<T, StoreError>) -> Result<String, String> {
        outcome.map(|value| format!("{value:?}")).map_err(|error| {
            assert!(
                matches!(error.kind(), StoreErrorKind::Invalid(_)),
                "{error}"
            );
            error.to_string()
        })
    }

    async fn apply<S: RecordStore>(
        store: &S,
        op: &RecordOp,
        now: DateTime<Utc>,
    ) -> Result<String, String> {
        let collection = |index: u8| flows(&format!("s{index}"));
        match *op {
            RecordOp::Get {
                collection: index,
                id,
            } => answer(
                store
                    .get_record_at(&collection(index), &id.to_string(), now)
                    .await,
            ),
            RecordOp::Put {
                collection: index,
                id,
                value,
                expect,
                options,
            } => answer(
                store
                    .put_record_at(
                        &collection(index),
                        &id.to_string(),
                        &[value],
                        expect,
                        options,
                        now,
                    )
                    .await,
            ),
            RecordOp::Delete {
                collection: index,
                id,
                expect,
            } => answer(
                store
                    .delete_record_at(&collection(index), &id.to_string(), expect, now)
                    .await,
            ),
            RecordOp::List {
                collection: index,
                offset,
                limit,
            } => answer(
                store
                    .list_records_at(&collection(index), offset, limit, now)
                    .await,
            ),
            RecordOp::Advance { .. } => Ok(String::new()),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Random puts, gets, deletes and listings, with conditions,
        /// lifetimes and caps, in time that moves forward: SqliteStore
        /// answers every call as MemoryStore does.
        #[test]
        fn records_answer_as_memory_does(ops in proptest::collection::vec(record_op(), 1..80)) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let (_directory, sqlite) = open();
            let memory = MemoryStore::new();
            let mut now_micros = 0i64;
            for (step, op) in ops.iter().enumerate() {
                if let RecordOp::Advance { micros } = *op {
                    now_micros += micros;
                }
                let now = at(now_micros);
                let expected = runtime.block_on(apply(&memory, op, now));
                let actual = runtime.block_on(apply(&sqlite, op, now));
                prop_assert_eq!(actual, expected, "step {} {:?} at {}", step, op, now_micros);
            }
        }
    }
}
