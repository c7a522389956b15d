//! The store's file: created readable by its owner alone, opened with the
//! store's pragmas, its schema migrated to [`SQLITE_SCHEMA_VERSION`] or
//! refused when newer.

use std::path::Path;

use rusqlite::Connection;
use rusqlite::config::DbConfig;

use super::store::{SqliteStoreConfig, backend, sql};
use super::{busy, counters, ledger, records};
use crate::store::{StoreError, StoreErrorKind};

/// The page size of a file this version creates.
const PAGE_BYTES: i64 = 1024;

/// The schema this version writes (`PRAGMA user_version`). A file at an
/// older version is migrated when opened; a newer one is refused.
pub const SQLITE_SCHEMA_VERSION: i64 = 3;

/// SQLite's page cache, in KiB.
const CACHE_KIB: i64 = 16 * 1024;

/// Prepared statements kept: more than the store has.
const STATEMENT_CACHE_CAPACITY: usize = 128;

/// Opens the file at `path` (created private if absent) with the store's
/// pragmas and its schema brought up to date.
pub(super) fn open_connection(
    path: &Path,
    config: &SqliteStoreConfig,
) -> Result<Connection, StoreError> {
    create_private(path)?;
    let connection = Connection::open(path).map_err(sql("open"))?;
    busy::wait_in_small_steps(&connection).map_err(sql("open"))?;
    // The migration below runs on this thread; the store's own statements
    // on its thread, which sets the same limit.
    busy::limit_waits_on_this_thread(config.busy_timeout);
    // Every statement the store runs stays prepared: parsing one costs
    // more than running it.
    connection.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    // Plans that never depend on the values bound (the query planner
    // stability guarantee). Otherwise SQLite plans with a parameter that is
    // a LIMIT alone (and, once ANALYZE has run on the file, with any
    // compared to an indexed column) and compiles the statement again each
    // time it is bound anew: a fifth of the store thread's time went to
    // compiling the bounded deletes. Each statement here has one index to
    // use whatever the values.
    connection
        .set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(sql("open"))?;
    // Small pages for a new file (an existing one keeps its own): a chat
    // request changes about 15 pages, each written to the WAL and copied
    // again into the file, and at 4 KiB that was 60 KiB twice per request,
    // the I/O behind the store's latency tail. Set before the WAL, which
    // fixes it.
    connection
        .pragma_update(None, "page_size", PAGE_BYTES)
        .map_err(sql("open"))?;
    connection
        .pragma_update(None, "journal_mode", "WAL")
        .map_err(sql("open"))?;
    let synchronous = if config.synchronous_full {
        "FULL"
    } else {
        "NORMAL"
    };
    connection
        .pragma_update(None, "synchronous", synchronous)
        .map_err(sql("open"))?;
    // The working set of a busy gateway (its accounts, keys and the
    // requests of the last minutes) read from SQLite's page cache, not
    // with a system call each; bounded, so that resident memory stays flat
    // however many records the file keeps (hence no memory map either:
    // its pages would count as resident as the file grows).
    connection
        .pragma_update(None, "cache_size", -CACHE_KIB)
        .map_err(sql("open"))?;
    // Checkpoints are the checkpointer's (checkpoint.rs); this only bounds
    // the WAL should it fall behind.
    connection
        .pragma_update(
            None,
            "wal_autocheckpoint",
            super::checkpoint::wal_bound_pages(&connection).map_err(sql("open"))?,
        )
        .map_err(sql("open"))?;
    migrate(&connection)?;
    Ok(connection)
}

/// Creates the file at `path`, if absent, readable by its owner alone: it
/// holds key hashes, balances and the accounts' own provider keys. SQLite
/// gives its `-wal` and `-shm` files the same permissions. A file made
/// before (by a version that did not restrict it) is tightened to the same.
fn create_private(path: &Path) -> Result<(), StoreError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        // Made already (by an earlier start, or another process now).
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => tighten(path),
        Err(error) => Err(backend("open", format!("{}: {error}", path.display()))),
    }
}

