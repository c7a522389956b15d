//! [`SqliteStore`]: every store trait in one SQLite file, for a gateway on
//! one machine that must keep its keys, balances and records across
//! restarts.
//!
//! One thread owns the connection; the async callers send it jobs and
//! never block the runtime. The thread runs the jobs waiting for it
//! together in one transaction (`BEGIN IMMEDIATE`, a savepoint per job, so
//! a job that fails leaves nothing), and answers them once it commits:
//! many settlements cost one commit. Every job reads what it decides on
//! inside that transaction, so two processes opening the same file (WAL,
//! a busy timeout) decide each limit exactly as one would.
//!
//! With `synchronous=NORMAL` (the default) a commit survives the process
//! being killed at any moment, and a power loss may lose the last commits
//! before the latest WAL checkpoint's sync, never the file's consistency.
//! With `FULL` ([`SqliteStoreConfig::synchronous_full`]) every commit is
//! on disk before its callers hear of it, at the cost of a sync per
//! transaction.
//!
//! `ledger.rs`, `counters.rs` and `records.rs` each own their tables and
//! make their decisions with `MemoryStore`'s own functions wherever those
//! are pure, so the stores answer alike; what is forgotten is deleted as
//! the other stores do. The schema's version is `PRAGMA user_version`
//! ([`SQLITE_SCHEMA_VERSION`]): an older file is migrated when opened, a
//! newer one refused. The file is created readable by its owner alone
//! (0600; SQLite gives its `-wal` and `-shm` the same): it holds key
//! hashes, balances and accounts' provider keys. Reservation ids begin
//! with their millisecond, so the ledger's indexes grow at one end.
//!
//! ```
//! use modelgate::store::{LedgerStore, SqliteStore, SqliteStoreConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), modelgate::store::StoreError> {
//! let directory = std::env::temp_dir().join(format!("modelgate-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&directory).unwrap();
//! let path = directory.join("modelgate.db");
//! let store = SqliteStore::open(&path, SqliteStoreConfig::default())?;
//! store.top_up("acct-1", 5_000_000_000).await?;
//! drop(store);
//! // Opened again, the balance is still there.
//! let store = SqliteStore::open(&path, SqliteStoreConfig::default())?;
//! assert_eq!(store.account_balance("acct-1").await?.balance_nanos, 5_000_000_000);
//! # drop(store);
//! # std::fs::remove_dir_all(&directory).unwrap();
//! # Ok(()) }
//! ```

mod counters;
mod ledger;
mod records;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::{StoreError, StoreErrorKind};

/// The schema this version writes (`PRAGMA user_version`). A file at an
/// older version is migrated when opened; a newer one is refused.
pub const SQLITE_SCHEMA_VERSION: i64 = 1;

/// The most jobs one transaction carries: bounds how long the others wait.
const MAX_JOBS_PER_TRANSACTION: usize = 256;

/// SQLite's page cache, in KiB.
const CACHE_KIB: i64 = 16 * 1024;

/// Prepared statements kept: more than the store has.
const STATEMENT_CACHE_CAPACITY: usize = 128;

/// Runs one of the store's own fixed statements (`BEGIN IMMEDIATE`,
/// `SAVEPOINT job`, …), prepared once.
fn run_fixed(connection: &Connection, statement: &str) -> rusqlite::Result<()> {
    connection.prepare_cached(statement)?.execute([]).map(drop)
}

/// How a [`SqliteStore`] opens its file.
#[derive(Clone, Debug)]
pub struct SqliteStoreConfig {
    /// `synchronous=FULL` instead of `NORMAL`: see the module docs.
    pub synchronous_full: bool,
    /// How long a transaction waits for another process's to end before
    /// its calls fail (default 5 s).
    pub busy_timeout: Duration,
}

