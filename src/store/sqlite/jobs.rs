//! The store's thread: the jobs waiting run together in one transaction,
//! each in its own savepoint, and are answered once it has ended.

use std::sync::mpsc;

use rusqlite::Connection;

use super::store::backend;
use crate::store::StoreError;

/// The most jobs one transaction carries: bounds how long the others wait.
const MAX_JOBS_PER_TRANSACTION: usize = 256;

/// What a job leaves to do once its transaction has ended: answer its
/// caller with the commit's outcome.
pub(super) type Answer = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
/// A job: runs inside the thread's transaction (or is told why it cannot),
/// says whether its writes stay, and how to answer.
pub(super) type Job = Box<dyn FnOnce(Result<&Connection, StoreError>) -> (bool, Answer) + Send>;

/// Runs one of the store's own fixed statements (`BEGIN IMMEDIATE`,
/// `SAVEPOINT job`, …), prepared once.
fn run_fixed(connection: &Connection, statement: &str) -> rusqlite::Result<()> {
    connection.prepare_cached(statement)?.execute([]).map(drop)
}

/// The store's thread: takes the jobs waiting, runs them in one
/// transaction, answers them after it ends. Ends when the store is dropped
/// and every job sent is answered.
pub(super) fn run_jobs(connection: Connection, queue: mpsc::Receiver<Job>) {
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
    use crate::store::sqlite::store::sql;
    use crate::store::{SqliteStore, SqliteStoreConfig, StoreError};

    fn store_in(directory: &tempfile::TempDir) -> SqliteStore {
        SqliteStore::open(directory.path().join("m.db"), SqliteStoreConfig::default()).unwrap()
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
                            "INSERT INTO ledger_generations (account, id, record, expires_at_micros) VALUES ('a', 'big', ?1, 1)",
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

                statement
                    .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
                    .map_err(sql("test"))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(sql("test"))
            })
            .await
            .unwrap();
        assert_eq!(accounts, [("kept".to_owned(), 20)]);
    }
}