/// Makes the existing store file at `path`, and its `-wal` and `-shm` when
/// present, readable by their owner alone, logging each one changed: a
/// file made before modelgate restricted it may be readable by everyone.
#[cfg(unix)]
fn tighten(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    let mut names = vec![path.to_path_buf()];
    for suffix in ["-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        names.push(name.into());
    }
    for (index, name) in names.iter().enumerate() {
        let mode = match std::fs::metadata(name) {
            Ok(metadata) => metadata.permissions().mode() & 0o777,
            // The journal files come and go with the connections.
            Err(error) if index > 0 && error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(backend("open", format!("{}: {error}", name.display()))),
        };
        if mode & 0o077 == 0 {
            continue;
        }
        std::fs::set_permissions(name, std::fs::Permissions::from_mode(mode & 0o700)).map_err(
            |error| {
                backend(
                    "open",
                    format!(
                        "{} is readable by others ({mode:o}) and could not be made private: {error}",
                        name.display()
                    ),
                )
            },
        )?;
        tracing::warn!(
            file = %name.display(),
            was = %format!("{mode:o}"),
            now = %format!("{:o}", mode & 0o700),
            "the store file was readable by others; it holds key hashes, balances and accounts' provider keys, so it is now readable by its owner alone"
        );
    }
    Ok(())
}

/// Nothing to tighten where files have no Unix modes.
#[cfg(not(unix))]
fn tighten(_: &Path) -> Result<(), StoreError> {
    Ok(())
}