impl Default for SqliteStoreConfig {
    fn default() -> Self {
        SqliteStoreConfig {
            synchronous_full: false,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// Every store trait in one SQLite file (see the module docs).
pub struct SqliteStore {
    jobs: mpsc::Sender<Job>,
    path: PathBuf,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// What a job leaves to do once its transaction has ended: answer its
/// caller with the commit's outcome.
type Answer = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
/// A job: runs inside the thread's transaction (or is told why it cannot),
/// says whether its writes stay, and how to answer.
type Job = Box<dyn FnOnce(Result<&Connection, StoreError>) -> (bool, Answer) + Send>;

fn backend(operation: &'static str, error: impl fmt::Display) -> StoreError {
    StoreError::new(operation, StoreErrorKind::Backend(error.to_string()))
}

/// A SQLite error as a store error of `operation`.
pub(super) fn sql(operation: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |error| backend(operation, error)
}

impl SqliteStore {
    /// Opens (creating when absent) the store at `path`, migrating an older
    /// schema; refuses a file a newer version wrote.
    pub fn open(path: impl AsRef<Path>, config: SqliteStoreConfig) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let connection = open_connection(&path, &config)?;
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("modelgate-sqlite".into())
            .spawn(move || run_jobs(connection, queue))
            .map_err(|error| backend("open", error))?;
        Ok(SqliteStore { jobs, path })
    }

    /// The file this store keeps its state in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `job` in the store's thread, inside a transaction with the
    /// jobs queued beside it; its writes stay when it returns `Ok`, and
    /// its answer comes once they are committed.
    pub(super) async fn call<T: Send + 'static>(
        &self,
        operation: &'static str,
        job: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let started = std::time::Instant::now();
        let (sender, receiver) = oneshot::channel();
        let job: Job = Box::new(move |connection| {
            let outcome = connection.and_then(job);
            let keep = outcome.is_ok();
            let answer: Answer = Box::new(move |committed| {
                let _ = sender.send(committed.and(outcome));
            });
            (keep, answer)
        });
        let answered = match self.jobs.send(job) {
            Ok(()) => receiver.await.unwrap_or_else(|_| {
                Err(backend(
                    operation,
                    "the store did not answer (the call failed unexpectedly, or the store's thread ended)",
                ))
            }),
            Err(_) => Err(backend(operation, "the store's thread has ended")),
        };
        crate::telemetry::store_call(operation, started.elapsed(), answered.is_ok());
        answered
    }
}

fn open_connection(path: &Path, config: &SqliteStoreConfig) -> Result<Connection, StoreError> {
    create_private(path)?;
    let connection = Connection::open(path).map_err(sql("open"))?;
    connection
        .busy_timeout(config.busy_timeout)
        .map_err(sql("open"))?;
    // Every statement the store runs stays prepared: parsing one costs
    // more than running it.
    connection.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
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
    migrate(&connection)?;
    Ok(connection)
}

/// Creates the file at `path`, if absent, readable by its owner alone: it
/// holds key hashes, balances and the accounts' own provider keys. SQLite
/// gives its `-wal` and `-shm` files the same permissions.
fn create_private(path: &Path) -> Result<(), StoreError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        // Made already (by an earlier start, or another process now).
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(backend("open", format!("{}: {error}", path.display()))),
    }
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

/// The store's thread: takes the jobs waiting, runs them in one
/// transaction, answers them after it ends. Ends when the store is dropped
/// and every job sent is answered.
fn run_jobs(connection: Connection, queue: mpsc::Receiver<Job>) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_JOBS_PER_TRANSACTION {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        run_batch(&connection, batch);
    }
}

