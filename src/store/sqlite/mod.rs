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
        let (sender, receiver) = oneshot::channel();
        let job: Job = Box::new(move |connection| {
            let outcome = connection.and_then(job);
            let keep = outcome.is_ok();
            let answer: Answer = Box::new(move |committed| {
                let _ = sender.send(committed.and(outcome));
            });
            (keep, answer)
        });
        self.jobs
            .send(job)
            .map_err(|_| backend(operation, "the store's thread has ended"))?;
        receiver
            .await
            .map_err(|_| backend(operation, "the store's thread has ended"))?
    }
}

fn open_connection(path: &Path, config: &SqliteStoreConfig) -> Result<Connection, StoreError> {
    let connection = Connection::open(path).map_err(sql("open"))?;
    connection
        .busy_timeout(config.busy_timeout)
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
    migrate(&connection)?;
    Ok(connection)
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
        if let Err(error) = connection.execute_batch("BEGIN IMMEDIATE") {
            let error = backend("transaction", error);
            for job in batch {
                job(Err(error.clone())).1(Err(error.clone()));
            }
            continue;
        }
        let mut answers = Vec::with_capacity(batch.len());
        for job in batch {
            // Each job in its own savepoint: one that fails leaves nothing.
            if let Err(error) = connection.execute_batch("SAVEPOINT job") {
                let error = backend("transaction", error);
                answers.push(job(Err(error)).1);
                continue;
            }
            let (keep, answer) = job(Ok(&connection));
            let end = if keep {
                "RELEASE job"
            } else {
                "ROLLBACK TO job; RELEASE job"
            };
            if let Err(error) = connection.execute_batch(end) {
                tracing::warn!(error = %error, "a SQLite savepoint could not end");
            }
            answers.push(answer);
        }
        let committed = connection.execute_batch("COMMIT").map_err(|error| {
            let _ = connection.execute_batch("ROLLBACK");
            backend("commit", error)
        });
        for answer in answers {
            answer(committed.clone());
        }
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
