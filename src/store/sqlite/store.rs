//! [`SqliteStore`] itself: its file's settings, and the call that hands a
//! job to the store's thread and waits for its answer.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::busy;
use super::checkpoint::{self, Checkpointer};
use super::file::open_connection;
use super::jobs::{Answer, Job, run_jobs};
use crate::store::{StoreError, StoreErrorKind};

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
    _checkpointer: Checkpointer,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A failure of SQLite or of the store's thread, as a store error of
/// `operation`.
pub(super) fn backend(operation: &'static str, error: impl fmt::Display) -> StoreError {
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
        let wait_limit = config.busy_timeout;
        std::thread::Builder::new()
            .name("modelgate-sqlite".into())
            .spawn(move || {
                busy::limit_waits_on_this_thread(wait_limit);
                run_jobs(connection, queue)
            })
            .map_err(|error| backend("open", error))?;
        let checkpointer = checkpoint::start(&path, &config)?;
        Ok(SqliteStore {
            jobs,
            path,
            _checkpointer: checkpointer,
        })
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
