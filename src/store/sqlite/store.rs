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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use chrono::{DateTime, TimeZone, Utc};
    use rusqlite::hooks::Authorization;

    use super::*;
    use crate::store::{
        AdmitRequest, Check, CounterStore, Expect, LedgerStore, Limit, PutOptions, RecordStore,
        ReserveRequest, Settlement, SettlementRecord,
    };

    fn at(step: i64) -> DateTime<Utc> {
        // Steps further apart than each table's tidy interval, so that
        // every step runs every bounded delete.
        Utc.with_ymd_and_hms(2024, 1, 31, 23, 59, 0).unwrap() + chrono::Duration::seconds(step)
    }

    /// A chat request's store calls, and the calls beside them that
    /// remove a bounded batch of what has ended: an admission with rate
    /// checks and a hold, its settlement with a record past the account's
    /// cap, a top-up with an idempotency key, a record of a collection
    /// with a lifetime, a concurrency slot.
    async fn requests(store: &SqliteStore, step: i64) {
        let now = at(step);
        let id = format!("r{step:04}");
        let checks = vec![
            Check::new(
                "gcra",
                Limit::Gcra {
                    rate: 1_000,
                    period: Duration::from_secs(1),
                    burst: 1_000,
                },
                1,
            ),
            Check::new(
                "rolling",
                Limit::Rolling {
                    limit: 1_000,
                    window: Duration::from_millis(500),
                },
                1,
            ),
        ];
        let admission = AdmitRequest {
            account: "acct".into(),
            checks,
            purchase_tier: None,
            hold: Some(ReserveRequest {
                account: "acct".into(),
                key: "key".into(),
                reservation_id: id.clone(),
                amount_nanos: 5,
                min_amount_nanos: None,
                key_limit: None,
                counts_against_key_limit: true,
                check_balance: true,
                covered_by_balance: true,
                ttl: Duration::from_millis(500),
                lapse_record: None,
            }),
        };
        let admitted = store
            .admit_after_settling(&[], &admission, now)
            .await
            .unwrap();
        assert!(admitted.admitted);
        let settlement = Settlement {
            account: "acct".into(),
            key: "key".into(),
            reservation_id: id.clone(),
            hold_granted: true,
            cost_nanos: 3,
            byok: false,
            record: Some(SettlementRecord {
                bytes: bytes::Bytes::from(format!("{{\"id\":\"{id}\"}}")),
                retention: Duration::from_secs(1),
                max_per_account: 1,
            }),
        };
        store.settle_many(&[settlement], now).await.unwrap();
        store.top_up_once("acct", 1, &id, now).await.unwrap();
        let options = PutOptions {
            ttl: Some(Duration::from_millis(500)),
            max_records: None,
        };
        store
            .put_record_at("sessions", &id, b"{}", Expect::Any, options, now)
            .await
            .unwrap();
        let lease = Duration::from_millis(500);
        store
            .acquire_slot("acct", "streams", &id, 4, lease, now)
            .await
            .unwrap();
    }

    /// Unless told to keep its plans (the connection's QPSG), SQLite plans
    /// a statement with the value bound to a parameter that is its LIMIT,
    /// and so compiles it again each time it is bound anew (a fifth of the
    /// store thread's time, when each admission's delete of ended counters
    /// did): once the store has run its calls, running them again compiles
    /// nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_warm_store_compiles_no_statement_again() {
        let directory = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(directory.path().join("m.db"), Default::default()).unwrap();
        store.top_up("acct", 1_000_000).await.unwrap();
        let compiled = Arc::new(AtomicUsize::new(0));
        // Set first: an authorizer, once set, has every statement compiled
        // again under it.
        let count = compiled.clone();
        store
            .call("test", move |db| {
                db.authorizer(Some(move |_: rusqlite::hooks::AuthContext<'_>| {
                    count.fetch_add(1, Ordering::Relaxed);
                    Authorization::Allow
                }));
                Ok(())
            })
            .await
            .unwrap();
        // Three steps: the first to go past the records' cap is the third.
        for step in 0..3 {
            requests(&store, step).await;
        }
        let warming = compiled.load(Ordering::Relaxed);
        assert!(warming > 0, "the authorizer saw no statement compiled");
        for step in 3..8 {
            requests(&store, step).await;
        }
        assert_eq!(compiled.load(Ordering::Relaxed) - warming, 0);
    }
}