/// Brings the schema to [`SQLITE_SCHEMA_VERSION`] in one transaction.
fn migrate(connection: &Connection) -> Result<(), StoreError> {
    connection
        .execute_batch("BEGIN IMMEDIATE")
        .map_err(sql("open"))?;
    let outcome = (|| {
        let version: i64 = connection
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(sql("open"))?;
        if version > SQLITE_SCHEMA_VERSION {
            return Err(StoreError::new(
                "open",
                StoreErrorKind::Layout(format!(
                    "this file was written by a newer modelgate (schema {version}; this version \
                     reads up to {SQLITE_SCHEMA_VERSION}): run that version, or start from a new file"
                )),
            ));
        }
        if version < 1 {
            for schema in [counters::SCHEMA, ledger::SCHEMA, records::SCHEMA] {
                connection.execute_batch(schema).map_err(sql("open"))?;
            }
        } else {
            let steps = [(2, ledger::SCHEMA_2), (3, ledger::SCHEMA_3)];
            for (_, step) in steps.iter().filter(|(to, _)| version < *to) {
                connection.execute_batch(step).map_err(sql("open"))?;
            }
        }
        connection
            .pragma_update(None, "user_version", SQLITE_SCHEMA_VERSION)
            .map_err(sql("open"))
    })();
    let end = if outcome.is_ok() {
        "COMMIT"
    } else {
        "ROLLBACK"
    };
    connection.execute_batch(end).map_err(sql("open"))?;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;

    fn store_in(directory: &tempfile::TempDir) -> SqliteStore {
        SqliteStore::open(directory.path().join("m.db"), SqliteStoreConfig::default()).unwrap()
    }

    fn user_version(path: &Path) -> i64 {
        Connection::open(path)
            .unwrap()
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap()
    }

    fn page_size(path: &Path) -> i64 {
        Connection::open(path)
            .unwrap()
            .query_row("PRAGMA page_size", [], |row| row.get(0))
            .unwrap()
    }

    #[tokio::test]
    async fn a_new_file_gets_small_pages_and_an_older_one_keeps_its_own() {
        use crate::store::LedgerStore;
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("m.db");
        drop(store_in(&directory));
        assert_eq!(page_size(&path), PAGE_BYTES);

        // A file with 4 KiB pages, as earlier versions made them: opened,
        // migrated and written, its pages stay as they were.
        let older = directory.path().join("older.db");
        let connection = Connection::open(&older).unwrap();
        connection.pragma_update(None, "page_size", 4096).unwrap();
        connection
            .pragma_update(None, "journal_mode", "WAL")
            .unwrap();
        drop(connection);
        let store = SqliteStore::open(&older, SqliteStoreConfig::default()).unwrap();
        store.top_up("acct", 5).await.unwrap();
        drop(store);
        assert_eq!(page_size(&older), 4096);
        let store = SqliteStore::open(&older, SqliteStoreConfig::default()).unwrap();
        assert_eq!(
            store.account_balance("acct").await.unwrap().balance_nanos,
            5
        );
    }

    #[test]
    fn a_new_file_gets_the_current_schema_and_keeps_it() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("m.db");
        drop(store_in(&directory));
        assert_eq!(user_version(&path), SQLITE_SCHEMA_VERSION);
        // Opened again: nothing is created twice.
        drop(store_in(&directory));
        assert_eq!(user_version(&path), SQLITE_SCHEMA_VERSION);
        let mode: String = Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA journal_mode", [], |row| row.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    #[cfg(unix)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_file_and_its_wal_are_readable_by_their_owner_alone() {
        use crate::store::LedgerStore;
        use std::os::unix::fs::PermissionsExt;
        let directory = tempfile::tempdir().unwrap();
        let store = store_in(&directory);
        store.top_up("acct", 1).await.unwrap();
        for name in ["m.db", "m.db-wal", "m.db-shm"] {
            let mode = std::fs::metadata(directory.path().join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{name}: {mode:o}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_file_made_readable_by_others_is_tightened_at_open_with_its_journal() {
        use std::os::unix::fs::PermissionsExt;
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("m.db");
        drop(store_in(&directory));
        // As a version before the restriction left them, journal included.
        for name in ["m.db", "m.db-wal", "m.db-shm"] {
            let name = directory.path().join(name);
            if !name.exists() {
                std::fs::write(&name, b"").unwrap();
            }
            std::fs::set_permissions(&name, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let store = store_in(&directory);
        for name in ["m.db", "m.db-wal", "m.db-shm"] {
            let mode = std::fs::metadata(directory.path().join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{name}: {mode:o}");
        }
        drop(store);
        assert_eq!(user_version(&path), SQLITE_SCHEMA_VERSION);
    }

    #[test]
    fn a_schema_1_file_is_migrated_and_keeps_its_rows() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("m.db");
        drop(store_in(&directory));
        // Schema 1 is schema 3 without the holds' admission instants and
        // models, and the records' keys.
        let connection = Connection::open(&path).unwrap();
        connection
            .execute_batch(
                "ALTER TABLE ledger_requests DROP COLUMN admitted_at_micros;
                 ALTER TABLE ledger_requests DROP COLUMN record_model;
                 DROP INDEX ledger_generations_by_key;
                 ALTER TABLE ledger_generations DROP COLUMN key_hash;
                 INSERT INTO ledger_requests (account, id, state, key, at_micros, amount_nanos, covered)
                     VALUES ('acct', 'r1', 'H', 'k', 5, 7, 1);
                 PRAGMA user_version = 1;",
            )
            .unwrap();
        drop(connection);
        drop(store_in(&directory));
        assert_eq!(user_version(&path), SQLITE_SCHEMA_VERSION);
        let (amount_nanos, admitted_at_micros): (i64, Option<i64>) = Connection::open(&path)
            .unwrap()
            .query_row(
                "SELECT amount_nanos, admitted_at_micros FROM ledger_requests WHERE id = 'r1'",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!((amount_nanos, admitted_at_micros), (7, None));
    }

    #[test]
    fn a_schema_2_file_is_migrated_and_its_records_name_their_keys() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("m.db");
        drop(store_in(&directory));
        // Schema 2 is schema 3 without the records' keys and the holds'
        // models.
        let connection = Connection::open(&path).unwrap();
        connection
            .execute_batch(
                r#"DROP INDEX ledger_generations_by_key;
                 ALTER TABLE ledger_generations DROP COLUMN key_hash;
                 ALTER TABLE ledger_requests DROP COLUMN record_model;
                 INSERT INTO ledger_generations (account, id, record, expires_at_micros)
                     VALUES ('acct', 'r1', '{"id":"gen-r1","key_hash":"k1"}', 5),
                            ('acct', 'r2', 'not json', 6);
                 PRAGMA user_version = 2;"#,
            )
            .unwrap();
        drop(connection);
        drop(store_in(&directory));
        assert_eq!(user_version(&path), SQLITE_SCHEMA_VERSION);
        let keys: Vec<(String, Option<String>)> = Connection::open(&path)
            .unwrap()
            .prepare("SELECT id, key_hash FROM ledger_generations ORDER BY id")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            keys,
            [
                ("r1".to_owned(), Some("k1".to_owned())),
                ("r2".to_owned(), None)
            ]
        );
    }

    #[test]
    fn a_file_a_newer_version_wrote_is_refused_naming_both_schemas() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("m.db");
        drop(store_in(&directory));
        Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", SQLITE_SCHEMA_VERSION + 1)
            .unwrap();
        let error = SqliteStore::open(&path, SqliteStoreConfig::default()).unwrap_err();
        assert!(matches!(error.kind(), StoreErrorKind::Layout(_)), "{error}");
        let message = error.to_string();
        assert!(
            message.contains(&format!("schema {}", SQLITE_SCHEMA_VERSION + 1))
                && message.contains(&format!("up to {SQLITE_SCHEMA_VERSION}")),
            "{message}"
        );
        // Refused, not changed.
        assert_eq!(user_version(&path), SQLITE_SCHEMA_VERSION + 1);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_refused() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("m.db");
        std::fs::write(
            &path,
            b"not a database, only text that is long enough to matter",
        )
        .unwrap();
        assert!(SqliteStore::open(&path, SqliteStoreConfig::default()).is_err());
    }
}