/// Runs `batch` in one transaction, each job in its own savepoint, and
/// answers every job once the transaction has ended: with the commit's
/// outcome, or with why nothing of it stayed.
fn run_batch(connection: &Connection, batch: Vec<Job>) {
    if let Err(error) = run_fixed(connection, "BEGIN IMMEDIATE") {
        let error = backend("transaction", error);
        for job in batch {
            job(Err(error.clone())).1(Err(error.clone()));
        }
        return;
    }
    let mut answers: Vec<Answer> = Vec::with_capacity(batch.len());
    let mut jobs = batch.into_iter();
    let mut lost = None;
    for job in jobs.by_ref() {
        // SQLite rolls a whole transaction back on some errors (a full
        // disk, an I/O error): then nothing of the batch stays, and a job
        // run now would write outside it.
        if connection.is_autocommit() {
            lost = Some((job, "SQLite rolled the transaction back"));
            break;
        }
        // Each job in its own savepoint: one that fails leaves nothing.
        if let Err(error) = run_fixed(connection, "SAVEPOINT job") {
            answers.push(job(Err(backend("transaction", error))).1);
            continue;
        }
        // A job that panics (a bug) fails alone: its writes are rolled
        // back, its caller hears that the store did not answer, and the
        // thread goes on serving the others.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(Ok(connection))));
        let (keep, answer) = match ran {
            Ok((keep, answer)) => (keep, Some(answer)),
            Err(_) => {
                tracing::error!("a SQLite store call panicked; its writes are rolled back");
                (false, None)
            }
        };
        let ended = if keep {
            run_fixed(connection, "RELEASE job")
        } else {
            run_fixed(connection, "ROLLBACK TO job")
                .and_then(|()| run_fixed(connection, "RELEASE job"))
        };
        if let Err(error) = ended {
            tracing::warn!(error = %error, "a SQLite savepoint could not end");
        }
        answers.extend(answer);
    }
    let ended = match lost {
        Some((job, why)) => {
            let error = backend("transaction", why);
            job(Err(error.clone())).1(Err(error.clone()));
            for job in jobs {
                job(Err(error.clone())).1(Err(error.clone()));
            }
            Err(error)
        }
        None if connection.is_autocommit() => {
            Err(backend("transaction", "SQLite rolled the transaction back"))
        }
        None => run_fixed(connection, "COMMIT").map_err(|error| {
            let _ = connection.execute_batch("ROLLBACK");
            backend("commit", error)
        }),
    };
    for answer in answers {
        answer(ended.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_in(directory: &tempfile::TempDir) -> SqliteStore {
        SqliteStore::open(directory.path().join("m.db"), SqliteStoreConfig::default()).unwrap()
    }

    fn user_version(path: &Path) -> i64 {
        Connection::open(path)
            .unwrap()
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap()
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

    /// A job that holds the thread a moment, so that the calls sent
    /// meanwhile run in one batch after it.
    fn hold_the_thread(store: &std::sync::Arc<SqliteStore>) -> tokio::task::JoinHandle<()> {
        let store = store.clone();
        let handle = tokio::spawn(async move {
            store
                .call("test", |_| {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    Ok(())
                })
                .await
                .unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        handle
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_call_fails_alone_and_the_store_goes_on() {
        use crate::store::LedgerStore;
        let directory = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(store_in(&directory));
        let holding = hold_the_thread(&store);
        let panicking = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .call("test", |db| -> Result<(), StoreError> {
                        db.execute(
                            "INSERT INTO ledger_top_ups VALUES ('lost', 'k', 1, 1, 1, 1)",
                            [],
                        )
                        .map_err(sql("test"))?;
                        panic!("a bug in a store call")
                    })
                    .await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let beside = {
            let store = store.clone();
            tokio::spawn(async move { store.top_up("acct", 5).await })
        };
        holding.await.unwrap();
        assert!(panicking.await.unwrap().is_err());
        assert_eq!(beside.await.unwrap().unwrap().balance_nanos, 5);
        // The thread still serves, and the panicking call left nothing.
        assert_eq!(store.top_up("acct", 1).await.unwrap().balance_nanos, 6);
        let lost: i64 = store
            .call("test", |db| {
                db.query_row(
                    "SELECT count(*) FROM ledger_top_ups WHERE account = 'lost'",
                    [],
                    |row| row.get(0),
                )
                .map_err(sql("test"))
            })
            .await
            .unwrap();
        assert_eq!(lost, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_sqlite_rolls_back_whole_is_answered_failed_and_keeps_nothing() {
        use crate::store::LedgerStore;
        let directory = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(store_in(&directory));
        store.top_up("acct", 1).await.unwrap();
        // The file may not grow: a job that needs more pages fails with
        // SQLITE_FULL, which rolls the whole transaction back.
        store
            .call("test", |db| {
                let pages: i64 = db
                    .query_row("PRAGMA page_count", [], |row| row.get(0))
                    .map_err(sql("test"))?;
                db.pragma_update(None, "max_page_count", pages)
                    .map_err(sql("test"))
            })
            .await
            .unwrap();
        let holding = hold_the_thread(&store);
        let overfilling = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .call("test", |db| {
                        db.execute(
                            "INSERT INTO ledger_generations VALUES ('a', 'big', ?1, 1)",
                            [vec![b'x'; 1 << 20]],
                        )
                        .map_err(sql("test"))
                    })
                    .await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let behind = {
            let store = store.clone();
            tokio::spawn(async move { store.top_up("acct", 5).await })
        };
        holding.await.unwrap();
        assert!(overfilling.await.unwrap().is_err());
        // Told it failed, and indeed not credited: its retry credits once.
        assert!(behind.await.unwrap().is_err());
        assert_eq!(
            store.account_balance("acct").await.unwrap().balance_nanos,
            1
        );
        assert_eq!(store.top_up("acct", 5).await.unwrap().balance_nanos, 6);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_job_leaves_nothing_and_its_neighbours_commit() {
        let directory = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(store_in(&directory));
        let insert = |index: usize| {
            let store = store.clone();
            // Every other job writes a row of "lost", then fails.
            let (account, fail) = (["kept", "lost"][index % 2], index % 2 == 1);
            tokio::spawn(async move {
                store
                    .call("test", move |db| {
                        db.execute(
                            "INSERT INTO ledger_top_ups VALUES (?1, ?2, 1, 1, 1, 1)",
                            rusqlite::params![account, index.to_string()],
                        )
                        .map_err(sql("test"))?;
                        if fail {
                            return Err(StoreError::invalid("test", "failed on purpose"));
                        }
                        Ok(())
                    })
                    .await
            })
        };
        let calls: Vec<_> = (0..40).map(insert).collect();
        for (index, call) in calls.into_iter().enumerate() {
            let outcome = call.await.unwrap();
            assert_eq!(outcome.is_ok(), index % 2 == 0, "{outcome:?}");
        }
        let accounts: Vec<(String, i64)> = store
            .call("test", |db| {
                let mut statement = db
                    .prepare("SELECT account, count(*) FROM ledger_top_ups GROUP BY account")
                    .map_err(sql("test"))?;
                let rows = statement
                    .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
                    .map_err(sql("test"))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(sql("test"));
                rows
            })
            .await
            .unwrap();
        assert_eq!(accounts, [("kept".to_owned(), 20)]);
    }
}
